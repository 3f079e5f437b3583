/* prom_jobs.c - per-job, per-rank series for /metrics; see prom_jobs.h. */
#include "server/prom_jobs.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"

size_t prom_label_escape(const char *in, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = in; *p; p++) {
    const char *rep = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
    size_t k = rep ? 2 : 1;
    if (o + k >= cap) break;
    if (rep)
      memcpy(out + o, rep, 2);
    else
      out[o] = *p;
    o += k;
  }
  if (cap) out[o < cap ? o : cap - 1] = '\0';
  return o;
}

typedef struct {
  char *b;
  size_t len, cap;
} buf_t;

static void put(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf_t *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->b + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0);
    b->b = xrealloc(b->b, b->cap);
  }
}

/* The series families: name, help, and the value of a rank (NaN: no
 * sample for that rank). */
typedef double (*value_fn)(const db_rank_figures_t *f, double now);
static double v_step(const db_rank_figures_t *f, double now) {
  return (double)f->step;
}
static double v_total(const db_rank_figures_t *f, double now) {
  return (double)f->total_steps;
}
static double v_loss(const db_rank_figures_t *f, double now) {
  return f->loss;
}
static double v_tps(const db_rank_figures_t *f, double now) {
  return f->tokens_per_s;
}
static double v_host(const db_rank_figures_t *f, double now) {
  return (double)f->host_peak_bytes;
}
static double v_dev(const db_rank_figures_t *f, double now) {
  return (double)f->device_peak_bytes;
}
static double v_since(const db_rank_figures_t *f, double now) {
  if (f->last_report_at <= 0) return NAN;
  return now > f->last_report_at ? now - f->last_report_at : 0;
}

static const struct {
  const char *name, *help;
  value_fn value;
} g_families[] = {
    {"trainyard_job_rank_step", "Steps a rank of a running job has done.", v_step},
    {"trainyard_job_rank_total_steps", "Steps a rank of a running job is to do.", v_total},
    {"trainyard_job_rank_loss", "A rank's last training loss (mean over the global batch).",
     v_loss},
    {"trainyard_job_rank_tokens_per_second", "A rank's tokens per second over its last step.",
     v_tps},
    {"trainyard_job_rank_host_peak_bytes", "A rank's host memory high-water mark (VmHWM).", v_host},
    {"trainyard_job_rank_device_peak_bytes", "A rank's device memory high-water mark.", v_dev},
    {"trainyard_job_rank_seconds_since_report", "Seconds since a rank's last progress report.",
     v_since},
};

char *prom_jobs_text(const db_rank_figures_t *ranks, size_t n, double now) {
  buf_t b = {xmalloc(4096), 0, 4096};
  b.b[0] = '\0';
  for (size_t k = 0; k < sizeof g_families / sizeof g_families[0]; k++) {
    put(&b, "# HELP %s %s\n# TYPE %s gauge\n", g_families[k].name, g_families[k].help,
        g_families[k].name);
    for (size_t i = 0; i < n; i++) {
      double v = g_families[k].value(&ranks[i], now);
      if (!isfinite(v)) continue;
      char id[2 * DB_ID_MAX], name[2 * DB_NAME_MAX];
      prom_label_escape(ranks[i].job_id, id, sizeof id);
      prom_label_escape(ranks[i].name, name, sizeof name);
      put(&b, "%s{job_id=\"%s\",name=\"%s\",rank=\"%d\"} %.17g\n", g_families[k].name, id, name,
          ranks[i].rank, v);
    }
  }
  return b.b;
}
