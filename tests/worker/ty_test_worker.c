/* ty_test_worker.c - a stand-in trainyard-worker for the server's tests.
 * It follows the worker contract (DESIGN.md "Worker contract"): reads its
 * environment and the spec, reports every phase through worker/rank/report.h,
 * exits 0 when its work is done. What goes wrong is chosen by '-'-separated
 * words in the spec's name (R: a rank, S: a step):
 *   failRatS    rank R reports "failed" at step S and exits 3
 *   crashRatS   rank R aborts (SIGABRT) at step S
 *   hangRatS    rank R stops advancing at step S but keeps reporting
 *   silentR     rank R never reports and sleeps
 *   slow        100 ms per step (default 5 ms)
 *   stepMS      MS milliseconds per step, silent meanwhile (a long step)
 *   flaky       rank 0 fails at step 1 of attempt 1 only
 *   ignoreterm  every rank ignores SIGTERM and the server's "stop" answer
 *   child       every rank leaves a sleeping child in its process group
 *   nopipe      ignore SIGPIPE (outlive the server that reads the log pipe)
 *   chatty      write 1 KiB of extra log output per step
 *   dpo         each step's report carries DPO metrics (train.objective
 *               dpo's): margin 0.1 S, accuracy S / steps, and the rest
 *               derived from them (rewards_chosen = margin / 2, ...)
 * train.sample_prompts are played as the worker makes them: rank 0 sends a
 * sample report of each ("<prompt>" -> " ... sampled at step S") every
 * train.sample_every steps and at the end.
 * On success rank R writes <output_dir>/rank<R>.done: the steps, its
 * rendezvous and the GPU it was given. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/rankenv.h"
#include "worker/rank/report.h"

typedef struct {
  int fail_rank, fail_step, crash_rank, crash_step, hang_rank, hang_step, silent_rank;
  int step_ms;
  bool flaky, ignoreterm, child, nopipe, chatty, dpo;
} plan_t;

static void parse_plan(const char *name, plan_t *p) {
  memset(p, 0, sizeof *p);
  p->fail_rank = p->crash_rank = p->hang_rank = p->silent_rank = -1;
  p->step_ms = 5;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", name);
  for (char *save = NULL, *w = strtok_r(buf, "-", &save); w; w = strtok_r(NULL, "-", &save)) {
    if (sscanf(w, "fail%dat%d", &p->fail_rank, &p->fail_step) == 2) continue;
    if (sscanf(w, "crash%dat%d", &p->crash_rank, &p->crash_step) == 2) continue;
    if (sscanf(w, "hang%dat%d", &p->hang_rank, &p->hang_step) == 2) continue;
    if (sscanf(w, "silent%d", &p->silent_rank) == 1) continue;
    if (sscanf(w, "step%d", &p->step_ms) == 1) continue;
    if (!strcmp(w, "slow")) p->step_ms = 100;
    if (!strcmp(w, "flaky")) p->flaky = true;
    if (!strcmp(w, "ignoreterm")) p->ignoreterm = true;
    if (!strcmp(w, "child")) p->child = true;
    if (!strcmp(w, "nopipe")) p->nopipe = true;
    if (!strcmp(w, "chatty")) p->chatty = true;
    if (!strcmp(w, "dpo")) p->dpo = true;
  }
}

static bool g_stubborn;

/* Rank 0's samples of train.sample_prompts at step s (after its report). */
static int send_or_stop(const report_t *r);
static void samples(const json_t *train, int rank, const report_t *step_report) {
  const json_t *prompts = json_object_get(train, "sample_prompts");
  if (rank != 0 || !json_array_size(prompts)) return;
  size_t i;
  const json_t *pr;
  json_array_foreach(prompts, i, pr) {
    char text[128];
    snprintf(text, sizeof text, " ... sampled at step %lld", (long long)step_report->step);
    report_t r = *step_report;
    r.sample_prompt = json_string_value(pr);
    r.sample_text = text;
    send_or_stop(&r);
  }
}

static int send_or_stop(const report_t *r) {
  int rc = report_send(r);
  if (rc == TY_EPRECONDITION && !g_stubborn) {
    fprintf(stderr, "test worker: the server says this attempt is over; stopping\n");
    exit(4);
  }
  return rc;
}

