/* worker_load.c - TRAINYARD_MODE=load: load this rank's shard, report the
 * figures (JSON line on stdout, human line on stderr), exit. */
#include "worker/worker_load.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/errors.h"
#include "common/clock.h"
#include "worker/memstat.h"
#include "worker/report.h"
#ifdef TRAINYARD_HAVE_CUDA
#include "worker/mem_cuda.h"
#include "worker/placement_cuda.h"
#endif

typedef struct {
  const wload_rank_t *who;
  double last; /* monotonic seconds of the last "loading" report */
} wload_progress_t;

/* One report through worker/report (POST to TRAINYARD_REPORT_URL, or a JSON
 * line on stdout; the human line on stderr). st may be NULL (nothing
 * measured yet: the host peak so far is sent). */
static void wload_send(const char *phase, const loader_stats_t *st, const char *message) {
  loader_stats_t zero = {0};
  if (!st) st = &zero;
  uint64_t host_peak = st->host_peak_bytes;
  if (!host_peak) {
    memstat_t m;
    if (!memstat_read(&m)) host_peak = m.hwm_bytes;
  }
  report_t r = {.phase = phase,
                .loss = NAN,
                .bytes_loaded = (int64_t)st->bytes_read,
                .bytes_total = (int64_t)st->bytes_total,
                .host_peak_bytes = (int64_t)host_peak,
                .device_peak_bytes = (int64_t)st->device_peak_bytes,
                .load_seconds = st->load_seconds,
                .message = message};
  /* A report that does not get through is not fatal: the next one may. */
  (void)report_send(&r);
}

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  wload_progress_t *p = ctx;
  double t = ty_mono_s();
  if (t - p->last < 1.0 || done >= total) return;
  p->last = t;
  loader_stats_t st = {.bytes_read = done, .bytes_total = total};
  wload_send("loading", &st, NULL);
}

static void wload_placement_free(placement_t *pl) {
#ifdef TRAINYARD_HAVE_CUDA
  placement_cuda_free(pl);
#else
  (void)pl;
#endif
}

int wload_run(const jobspec_t *spec, const wload_rank_t *who) {
  char err[1024] = "", msg[1200];
  placement_t pl;
  if (spec->device == JOBSPEC_DEVICE_CUDA) {
#ifdef TRAINYARD_HAVE_CUDA
    /* One GPU per rank: local ranks take devices in rank order. */
    int ndev = 0;
    int rc0 = placement_cuda_devices(&ndev, err, sizeof err);
    if (!rc0)
      rc0 = placement_cuda_init(&pl, who->rank % ndev, (size_t)spec->fsdp.bucket_mb << 20, err,
                                sizeof err);
    if (rc0) {
      wload_send("failed", NULL, err);
      return 1;
    }
#else
    wload_send("failed", NULL, PLACEMENT_NO_CUDA_MSG);
    return 1;
#endif
  } else {
    placement_cpu_init(&pl);
  }
  wload_progress_t prog = {who, ty_mono_s()};
  loader_opts_t o = {.rank = who->rank,
                     .world_size = who->world_size,
                     .dtype = spec->dtype,
                     .memory_efficient = spec->fsdp.memory_efficient_load,
                     .bucket_bytes = (size_t)spec->fsdp.bucket_mb << 20,
                     .seed = spec->train.seed,
                     .pl = &pl,
                     .progress = on_progress,
                     .progress_ctx = &prog};
  wload_send("loading", NULL, NULL);
  loader_shard_t *s = NULL;
  loader_stats_t st;
  const char *path = spec->init_from_scratch            ? "init_from_scratch"
                     : spec->fsdp.memory_efficient_load ? "memory_efficient"
                                                        : "standard";
  int rc = spec->init_from_scratch ? loader_init_scratch(&spec->model, &o, &s, &st, err, sizeof err)
                                   : loader_load(spec->model_path, &o, &s, &st, err, sizeof err);
  if (rc) {
#ifdef TRAINYARD_HAVE_CUDA
    if (spec->device == JOBSPEC_DEVICE_CUDA) mem_cuda_explain(rc, err, sizeof err);
#endif
    snprintf(msg, sizeof msg, "%s (%s)", err, ty_err_name(rc));
    wload_send("failed", NULL, msg);
    wload_placement_free(&pl);
    return 1;
  }
  int n = snprintf(msg, sizeof msg, "%s: shard %.1f MiB of %s in %.2f s", path,
                   (double)s->bytes / 1048576.0, ty_dtype_name(s->dtype), st.load_seconds);
#ifdef TRAINYARD_HAVE_CUDA
  if (placement_is_cuda(&pl)) {
    placement_cuda_info_t ci;
    placement_cuda_info(&pl, &ci);
    snprintf(msg + n, sizeof msg - (size_t)n, "; device %d, cudaMemGetInfo peak %.1f MiB",
             ci.device, (double)ci.driver_peak / 1048576.0);
  }
#endif
  (void)n;
  wload_send("done", &st, msg);
  loader_shard_free(s);
  wload_placement_free(&pl);
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

/* Reads and validates the spec file at path into s; 0, or -1 with msg. */
static int read_spec(const char *path, jobspec_t *s, char *msg, size_t msglen) {
  FILE *f = path && *path ? fopen(path, "rb") : NULL;
  if (!f) {
    snprintf(msg, msglen, "cannot read the spec TRAINYARD_SPEC=%s: %s", path ? path : "(unset)",
             path ? strerror(errno) : "set it to the spec's path");
    return -1;
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
        snprintf(msg, msglen, "out of memory reading the spec %s", path);
        return -1;
      }
      text = grown;
    }
    memcpy(text + len, buf, n);
    len += n;
  }
  fclose(f);
  jobspec_init(s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = jobspec_parse_json(s, text ? text : "", len, &errs);
  if (!rc) rc = jobspec_validate(s, false, &errs);
  free(text);
  if (rc)
    snprintf(msg, msglen, "invalid spec %s: %s: %s", path, errs.len ? errs.items[0].field : "",
             errs.len ? errs.items[0].message : "");
  ty_errlist_clear(&errs);
  return rc ? -1 : 0;
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
  if (report_open()) return 2; /* it named the variable at fault */
  jobspec_t spec;
  char msg[1024];
  int rc = read_spec(getenv("TRAINYARD_SPEC"), &spec, msg, sizeof msg);
  if (rc) {
    wload_send("failed", NULL, msg);
    rc = 1;
  } else {
    rc = wload_run(&spec, &who);
  }
  report_close();
  return rc;
}
