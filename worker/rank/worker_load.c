/* worker_load.c - RANKENV_MODE=load: load this rank's shard, report the
 * figures (JSON line on stdout, human line on stderr), exit. */
#include "worker/rank/worker_load.h"
#include "worker/dist/comm.h"
#include "worker/rank/worker_env.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/clock.h"
#include "common/rankenv.h"
#include "common/memstat.h"
#include "worker/rank/report.h"
#ifdef TRAINYARD_HAVE_CUDA
#include "worker/cuda/mem_cuda.h"
#include "worker/cuda/placement_cuda.h"
#endif

typedef struct {
  const worker_env_t *who;
  double last; /* monotonic seconds of the last "loading" report */
} wload_progress_t;

/* One report through worker/report (POST to RANKENV_REPORT_URL, or a JSON
 * line on stdout; the human line on stderr). st may be NULL (nothing
 * measured yet: the host peak so far is sent). */
static void wload_send(report_phase_t phase, const loader_stats_t *st, const char *message) {
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
  if (!loader_progress_due(&p->last, done, total)) return;
  loader_stats_t st = {.bytes_read = done, .bytes_total = total};
  wload_send(REPORT_PHASE_LOADING, &st, NULL);
}

static void wload_placement_free(placement_t *pl) {
#ifdef TRAINYARD_HAVE_CUDA
  placement_cuda_free(pl);
#else
  (void)pl;
#endif
}

/* FNV-1a over a host shard's tensors (each view's bytes, table order, no
 * padding): two loads that agree on it hold the same shard, whichever
 * file format or load path they came from. */
static uint64_t digest(const loader_shard_t *s) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < s->layout.ntensors; i++) {
    const unsigned char *b = s->views[i].data;
    for (size_t k = 0; k < s->views[i].nbytes; k++) h = (h ^ b[k]) * 1099511628211ull;
  }
  return h;
}

int wload_run(const jobspec_t *spec, const worker_env_t *who) {
  char err[1024] = "", msg[1200];
  placement_t pl;
  if (spec->device == JOBSPEC_DEVICE_CUDA) {
#ifdef TRAINYARD_HAVE_CUDA
    /* One GPU per rank: a node's ranks take its devices in order. */
    int ndev = 0, gpu = 0;
    int rc0 = placement_cuda_devices(&ndev, err, sizeof err);
    if (!rc0) rc0 = rankenv_gpu(who->rank, ndev, &gpu, err, sizeof err);
    if (!rc0)
      rc0 = placement_cuda_init(&pl, gpu, (size_t)spec->fsdp.bucket_mb << 20, err, sizeof err);
    if (rc0) {
      wload_send(REPORT_PHASE_FAILED, NULL, err);
      return 1;
    }
#else
    wload_send(REPORT_PHASE_FAILED, NULL, PLACEMENT_NO_CUDA_MSG);
    return 1;
#endif
  } else {
    placement_cpu_init(&pl);
  }
  wload_progress_t prog = {who, ty_mono_s()};
  /* QLoRA: the projections quantized as they load; double quantization's
   * tensor-wide means are a collective among the ranks. */
  const ckpt_q4_kind_t k = worker_q4_kind(spec);
  comm_t *comm = NULL;
  loader_q4_t q4 = {
      .type = k.type, .double_quant = k.double_quant, .compute = k.compute, .mean = worker_q4_mean};
  if (spec->quantization.load_in_4bit && k.double_quant && comm_open_env(&comm, err, sizeof err)) {
    wload_send(REPORT_PHASE_FAILED, NULL, err);
    wload_placement_free(&pl);
    return 1;
  }
  q4.mean_ctx = comm;
  loader_opts_t o = {.rank = who->rank,
                     .world_size = who->world_size,
                     .dtype = spec->dtype,
                     .memory_efficient = spec->fsdp.memory_efficient_load,
                     .bucket_bytes = (size_t)spec->fsdp.bucket_mb << 20,
                     .seed = spec->train.seed,
                     .pl = &pl,
                     .q4 = spec->quantization.load_in_4bit ? &q4 : NULL,
                     .progress = on_progress,
                     .progress_ctx = &prog};
  wload_send(REPORT_PHASE_LOADING, NULL, NULL);
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
    wload_send(REPORT_PHASE_FAILED, NULL, msg);
    wload_placement_free(&pl);
    comm_close(comm);
    return 1;
  }
  comm_close(comm);
  int n = snprintf(msg, sizeof msg, "%s: shard %.1f MiB of %s%s in %.2f s", path,
                   (double)s->bytes / 1048576.0, ty_dtype_name(s->dtype),
                   s->has_q4 ? " (the linear projections in 4 bits)" : "", st.load_seconds);
#ifdef TRAINYARD_HAVE_CUDA
  if (placement_is_cuda(&pl)) {
    placement_cuda_info_t ci;
    placement_cuda_info(&pl, &ci);
    snprintf(msg + n, sizeof msg - (size_t)n, "; device %d, cudaMemGetInfo peak %.1f MiB",
             ci.device, (double)ci.driver_peak / 1048576.0);
  }
#endif
  if (spec->device != JOBSPEC_DEVICE_CUDA && n > 0 && (size_t)n < sizeof msg)
    snprintf(msg + n, sizeof msg - (size_t)n, ", digest %016llx", (unsigned long long)digest(s));
  (void)n;
  wload_send(REPORT_PHASE_DONE, &st, msg);
  loader_shard_free(s);
  wload_placement_free(&pl);
  return 0;
}

int wload_main(void) {
  worker_env_t e;
  char msg[1024];
  if (worker_env_read(&e, msg, sizeof msg)) {
    fprintf(stderr, "trainyard-worker: %s\n", msg);
    return 2;
  }
  if (report_open(&e)) {
    fprintf(stderr, "trainyard-worker: cannot set up progress reports (libcurl)\n");
    return 2;
  }
  jobspec_t spec;
  int rc = -1;
  if (!e.spec_path || !*e.spec_path)
    snprintf(msg, sizeof msg, "%s is not set (set it to the path of the job's spec)",
             rankenv_name(RANKENV_SPEC));
  else
    rc = worker_read_spec(e.spec_path, &spec, msg, sizeof msg);
  if (rc) {
    wload_send(REPORT_PHASE_FAILED, NULL, msg);
    rc = 1;
  } else {
    rc = wload_run(&spec, &e);
  }
  report_close();
  return rc;
}