int main(void) {
  const char *spec_path = rankenv_str(RANKENV_SPEC);
  json_error_t jerr;
  json_t *spec = spec_path ? json_load_file(spec_path, 0, &jerr) : NULL;
  if (!spec) {
    fprintf(stderr, "test worker: cannot read %s (%s)\n", rankenv_name(RANKENV_SPEC),
            spec_path ? spec_path : "unset");
    return 2;
  }
  worker_env_t e;
  char err[512];
  if (worker_env_read(&e, err, sizeof err)) {
    fprintf(stderr, "test worker: %s\n", err);
    return 2;
  }
  if (report_open(&e)) return 2;
  const int rank = e.rank, attempt = e.attempt;
  plan_t p;
  parse_plan(json_string_value(json_object_get(spec, "name")), &p);
  const json_t *train = json_object_get(spec, "train");
  json_int_t steps = json_integer_value(json_object_get(train, "steps"));
  const char *out_dir = json_string_value(json_object_get(spec, "output_dir"));
  if (p.ignoreterm) signal(SIGTERM, SIG_IGN);
  g_stubborn = p.ignoreterm;
  if (p.nopipe) signal(SIGPIPE, SIG_IGN);
  if (p.child && fork() == 0) {
    for (;;) pause();
  }
  if (rank == p.silent_rank)
    for (;;) pause();

  report_t r = {.phase = REPORT_PHASE_STARTING, .loss = NAN, .total_steps = steps};
  send_or_stop(&r);
  r.phase = REPORT_PHASE_LOADING;
  r.bytes_total = 1 << 20;
  for (int i = 1; i <= 4; i++) {
    r.bytes_loaded = (int64_t)i << 18;
    r.host_peak_bytes = 8 << 20;
    send_or_stop(&r);
  }
  r.phase = REPORT_PHASE_TRAINING;
  r.load_seconds = 0.01;
  for (json_int_t s = 1; s <= steps; s++) {
    usleep((useconds_t)p.step_ms * 1000);
    if (rank == p.hang_rank && s >= p.hang_step) {
      for (;;) { /* keep reporting the same step: alive, no progress */
        send_or_stop(&r);
        usleep(100000);
      }
    }
    if ((rank == p.fail_rank && s == p.fail_step) || (p.flaky && rank == 0 && attempt == 1)) {
      char msg[128];
      snprintf(msg, sizeof msg, "injected failure at step %lld", (long long)s);
      r.phase = REPORT_PHASE_FAILED;
      r.message = msg;
      send_or_stop(&r);
      return 3;
    }
    if (rank == p.crash_rank && s == p.crash_step) abort();
    if (p.chatty) {
      char line[1025];
      memset(line, 'x', 1024);
      line[1024] = '\0';
      fprintf(stderr, "%s\n", line);
    }
    r.step = s;
    r.loss = 3.0 * exp(-(double)s / (double)steps);
    r.tokens_per_s = 1000.0;
    double dpo[REPORT_DPO_N];
    if (p.dpo) {
      const double margin = 0.1 * (double)s;
      dpo[REPORT_DPO_rewards_margins] = margin;
      dpo[REPORT_DPO_rewards_accuracies] = (double)s / (double)steps;
      dpo[REPORT_DPO_rewards_chosen] = margin / 2;
      dpo[REPORT_DPO_rewards_rejected] = -margin / 2;
      dpo[REPORT_DPO_logps_chosen] = -10.0 + margin;
      dpo[REPORT_DPO_logps_rejected] = -10.0 - margin;
      r.dpo = dpo;
    }
    send_or_stop(&r);
    r.dpo = NULL;
    const json_int_t every = json_integer_value(json_object_get(train, "sample_every"));
    if ((every > 0 && s % every == 0) || s == steps) samples(train, rank, &r);
  }
  r.phase = REPORT_PHASE_SAVING;
  send_or_stop(&r);
  if (out_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.done", out_dir, rank);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out_dir);
    for (char *q = dir + 1; *q; q++)
      if (*q == '/') {
        *q = '\0';
        mkdir(dir, 0755);
        *q = '/';
      }
    mkdir(dir, 0755);
    FILE *f = fopen(path, "w");
    if (f) {
      const char *gpu = getenv("CUDA_VISIBLE_DEVICES"), *rdv = rankenv_str(RANKENV_RENDEZVOUS);
      fprintf(f, "steps %lld\nrendezvous %s\ngpu %s\n", (long long)steps, rdv ? rdv : "",
              gpu ? gpu : "");
      fclose(f);
    }
  }
  r.phase = REPORT_PHASE_DONE;
  send_or_stop(&r);
  report_close();
  json_decref(spec);
  return 0;
}
