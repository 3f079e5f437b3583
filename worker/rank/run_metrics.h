/* run_metrics.h - the per-step curves a job leaves in its output_dir, so
 * that they outlive the server's database: metrics.jsonl (one JSON object
 * per line) and TensorBoard event files under tensorboard/
 * (worker/rank/tb_events.h). Rank 0 writes them; the figures are the job's.
 *
 * metrics.jsonl is appended to: a resumed attempt adds the steps it runs
 * again after the lines of the steps it resumes from (a reader takes the
 * last line of a step). Each line is written with one write(2). A line
 * holds "step", "time" (seconds since the epoch) and each figure that is
 * known: "loss", "eval_loss", "lr", "grad_norm", "tokens_per_s",
 * "host_peak_bytes", "device_peak_bytes", and for train.objective dpo
 * TRL's "rewards/chosen", "rewards/rejected", "rewards/accuracies",
 * "rewards/margins", "logps/chosen", "logps/rejected". The TensorBoard
 * tags are those of RUN_METRICS_TAGS. */
#ifndef TY_WORKER_RUN_METRICS_H
#define TY_WORKER_RUN_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "api/report_wire.h"

/* X(field, json key, TensorBoard tag): the figures of one step, in order. */
#define RUN_METRICS_TAGS(X)                                       \
  X(loss, "loss", "train/loss")                                   \
  X(eval_loss, "eval_loss", "eval/loss")                          \
  X(lr, "lr", "train/learning_rate")                              \
  X(grad_norm, "grad_norm", "train/grad_norm")                    \
  X(tokens_per_s, "tokens_per_s", "train/tokens_per_s")           \
  X(host_peak_bytes, "host_peak_bytes", "memory/host_peak_bytes") \
  X(device_peak_bytes, "device_peak_bytes", "memory/device_peak_bytes")

/* One step's figures; NaN for one not known at that step (the held-out
 * loss is measured before the first step and after the last). tokens_per_s
 * is the job's, over every rank; peaks in bytes. */
typedef struct {
  int64_t step;
  double wall_time; /* seconds since the epoch */
#define RUN_METRICS_FIELD(field, key, tag) double field;
  RUN_METRICS_TAGS(RUN_METRICS_FIELD)
#undef RUN_METRICS_FIELD
  /* train.objective dpo: REPORT_DPO_METRICS (api/report_wire.h), under
   * TRL's names ("rewards/chosen"; TensorBoard "train/rewards/chosen"). */
  double dpo[REPORT_DPO_N];
} run_point_t;

typedef struct run_metrics run_metrics_t;

/* Opens output_dir/metrics.jsonl (for appending) and a new event file in
 * output_dir/tensorboard/. *out is the caller's (run_metrics_close). 0, or
 * a TY_E* code with the reason, naming the file, in err. */
int run_metrics_open(run_metrics_t **out, const char *output_dir, char *err, size_t errlen);

/* Appends one step to both. 0, or TY_EUNAVAILABLE with the reason in err. */
int run_metrics_write(run_metrics_t *m, const run_point_t *p, char *err, size_t errlen);

/* A point with every figure unknown (NaN) at step, stamped now. */
run_point_t run_point_empty(int64_t step);

/* Closes both files and frees m. NULL is a no-op. */
void run_metrics_close(run_metrics_t *m);

#endif
