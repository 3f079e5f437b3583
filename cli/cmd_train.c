/* cmd_train.c - trainyard train [SPEC.json] [--dotted.flags]: validates the
 * spec, starts world_size local ranks (trainyard-worker, RANKENV_MODE=
 * train) through the launcher, prints every rank's progress lines as they
 * come (rank-prefixed, like torchrun) and exits 0 when every rank finished
 * and the outputs are written. A failing rank stops the others (within the
 * launcher's grace period) and its reason is printed; Ctrl-C stops every
 * rank. */
#include <errno.h>
#include <stdbool.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "api/jobspec.h"
#include "cli/commands.h"
#include "cli/worker_path.h"
#include "common/fsutil.h"
#include "common/json_util.h"
#include "common/numbers.h"
#include "worker/rank/launch.h"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard train [SPEC.json] [--dotted.field value ...] [--json]\n"
          "Validates the spec (flags override the file), starts world_size local ranks and\n"
          "prints their progress:\n"
          "  [rank 0/2] train step 40/200 loss 2.314  1530 tok/s  host-peak 212 MiB\n"
          "LoRA jobs write output_dir/adapter_config.json + adapter_model.safetensors (PEFT);\n"
          "full training writes output_dir/config.json + model.safetensors. Checkpoints in\n"
          "output_dir/checkpoints let a rerun resume. --json also prints every rank's raw\n"
          "JSON reports on stdout. One run at a time writes an output_dir: a folder that\n"
          "another run writes is refused. Exit status: 0 success, 1 a rank failed or the\n"
          "folder is busy, 2 an invalid spec, 130 interrupted. Example:\n"
          "  trainyard train --model_path models/tiny --use_lora true --data.path text.txt \\\n"
          "    --world_size 2 --fsdp.memory_efficient_load true --allocation_mode static\n");
}

typedef struct {
  int json; /* echo the JSON reports */
  int world;
} train_view_t;

/* Ranks write JSON reports on stdout and their human-readable lines on
 * stderr; the latter already carry "[rank R/N]", other log lines get it. */
static void on_line(void *ctx, int rank, launch_stream_t stream, const char *line) {
  const train_view_t *v = ctx;
  if (stream == LAUNCH_STDOUT) {
    if (v->json) printf("%s\n", line);
    fflush(stdout);
    return;
  }
  if (!strncmp(line, "[rank ", 6))
    fprintf(stderr, "%s\n", line);
  else
    fprintf(stderr, "[rank %d/%d] %s\n", rank, v->world, line);
}

/* Seconds a rank may go without progress before it counts as stalled:
 * trainyardd's --progress_timeout, the same variable, default and bound
 * (server/config.h). */
static int progress_timeout_ms(int *ms, char *err, size_t errlen) {
  long s = 900;
  int rc =
      ty_env_long("TRAINYARD_PROGRESS_TIMEOUT_S", 1, 604800,
                  "seconds a rank may go without progress before the job fails", &s, err, errlen);
  *ms = (int)(s * 1000);
  return rc;
}

/* The run itself, once the output folder is this process's: writes the
 * normalized spec there, starts the ranks and reports how they ended. */
