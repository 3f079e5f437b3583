/* worker_load.c - TRAINYARD_MODE=load: load this rank's shard, report the
 * figures (JSON line on stdout, human line on stderr), exit. */
#include "worker/worker_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "api/errors.h"
#include "worker/memstat.h"

typedef struct {
  const wload_rank_t *who;
  double last; /* monotonic seconds of the last "loading" report */
} wload_progress_t;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One report: the contract's JSON object on stdout, the human line on
 * stderr. st may be NULL (nothing measured yet). */
static void report(const wload_rank_t *who, const char *phase, const loader_stats_t *st,
                   const char *message) {
  loader_stats_t zero = {0};
  if (!st) st = &zero;
  uint64_t host_peak = st->host_peak_bytes;
  if (!host_peak) {
    memstat_t m;
    if (!memstat_read(&m)) host_peak = m.hwm_bytes;
  }
  json_t *j = json_pack(
      "{s:s,s:i,s:i,s:i,s:s,s:i,s:i,s:n,s:f,s:I,s:I,s:I,s:I,s:f,s:s}", "job_id", who->job_id,
      "attempt", who->attempt, "rank", who->rank, "world_size", who->world_size, "phase", phase,
      "step", 0, "total_steps", 0, "loss", "tokens_per_s", 0.0, "bytes_loaded",
      (json_int_t)st->bytes_read, "bytes_total", (json_int_t)st->bytes_total, "host_peak_bytes",
      (json_int_t)host_peak, "device_peak_bytes", (json_int_t)st->device_peak_bytes, "load_seconds",
      st->load_seconds, "message", message ? message : "");
  char *line = json_dumps(j, JSON_COMPACT);
  printf("%s\n", line);
  fflush(stdout);
  free(line);
  json_decref(j);
  if (!strcmp(phase, "failed"))
    fprintf(stderr, "[rank %d/%d] failed: %s\n", who->rank, who->world_size, message);
  else
    fprintf(stderr, "[rank %d/%d] load  %.1f/%.1f MiB  host-peak %.0f MiB%s%s\n", who->rank,
            who->world_size, (double)st->bytes_read / 1048576.0,
            (double)st->bytes_total / 1048576.0, (double)host_peak / 1048576.0,
            message && *message ? "  " : "", message ? message : "");
}

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  wload_progress_t *p = ctx;
  double t = mono_s();
  if (t - p->last < 1.0 || done >= total) return;
  p->last = t;
  loader_stats_t st = {.bytes_read = done, .bytes_total = total};
  report(p->who, "loading", &st, NULL);
}

int wload_run(const jobspec_t *spec, const wload_rank_t *who) {
  char err[1024] = "", msg[1200];
  if (spec->device == JOBSPEC_DEVICE_CUDA) {
    report(who, "failed", NULL,
           "device cuda: this worker loads onto the CPU placement only; use device cpu or auto");
    return 1;
  }
  placement_t pl;
  placement_cpu_init(&pl);
  wload_progress_t prog = {who, mono_s()};
  loader_opts_t o = {.rank = who->rank,
                     .world_size = who->world_size,
                     .dtype = spec->dtype,
                     .memory_efficient = spec->fsdp.memory_efficient_load,
                     .bucket_bytes = (size_t)spec->fsdp.bucket_mb << 20,
                     .seed = spec->train.seed,
                     .pl = &pl,
                     .progress = on_progress,
                     .progress_ctx = &prog};
  report(who, "loading", NULL, NULL);
  loader_shard_t *s = NULL;
  loader_stats_t st;
  const char *path = spec->init_from_scratch            ? "init_from_scratch"
                     : spec->fsdp.memory_efficient_load ? "memory_efficient"
                                                        : "standard";
  int rc = spec->init_from_scratch ? loader_init_scratch(&spec->model, &o, &s, &st, err, sizeof err)
                                   : loader_load(spec->model_path, &o, &s, &st, err, sizeof err);
  if (rc) {
    snprintf(msg, sizeof msg, "%s (%s)", err, ty_err_name(rc));
    report(who, "failed", NULL, msg);
    return 1;
  }
  snprintf(msg, sizeof msg, "%s: shard %.1f MiB of %s in %.2f s", path,
           (double)s->bytes / 1048576.0, ty_dtype_name(s->dtype), st.load_seconds);
  report(who, "done", &st, msg);
  loader_shard_free(s);
  return 0;
}

/* An integer environment variable in [lo, hi], or def when unset. */
static int env_int(const char *name, int def, int lo, int hi, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) {
    *out = def;
    return def >= lo ? 0 : -1;
  }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || x < lo || x > hi) return -1;
  *out = (int)x;
  return 0;
}

int wload_main(void) {
  wload_rank_t who = {.job_id = getenv("TRAINYARD_JOB_ID")};
  if (!who.job_id || !*who.job_id) who.job_id = "local";
  if (env_int("TRAINYARD_WORLD_SIZE", 1, 1, 1 << 16, &who.world_size) ||
      env_int("TRAINYARD_RANK", 0, 0, who.world_size - 1, &who.rank) ||
      env_int("TRAINYARD_ATTEMPT", 1, 1, 1 << 30, &who.attempt)) {
    fprintf(stderr,
            "trainyard-worker: TRAINYARD_RANK, TRAINYARD_WORLD_SIZE and "
            "TRAINYARD_ATTEMPT must be integers with 0 <= rank < world_size\n");
    return 2;
  }
  const char *path = getenv("TRAINYARD_SPEC");
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) {
    fprintf(stderr, "trainyard-worker: cannot read the spec TRAINYARD_SPEC=%s: %s\n",
            path ? path : "(unset)", path ? strerror(errno) : "set it to the spec's path");
    return 2;
  }
  char *text = NULL;
  size_t len = 0, cap = 0, n;
  char buf[65536];
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    if (len + n > cap) {
      cap = (len + n) * 2;
      char *grown = realloc(text, cap);
      if (!grown) {
        free(text);
        fclose(f);
        fprintf(stderr, "trainyard-worker: out of memory reading %s\n", path);
        return 2;
      }
      text = grown;
    }
    memcpy(text + len, buf, n);
    len += n;
  }
  fclose(f);
  jobspec_t spec;
  jobspec_init(&spec);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = jobspec_parse_json(&spec, text ? text : "", len, &errs);
  if (!rc) rc = jobspec_validate(&spec, false, &errs);
  free(text);
  if (rc) {
    char msg[1024];
    snprintf(msg, sizeof msg, "invalid spec %s: %s: %s", path, errs.len ? errs.items[0].field : "",
             errs.len ? errs.items[0].message : "");
    ty_errlist_clear(&errs);
    report(&who, "failed", NULL, msg);
    return 1;
  }
  return wload_run(&spec, &who);
}
