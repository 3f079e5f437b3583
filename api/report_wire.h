/* report_wire.h - a rank's progress report on the wire (DESIGN.md "Worker
 * contract" and "Progress"): one JSON object, POSTed to the report URL or
 * printed as one line on stdout. Its fields and its phases are each one
 * table here; the worker writes reports with report_wire_json, trainyardd
 * (REST, gRPC, a rank's stdout) and the CLI's launcher read them with
 * report_wire_parse. */
#ifndef TY_API_REPORT_WIRE_H
#define TY_API_REPORT_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "common/errors.h"

/* X(id, name): the phases of a rank, in the order a rank passes them. */
#define REPORT_PHASES(X)      \
  X(STARTING, "starting")     \
  X(TOKENIZING, "tokenizing") \
  X(LOADING, "loading")       \
  X(REFERENCE, "reference")   \
  X(TRAINING, "training")     \
  X(SAVING, "saving")         \
  X(DONE, "done")             \
  X(FAILED, "failed")

typedef enum {
#define REPORT_PHASE_ENUM(id, name) REPORT_PHASE_##id,
  REPORT_PHASES(REPORT_PHASE_ENUM)
#undef REPORT_PHASE_ENUM
      REPORT_PHASE_COUNT
} report_phase_t;

/* The phase's name ("training"); "?" for a value out of range. */
const char *report_phase_name(report_phase_t p);
/* The phase named s into *out; false when s names none. */
bool report_phase_parse(const char *s, report_phase_t *out);

#define REPORT_MESSAGE_MAX 4096
#define REPORT_JOB_ID_MAX 128
/* A sample (train.sample_prompts): the prompt, and the text generated. */
#define REPORT_SAMPLE_PROMPT_MAX 1024
#define REPORT_SAMPLE_TEXT_MAX 4096

/* X(name, TRL's name): the preference-tuning metrics of a training step
 * (train.objective dpo), means over the step's pairs; on the wire, in the
 * server's answers and events and in gRPC, the members of one "dpo"
 * object; in metrics.jsonl and TensorBoard, TRL's names. */
#define REPORT_DPO_METRICS(X)                 \
  X(rewards_chosen, "rewards/chosen")         \
  X(rewards_rejected, "rewards/rejected")     \
  X(rewards_accuracies, "rewards/accuracies") \
  X(rewards_margins, "rewards/margins")       \
  X(logps_chosen, "logps/chosen")             \
  X(logps_rejected, "logps/rejected")
enum {
#define REPORT_DPO_ENUM(name, trl) REPORT_DPO_##name,
  REPORT_DPO_METRICS(REPORT_DPO_ENUM)
#undef REPORT_DPO_ENUM
      REPORT_DPO_N
};
/* "rewards_chosen" for REPORT_DPO_rewards_chosen, ... */
extern const char *const report_dpo_names[REPORT_DPO_N];
/* The "dpo" object of m (NaN: unknown, left out), or NULL when none is
 * known; and back (members missing or null are NaN; errors under "dpo"). */
json_t *report_dpo_json(const double *m);
void report_dpo_parse(const json_t *o, double *m, ty_errlist_t *errs);

/* One report. */
typedef struct {
  char job_id[REPORT_JOB_ID_MAX]; /* "" when not sent */
  int attempt, rank, world_size;
  report_phase_t phase;
  int64_t step, total_steps;
  double loss;         /* NaN while unknown (sent as null) */
  double tokens_per_s; /* NaN or infinite: sent as 0 */
  int64_t bytes_loaded, bytes_total;
  int64_t host_peak_bytes, device_peak_bytes;
  double load_seconds;              /* NaN or infinite: sent as 0 */
  char message[REPORT_MESSAGE_MAX]; /* why, for "failed"; else what happened */
  /* A report that carries a sample: its prompt (non-empty) and text; both
   * "" otherwise. The server makes each a "sample" event. */
  char sample_prompt[REPORT_SAMPLE_PROMPT_MAX];
  char sample_text[REPORT_SAMPLE_TEXT_MAX];
  double dpo[REPORT_DPO_N]; /* the step's DPO metrics; NaN when unknown */
} report_wire_t;

/* X(name, kind, member, required, meaning): the fields of the JSON object,
 * in the order they are written. kinds: STR (a string), SMALL (an int in
 * 0..1000000), COUNT (an int64 >= 0), REAL (a number or null), PHASE (one
 * of REPORT_PHASES' names), DPO (report_dpo_json's object, or null). A
 * field not required may be missing or null. */
#define REPORT_FIELDS(X)                                                                      \
  X("job_id", STR, job_id, false, "the job's id")                                             \
  X("attempt", SMALL, attempt, true, "the attempt the rank belongs to, from 1")               \
  X("rank", SMALL, rank, true, "the rank, from 0")                                            \
  X("world_size", SMALL, world_size, true, "the job's ranks")                                 \
  X("phase", PHASE, phase, true,                                                              \
    "starting, tokenizing, loading, reference, training, saving, done or failed")             \
  X("step", COUNT, step, false, "optimizer steps done")                                       \
  X("total_steps", COUNT, total_steps, false, "steps the job runs")                           \
  X("loss", REAL, loss, false, "the last step's training loss; null while unknown")           \
  X("tokens_per_s", REAL, tokens_per_s, false, "training throughput of this rank")            \
  X("bytes_loaded", COUNT, bytes_loaded, false,                                               \
    "bytes of weights read so far (tokenizing: of the data; reference: pairs scored)")        \
  X("bytes_total", COUNT, bytes_total, false, "bytes of weights to read (or as above)")       \
  X("host_peak_bytes", COUNT, host_peak_bytes, false, "the process's peak resident memory")   \
  X("device_peak_bytes", COUNT, device_peak_bytes, false, "peak device memory held")          \
  X("load_seconds", REAL, load_seconds, false, "seconds the load took")                       \
  X("message", STR, message, false, "why, for failed; else what happened")                    \
  X("sample_prompt", STR, sample_prompt, false,                                               \
    "a sample's prompt (train.sample_prompts); the report then carries that sample")          \
  X("sample_text", STR, sample_text, false, "the text generated after sample_prompt at step") \
  X("dpo", DPO, dpo, false,                                                                   \
    "train.objective dpo, phase training: the step's metrics (REPORT_DPO_METRICS)")

/* A report with nothing in it: phase starting, loss and dpo NaN, the rest
 * zero. */
void report_wire_init(report_wire_t *r);

/* The JSON object of r (a new reference; NULL when out of memory). */
json_t *report_wire_json(const report_wire_t *r);

/* Fills *r from the JSON object o, adding one error per bad field to errs
 * (none: r is whole). Returns 0 or TY_EINVAL. */
int report_wire_parse(const json_t *o, report_wire_t *r, ty_errlist_t *errs);

/* A line a rank printed: true and *r filled when it is a JSON object with a
 * phase that parses as a report; false for any other line (a log line, a
 * malformed report). */
bool report_wire_parse_line(const char *line, report_wire_t *r);

/* Whether b moved past a: another phase, step or bytes_loaded (a heartbeat
 * repeating a report does not). */
bool report_wire_progressed(const report_wire_t *a, const report_wire_t *b);

#endif