static int train_locked(const jobspec_t *s, train_view_t *view, const char *worker,
                        int timeout_ms) {
  /* The normalized spec lives with the outputs: it says what made them. */
  char spec_path[PATH_MAX];
  snprintf(spec_path, sizeof spec_path, "%.*s/job.json", PATH_MAX - 16, s->output_dir);
  json_t *j = jobspec_to_json(s);
  int rc = ty_json_dump_file(j, spec_path, JSON_INDENT(2));
  json_decref(j);
  if (rc) {
    fprintf(stderr, "trainyard train: cannot write %s: %s\n", spec_path, strerror(errno));
    return 1;
  }
  fprintf(stderr, "trainyard train: %s: %d rank%s, %s, %d steps on %s -> %s\n", s->name,
          s->world_size, s->world_size == 1 ? "" : "s", s->use_lora ? "LoRA" : "full training",
          s->train.steps, s->data.path[0] ? s->data.path : "the built-in corpus (no data.path)",
          s->output_dir);
  /* GPU ranks meet through NCCL, its id published in a file beside the
   * outputs; CPU ranks through the launcher's shm segment, or over TCP
   * (dist.backend gloo), their addresses exchanged through files in a
   * folder beside the outputs. */
  char rdv[PATH_MAX + 32];
  const bool nccl = s->device == JOBSPEC_DEVICE_CUDA && s->world_size > 1;
  const bool gloo = s->dist.backend == JOBSPEC_DIST_GLOO && s->world_size > 1;
  if (gloo) {
    /* A crashed run's addresses would send the ranks to dead peers. */
    char gdir[PATH_MAX];
    snprintf(gdir, sizeof gdir, "%.*s/gloo", PATH_MAX - 16, s->output_dir);
    char err[PATH_MAX + 256];
    if (ty_rmtree(gdir, err, sizeof err) || ty_mkdirs(gdir, err, sizeof err)) {
      fprintf(stderr, "trainyard train: cannot prepare the gloo rendezvous folder: %s\n", err);
      return 1;
    }
    snprintf(rdv, sizeof rdv, "gloo:file:%s", gdir);
  } else {
    snprintf(rdv, sizeof rdv, "nccl:file:%.*s/nccl.id", PATH_MAX - 16, s->output_dir);
  }
  /* A crashed run's id would send the other ranks to a dead rendezvous. */
  if (nccl) unlink(rdv + strlen("nccl:file:"));
  launch_opts_t o = {.worker = worker,
                     .world_size = s->world_size,
                     .spec_path = spec_path,
                     .mode = "train",
                     .rendezvous = nccl || gloo ? rdv : NULL,
                     .progress_timeout_ms = timeout_ms,
                     .on_line = on_line,
                     .ctx = view};
  launch_result_t res;
  rc = launch_run(&o, &res);
  if (rc == 0) {
    fprintf(stderr, "trainyard train: done: %s written to %s\n",
            s->use_lora ? "adapter_config.json + adapter_model.safetensors"
                        : "config.json + model.safetensors",
            s->output_dir);
    return 0;
  }
  if (rc == TY_ECANCELLED) {
    fprintf(stderr,
            "trainyard train: stopped by signal %d (%s); every rank stopped. A rerun "
            "resumes from the last checkpoint in %s/checkpoints\n",
            res.interrupted, strsignal(res.interrupted), s->output_dir);
    return 130;
  }
  if (res.failed_rank >= 0)
    fprintf(stderr, "trainyard train: rank %d failed: %s\n", res.failed_rank, res.reason);
  else
    fprintf(stderr, "trainyard train: %s\n", res.reason);
  return 1;
}

int cmd_train(int argc, char **argv) {
  static const char *const passthrough[] = {"json", NULL};
  train_view_t view = {0, 1};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      train_usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--json")) view.json = 1;
  }
  jobspec_t s;
  jobspec_init(&s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = jobspec_from_args(&s, argc - 1, argv + 1, passthrough, &errs);
  if (!rc) rc = jobspec_validate(&s, true, &errs);
  /* Every rank runs on this host: one node, and CPU ranks must fit its
   * memory. */
  if (!rc) rc = jobspec_check_nodes(&s, "trainyard train", false, &errs);
  if (!rc && s.device != JOBSPEC_DEVICE_CUDA)
    rc = jobspec_check_host_memory(&s, true, jobspec_host_memory(), "MemTotal", &errs);
  if (rc) {
    for (size_t i = 0; i < errs.len; i++)
      fprintf(stderr, "trainyard train: %s: %s\n",
              *errs.items[i].field ? errs.items[i].field : "spec", errs.items[i].message);
    ty_errlist_clear(&errs);
    return 2;
  }
  view.world = s.world_size;
  char worker[PATH_MAX + 64], err[1024];
  int timeout_ms;
  if (progress_timeout_ms(&timeout_ms, err, sizeof err)) {
    fprintf(stderr, "trainyard train: %s\n", err);
    return 2;
  }
  if (worker_path_find(worker, sizeof worker)) {
    fprintf(stderr,
            "trainyard train: trainyard-worker not found beside this binary (set "
            "TRAINYARD_WORKER to its path)\n");
    return 1;
  }
  /* One run at a time writes a folder (another `train`, or a trainyardd
   * job, would overwrite its checkpoints and outputs): the lock is held
   * until this process ends. */
  int lock = ty_dir_lock(s.output_dir, err, sizeof err);
  if (lock == TY_EPRECONDITION) {
    fprintf(stderr,
            "trainyard train: output_dir: %s is in use by another trainyard run (a `trainyard "
            "train` or a trainyardd job writing it); wait for it to end, or give this run "
            "another --output_dir\n",
            s.output_dir);
    return 1;
  }
  if (lock < 0) {
    fprintf(stderr, "trainyard train: output_dir: %s\n", err);
    return 1;
  }
  rc = train_locked(&s, &view, worker, timeout_ms);
  close(lock);
  return rc;
}
