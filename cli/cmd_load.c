/* cmd_load.c - trainyard load SPEC|--dotted.flags: starts world_size local
 * ranks that only load their shards (RANKENV_MODE=load), then prints one
 * JSON line per rank with what it read, held and how long it took. It
 * answers "will this checkpoint fit, and what will each rank hold?". */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "api/jobspec.h"
#include "cli/commands.h"
#include "cli/worker_path.h"
#include "common/json_util.h"
#include "common/xalloc.h"
#include "worker/rank/launch.h"
#include "worker/ckpt/loader.h"

/* What each rank said: its last JSON report (stdout line). */
typedef struct {
  json_t **last; /* [world_size] */
} load_ctx_t;

static void on_line(void *ctx, int rank, launch_stream_t stream, const char *line) {
  load_ctx_t *c = ctx;
  if (stream == LAUNCH_STDERR) { /* the rank's log: its human lines */
    fprintf(stderr, "%s\n", line);
    return;
  }
  json_t *j = json_loads(line, 0, NULL);
  if (!json_is_object(j)) {
    json_decref(j);
    return;
  }
  json_decref(c->last[rank]);
  c->last[rank] = j;
}

static void load_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard load [SPEC.json] [--dotted.field value ...]\n"
          "Starts world_size local ranks that load their shards of model_path (or initialise\n"
          "them, with init_from_scratch) and exit. Prints one JSON line per rank:\n"
          "  rank, world_size, path, status, shard_bytes, bytes_loaded, bytes_total,\n"
          "  host_peak_bytes, device_peak_bytes, load_seconds, gb_per_s, message\n"
          "Exit status 0 when every rank loaded, 1 when one failed (its reason on stderr),\n"
          "2 for an invalid spec. Example:\n"
          "  trainyard load --model_path models/tiny --world_size 2 "
          "--fsdp.memory_efficient_load true\n");
}

/* Prints rank r's line from its last report rep (may be NULL); returns 0
 * when it loaded. why: the launcher's reason when this rank failed the job. */
static int print_rank(const jobspec_t *s, int rank, json_t *rep, const char *why,
                      uint64_t shard_bytes) {
  const char *phase = json_string_value(json_object_get(rep, "phase"));
  const char *msg = json_string_value(json_object_get(rep, "message"));
  bool ok = phase && !strcmp(phase, "done");
  if (!ok && (!msg || !*msg || !strcmp(phase ? phase : "", "loading")))
    msg = why && *why ? why : "stopped before it finished (another rank failed)";
  double secs = json_real_value(json_object_get(rep, "load_seconds"));
  json_int_t loaded = json_integer_value(json_object_get(rep, "bytes_loaded"));
  const char *path = s->init_from_scratch            ? "init_from_scratch"
                     : s->fsdp.memory_efficient_load ? "memory_efficient"
                                                     : "standard";
  json_t *out = json_pack(
      "{s:i,s:i,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:s}", "rank", rank, "world_size",
      s->world_size, "path", path, "status", ok ? "ok" : "failed", "shard_bytes",
      (json_int_t)shard_bytes, "bytes_loaded", loaded, "bytes_total",
      json_integer_value(json_object_get(rep, "bytes_total")), "host_peak_bytes",
      json_integer_value(json_object_get(rep, "host_peak_bytes")), "device_peak_bytes",
      json_integer_value(json_object_get(rep, "device_peak_bytes")), "load_seconds", secs,
      "gb_per_s", secs > 0 ? (double)loaded / secs / 1e9 : 0.0, "message", msg ? msg : "");
  char *line = ty_json_dumps(out, JSON_COMPACT);
  printf("%s\n", line);
  free(line);
  json_decref(out);
  return ok ? 0 : -1;
}

int cmd_load(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      load_usage(stdout);
      return 0;
    }
  }
  jobspec_t s;
  jobspec_init(&s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = jobspec_from_args(&s, argc - 1, argv + 1, NULL, &errs);
  if (!rc) rc = jobspec_validate(&s, true, &errs);
  /* Every rank loads on this host: a load it can never hold is refused. */
  if (!rc && s.device != JOBSPEC_DEVICE_CUDA)
    rc = jobspec_check_host_memory(&s, false, jobspec_host_memory(), "MemTotal", &errs);
  if (rc) {
    for (size_t i = 0; i < errs.len; i++)
      fprintf(stderr, "trainyard load: %s: %s\n",
              *errs.items[i].field ? errs.items[i].field : "spec", errs.items[i].message);
    ty_errlist_clear(&errs);
    return 2;
  }
  char worker[PATH_MAX + 64];
  if (worker_path_find(worker, sizeof worker)) {
    fprintf(stderr,
            "trainyard load: trainyard-worker not found beside this binary (set "
            "TRAINYARD_WORKER to its path)\n");
    return 1;
  }
  /* The normalized spec, for the ranks. */
  char spec_path[] = "/tmp/trainyard-load-spec-XXXXXX";
  int fd = mkstemp(spec_path);
  json_t *j = jobspec_to_json(&s);
  if (fd < 0 || json_dumpfd(j, fd, JSON_COMPACT)) {
    fprintf(stderr, "trainyard load: cannot write the spec for the ranks: %s\n", strerror(errno));
    json_decref(j);
    if (fd >= 0) close(fd), unlink(spec_path);
    return 1;
  }
  json_decref(j);
  close(fd);
  load_ctx_t ctx = {xcalloc((size_t)s.world_size, sizeof(json_t *))};
  launch_opts_t lo = {.worker = worker,
                      .world_size = s.world_size,
                      .spec_path = spec_path,
                      .mode = "load",
                      .on_line = on_line,
                      .ctx = &ctx};
  launch_result_t res;
  rc = launch_run(&lo, &res);
  unlink(spec_path);
  if (rc == TY_EINVAL || rc == TY_EUNAVAILABLE) {
    fprintf(stderr, "trainyard load: cannot start the ranks: %s\n", res.reason);
    free(ctx.last);
    return 1;
  }
  /* What each rank holds once loaded, from the shape alone (0 when the
   * checkpoint's config.json cannot be read: the ranks say why). */
  llama_config_t cfg = s.model;
  char cerr[256];
  bool have_cfg = s.init_from_scratch || !ckpt_read_config(s.model_path, &cfg, cerr, sizeof cerr);
  int failed = rc != 0;
  const loader_q4_t q4 = {.type = s.quantization.bnb_4bit_quant_type == JOBSPEC_QUANT_FP4,
                          .double_quant = s.quantization.bnb_4bit_use_double_quant};
  for (int i = 0; i < s.world_size; i++) {
    uint64_t shard = have_cfg ? loader_shard_bytes_q4(&cfg, i, s.world_size, s.dtype,
                                                      s.quantization.load_in_4bit ? &q4 : NULL)
                              : 0;
    failed |= print_rank(&s, i, ctx.last[i], i == res.failed_rank ? res.reason : NULL, shard) != 0;
    json_decref(ctx.last[i]);
  }
  free(ctx.last);
  if (failed)
    fprintf(stderr, "trainyard load: %s\n",
            res.reason[0] ? res.reason : "a rank did not finish loading");
  return failed ? 1 : 0;
}
