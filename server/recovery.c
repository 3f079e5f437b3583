/* recovery.c - reconciling a previous instance's jobs and ranks at start;
 * see recovery.h. */
#include "server/recovery.h"

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/shm_name.h"
#include "common/xalloc.h"
#include "server/dispatcher.h"
#include "server/service.h"

typedef struct {
  char id[DB_ID_MAX];
  int attempt, rank, pid;
  int64_t start;
  bool alive;
  bool adopted; /* left running: the scheduler takes it over */
} live_t;

typedef struct {
  live_t *items;
  size_t n, cap;
  dispatcher_t *disp; /* the engine that started them */
} live_list_t;

static void collect(const char *id, int attempt, int rank, int pid, int64_t start, void *ctx) {
  live_list_t *l = ctx;
  if (l->n == l->cap)
    l->items = xrealloc(l->items, (l->cap = l->cap ? 2 * l->cap : 16) * sizeof *l->items);
  live_t *x = &l->items[l->n++];
  memset(x, 0, sizeof *x); /* adopted and the rest start false: xrealloc does not clear */
  snprintf(x->id, sizeof x->id, "%s", id);
  x->attempt = attempt;
  x->rank = rank;
  x->pid = pid;
  x->start = start;
  x->alive = l->disp->ops->recorded_alive(l->disp, pid, start);
}

/* Refreshes each entry's liveness; returns how many are still alive. */
static int any_alive(live_list_t *l) {
  int n = 0;
  for (size_t i = 0; i < l->n; i++) {
    live_t *x = &l->items[i];
    if (x->alive) x->alive = l->disp->ops->recorded_alive(l->disp, x->pid, x->start);
    n += x->alive;
  }
  return n;
}

/* Whether job id is in l (the jobs whose ranks were left unfinished). */
static bool listed(const live_list_t *l, const char *id) {
  for (size_t i = 0; i < l->n; i++)
    if (!strcmp(l->items[i].id, id)) return true;
  return false;
}

/* The shared-memory segments of this database's attempts: after the ranks
 * above are stopped, every one is dead, and a segment one of them left
 * (rank 0 creates it; the last rank to join unlinks it, so a crash during
 * the rendezvous leaves it) would stay in /dev/shm until reboot. Segments of
 * jobs this database does not know belong to someone else. */
static int remove_segments(svc_t *svc) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char id[DB_ID_MAX], rdv[300];
    int attempt;
    db_job_brief_t b;
    if (!ty_shm_server_parse(e->d_name, id, sizeof id, &attempt) ||
        db_job_brief(svc_db(svc), id, &b))
      continue;
    ty_shm_server_rendezvous(id, attempt, rdv, sizeof rdv);
    if (ty_shm_remove(rdv) == 0) {
      ty_info("recovery: removed /dev/shm/%s, left by attempt %d of job %s", e->d_name, attempt,
              id);
      n++;
    }
  }
  closedir(d);
  return n;
}

void recovery_remove_unfinished(const char *output_dir, const char *id) {
  char path[PATH_MAX + 16], err[PATH_MAX + 128];
  snprintf(path, sizeof path, "%s/checkpoints", output_dir);
  DIR *c = opendir(path);
  for (struct dirent *e; c && (e = readdir(c));) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "step-", 5) || len < 9 || strcmp(e->d_name + len - 4, ".tmp")) continue;
    char tmp[sizeof path + 300];
    snprintf(tmp, sizeof tmp, "%s/%s", path, e->d_name);
    if (ty_rmtree(tmp, err, sizeof err))
      ty_warn("job %s: %s", id, err);
    else
      ty_info("job %s: removed %s, a checkpoint its dead attempt left unfinished", id, tmp);
  }
  if (c) closedir(c);
}

/* What a dead attempt of job id left half made: the NCCL rendezvous files
 * of its attempt folders, and in its output folder a checkpoint it was
 * writing (checkpoints/step-N.tmp), when no other run holds that folder. */
static void remove_leftovers(svc_t *svc, const srv_config_t *cfg, const char *id) {
  char dir[PATH_MAX], path[PATH_MAX + 300];
  snprintf(dir, sizeof dir, "%s/jobs/%s", cfg->state_dir, id);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strncmp(e->d_name, "attempt-", 8)) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    DIR *a = opendir(path);
    for (struct dirent *f; a && (f = readdir(a));) {
      if (strncmp(f->d_name, "nccl.id", 7)) continue;
      char file[sizeof path + 300];
      snprintf(file, sizeof file, "%s/%s", path, f->d_name);
      unlink(file);
    }
    if (a) closedir(a);
  }
  if (d) closedir(d);
  db_job_t *j = NULL;
  if (db_job_get(svc_db(svc), id, &j) || !j->output_dir[0] || access(j->output_dir, F_OK)) {
    db_job_free(j);
    return;
  }
  int lock = ty_dir_lock(j->output_dir, NULL, 0);
  if (lock >= 0) {
    recovery_remove_unfinished(j->output_dir, id);
    close(lock);
  }
  db_job_free(j);
}

