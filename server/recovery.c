/* recovery.c - reconciling a previous instance's jobs and ranks at start;
 * see recovery.h. */
#include "server/recovery.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/xalloc.h"
#include "server/dispatch.h"
#include "server/service.h"

typedef struct {
  char id[DB_ID_MAX];
  int attempt, rank, pid;
  int64_t start;
  bool alive;
} live_t;

typedef struct {
  live_t *items;
  size_t n, cap;
} live_list_t;

static void collect(const char *id, int attempt, int rank, int pid, int64_t start, void *ctx) {
  live_list_t *l = ctx;
  if (l->n == l->cap) l->items = xrealloc(l->items, (l->cap = l->cap ? 2 * l->cap : 16) * sizeof *l->items);
  live_t *x = &l->items[l->n++];
  snprintf(x->id, sizeof x->id, "%s", id);
  x->attempt = attempt;
  x->rank = rank;
  x->pid = pid;
  x->start = start;
  x->alive = dispatch_alive(pid, start);
}

/* Refreshes each entry's liveness; returns how many are still alive. */
static int any_alive(live_list_t *l) {
  int n = 0;
  for (size_t i = 0; i < l->n; i++) {
    live_t *x = &l->items[i];
    if (x->alive) x->alive = dispatch_alive(x->pid, x->start);
    n += x->alive;
  }
  return n;
}

int recovery_run(svc_t *svc, const srv_config_t *cfg) {
  live_list_t l = {0};
  int rc = db_live_ranks_each(svc_db(svc), collect, &l);
  if (rc) return rc;
  /* Stop the survivors: they report to an instance that no longer knows
   * them and hold slots this one is about to hand out. */
  for (size_t i = 0; i < l.n; i++)
    if (l.items[i].alive) {
      ty_warn("recovery: job %s rank %d (pid %d) outlived the previous trainyardd: SIGTERM",
              l.items[i].id, l.items[i].rank, l.items[i].pid);
      dispatch_signal(l.items[i].pid, l.items[i].start, SIGTERM);
    }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    if (!any_alive(&l)) break;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > cfg->grace) {
      for (size_t i = 0; i < l.n; i++)
        if (l.items[i].alive) dispatch_signal(l.items[i].pid, l.items[i].start, SIGKILL);
      usleep(100000);
      any_alive(&l);
      break;
    }
    usleep(20000);
  }
  for (size_t i = 0; i < l.n; i++) {
    live_t *x = &l.items[i];
    bool had_pid = x->pid > 0;
    svc_rank_finished(svc, x->id, x->attempt, x->rank, "stopped", -1,
                      had_pid ? "trainyardd restarted: the rank was stopped"
                              : "trainyardd restarted before the rank was started");
  }
  free(l.items);

  db_job_t **jobs;
  size_t n;
  rc = db_job_list_fifo(svc_db(svc), DB_MASK_ACTIVE, 0, 1 << 20, &jobs, &n);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    db_job_t *j = jobs[i];
    char reason[256];
    int to;
    if (j->attempt <= j->max_restarts) {
      to = DB_JOB_QUEUED;
      snprintf(reason, sizeof reason,
               "trainyardd restarted while attempt %d ran; its ranks were stopped; retrying "
               "(restart %d of %d)",
               j->attempt, j->attempt, j->max_restarts);
    } else {
      to = DB_JOB_FAILED;
      snprintf(reason, sizeof reason,
               "trainyardd restarted while attempt %d ran; its ranks were stopped (max_restarts "
               "%d allows no new attempt)",
               j->attempt, j->max_restarts);
    }
    svc_transition(svc, j->id, DB_MASK_ACTIVE, to, reason, NULL, NULL);
  }
  db_jobs_free(jobs, n);
  if (n) ty_info("recovery: %zu job%s left running by the previous trainyardd reconciled", n, n == 1 ? "" : "s");
  return (int)n;
}
