/* run_metrics.c - metrics.jsonl and the TensorBoard events of a job's
 * output_dir; see run_metrics.h. */
#include "worker/rank/run_metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "worker/rank/tb_events.h"

struct run_metrics {
  int fd; /* metrics.jsonl */
  char path[PATH_MAX];
  tb_events_t *tb;
};

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

run_point_t run_point_empty(int64_t step) {
  run_point_t p = {.step = step, .wall_time = wall_now()};
#define RUN_METRICS_NAN(field, key, tag) p.field = NAN;
  RUN_METRICS_TAGS(RUN_METRICS_NAN)
#undef RUN_METRICS_NAN
  for (int i = 0; i < REPORT_DPO_N; i++) p.dpo[i] = NAN;
  return p;
}

int run_metrics_open(run_metrics_t **out, const char *output_dir, char *err, size_t errlen) {
  *out = NULL;
  char tbdir[PATH_MAX];
  run_metrics_t *m = xcalloc(1, sizeof *m);
  m->fd = -1;
  int rc = ty_mkdirs(output_dir, err, errlen);
  if (rc) goto fail;
  if (snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", output_dir) >= (int)sizeof m->path ||
      snprintf(tbdir, sizeof tbdir, "%s/tensorboard", output_dir) >= (int)sizeof tbdir) {
    rc = ty_errf(err, errlen, TY_EINVAL, "output_dir is too long a path: %s", output_dir);
    goto fail;
  }
  m->fd = open(m->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (m->fd < 0) {
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot open %s: %s", m->path, strerror(errno));
    goto fail;
  }
  if ((rc = tb_events_open(&m->tb, tbdir, wall_now(), err, errlen))) goto fail;
  *out = m;
  return 0;
fail:
  run_metrics_close(m);
  return rc;
}

/* The line of p (a new string, newline-terminated). */
static char *point_line(const run_point_t *p) {
  json_t *o = json_pack("{s:I, s:f}", "step", (json_int_t)p->step, "time", p->wall_time);
#define RUN_METRICS_JSON(field, key, tag) \
  if (isfinite(p->field)) json_object_set_new(o, key, json_real(p->field));
  RUN_METRICS_TAGS(RUN_METRICS_JSON)
#undef RUN_METRICS_JSON
#define RUN_METRICS_DPO(name, trl)         \
  if (isfinite(p->dpo[REPORT_DPO_##name])) \
    json_object_set_new(o, trl, json_real(p->dpo[REPORT_DPO_##name]));
  REPORT_DPO_METRICS(RUN_METRICS_DPO)
#undef RUN_METRICS_DPO
  /* Byte counts read as whole numbers. */
  if (isfinite(p->host_peak_bytes))
    json_object_set_new(o, "host_peak_bytes", json_integer((json_int_t)p->host_peak_bytes));
  if (isfinite(p->device_peak_bytes))
    json_object_set_new(o, "device_peak_bytes", json_integer((json_int_t)p->device_peak_bytes));
  char *text = ty_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(o);
  if (!text) return NULL;
  size_t n = strlen(text);
  text = xrealloc(text, n + 2);
  text[n] = '\n';
  text[n + 1] = '\0';
  return text;
}

int run_metrics_write(run_metrics_t *m, const run_point_t *p, char *err, size_t errlen) {
  char *line = point_line(p);
  if (!line)
    return ty_errf(err, errlen, TY_EINTERNAL, "cannot render step %lld's metrics",
                   (long long)p->step);
  size_t len = strlen(line), done = 0;
  int rc = 0;
  while (done < len && !rc) {
    ssize_t k = write(m->fd, line + done, len - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot write %s: %s", m->path,
                   strerror(k < 0 ? errno : EIO));
    else
      done += (size_t)k;
  }
  free(line);
  if (rc) return rc;
  const tb_scalar_t v[] = {
#define RUN_METRICS_TB(field, key, tag) {tag, p->field},
      RUN_METRICS_TAGS(RUN_METRICS_TB)
#undef RUN_METRICS_TB
#define RUN_METRICS_TB_DPO(name, trl) {"train/" trl, p->dpo[REPORT_DPO_##name]},
          REPORT_DPO_METRICS(RUN_METRICS_TB_DPO)
#undef RUN_METRICS_TB_DPO
  };
  return tb_events_write(m->tb, p->step, p->wall_time, v, (int)(sizeof v / sizeof v[0]), err,
                         errlen);
}

void run_metrics_close(run_metrics_t *m) {
  if (!m) return;
  if (m->fd >= 0) close(m->fd);
  tb_events_close(m->tb);
  free(m);
}