/* Whether job id has an attempt adopted (in the first n entries of a). */
static bool adopted_job(const recovery_adopt_t *a, size_t n, const char *id) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(a[i].id, id)) return true;
  return false;
}

int recovery_run(svc_t *svc, const srv_config_t *cfg, dispatcher_t *disp, recovery_adopt_t **adopt,
                 size_t *nadopt) {
  live_list_t l = {.disp = disp};
  *adopt = NULL;
  *nadopt = 0;
  int rc = db_live_ranks_each(svc_db(svc), collect, &l);
  if (rc) return rc;
  /* Attempts of active jobs that the engine still runs, and can watch
   * again, are taken over rather than stopped: a batch job queued or
   * running in the cluster is not this process's child. */
  for (size_t i = 0; disp->ops->adopt && i < l.n; i++) {
    live_t *x = &l.items[i];
    db_job_brief_t b;
    if (!x->alive || db_job_brief(svc_db(svc), x->id, &b) || b.attempt != x->attempt ||
        !(DB_MASK(b.state) & DB_MASK_ACTIVE))
      continue;
    x->adopted = true;
    if (adopted_job(*adopt, *nadopt, x->id)) continue;
    *adopt = xrealloc(*adopt, (*nadopt + 1) * sizeof **adopt);
    recovery_adopt_t *a = &(*adopt)[(*nadopt)++];
    snprintf(a->id, sizeof a->id, "%s", x->id);
    a->attempt = x->attempt;
    a->pid = x->pid;
    a->start = x->start;
    ty_info("recovery: job %s attempt %d still runs (%s, %d): watched again", x->id, x->attempt,
            disp->ops->name, x->pid);
  }
  for (size_t i = 0; i < l.n; i++)
    if (l.items[i].adopted) l.items[i].alive = false; /* not to be stopped below */
  /* Stop the survivors: they report to an instance that no longer knows
   * them and hold slots this one is about to hand out. */
  for (size_t i = 0; i < l.n; i++)
    if (l.items[i].alive) {
      ty_warn("recovery: job %s rank %d (pid %d) outlived the previous trainyardd: SIGTERM",
              l.items[i].id, l.items[i].rank, l.items[i].pid);
      disp->ops->recorded_signal(disp, l.items[i].pid, l.items[i].start, SIGTERM);
    }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    if (!any_alive(&l)) break;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 > cfg->grace) {
      for (size_t i = 0; i < l.n; i++)
        if (l.items[i].alive)
          disp->ops->recorded_signal(disp, l.items[i].pid, l.items[i].start, SIGKILL);
      usleep(100000);
      any_alive(&l);
      break;
    }
    usleep(20000);
  }
  /* Every unfinished row gets its end, whatever its job's state (a
   * cancelled or failed job whose ranks were still stopping): otherwise its
   * event streams never end and it can never be deleted. */
  for (size_t i = 0; i < l.n; i++) {
    live_t *x = &l.items[i];
    if (x->adopted) continue;
    bool had_pid = x->pid > 0;
    svc_rank_finished(svc, x->id, x->attempt, x->rank, "stopped", -1,
                      had_pid ? "trainyardd restarted: the rank was stopped"
                              : "trainyardd restarted before the rank was started");
  }

  db_job_t **jobs;
  size_t n;
  rc = db_job_list_fifo(svc_db(svc), DB_MASK_ACTIVE, 0, 1 << 20, &jobs, &n);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    db_job_t *j = jobs[i];
    char reason[256];
    int to;
    if (adopted_job(*adopt, *nadopt, j->id)) continue;
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
    if (!listed(&l, j->id)) remove_leftovers(svc, cfg, j->id);
  }
  db_jobs_free(jobs, n);
  for (size_t i = 0; i < l.n; i++)
    if ((i == 0 || strcmp(l.items[i].id, l.items[i - 1].id)) &&
        !adopted_job(*adopt, *nadopt, l.items[i].id))
      remove_leftovers(svc, cfg, l.items[i].id);
  free(l.items);
  int stale = 0;
  if (!db_attempts_close_stale(svc_db(svc), "trainyardd restarted: the attempt was left open",
                               &stale) &&
      stale)
    ty_info("recovery: %d attempt%s left open closed", stale, stale == 1 ? "" : "s");
  remove_segments(svc);
  if (n)
    ty_info("recovery: %zu job%s left running by the previous trainyardd reconciled", n,
            n == 1 ? "" : "s");
  return (int)n;
}
