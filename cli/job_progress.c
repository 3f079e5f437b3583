/* job_progress.c - a job's progress figures in words; see job_progress.h. */
#include "cli/job_progress.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const json_t *field(const json_t *o, const char *prefix, const char *name) {
  char key[64];
  snprintf(key, sizeof key, "%s%s", prefix, name);
  return json_object_get(o, key);
}

/* 83 -> "1m23s", 7300 -> "2h01m", 5 -> "5s". */
static void duration(double s, char *out, size_t size) {
  long long t = (long long)llround(s);
  if (t >= 3600)
    snprintf(out, size, "%lldh%02lldm", t / 3600, t / 60 % 60);
  else if (t >= 60)
    snprintf(out, size, "%lldm%02llds", t / 60, t % 60);
  else
    snprintf(out, size, "%llds", t);
}

void cli_progress_text(const json_t *o, const char *prefix, char *out, size_t size) {
  const char *phase = json_string_value(field(o, prefix, "progress_phase"));
  if (!phase || !*phase) {
    snprintf(out, size, "-");
    return;
  }
  double p = json_number_value(field(o, prefix, "progress"));
  int n = snprintf(out, size, "%s %.0f%%", phase, floor(p * 100));
  const json_t *eta = field(o, prefix, "eta_seconds");
  if (json_is_number(eta) && json_number_value(eta) > 0 && n >= 0 && (size_t)n < size) {
    char d[32];
    duration(json_number_value(eta), d, sizeof d);
    n += snprintf(out + n, size - (size_t)n, "  eta %s", d);
  }
  double tps = json_number_value(field(o, prefix, "tokens_per_s"));
  if (tps > 0 && n >= 0 && (size_t)n < size)
    snprintf(out + n, size - (size_t)n, "  %.0f tok/s", tps);
}
