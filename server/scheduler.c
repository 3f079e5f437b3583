/* scheduler.c - FIFO queue over the rank slots, the watchdog and the
 * outcome of every attempt; see scheduler.h. The thread owns every run_t;
 * other threads touch them only under s->lock. Lock order: s->lock, then
 * the service's (database) locks; the service never calls in here while
 * holding its own. */
#include "server/scheduler.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/rankproc.h"
#include "common/shm_name.h"
#include "common/xalloc.h"
#include "api/jobspec.h"
#include "server/dispatcher.h"
#include "server/recovery.h"
#include "server/service.h"

#define TICK_S 0.1

typedef struct {
  bool started;          /* the process was created */
  bool exited, recorded; /* reaped; its finish written to the database */
  int status;            /* wait status once exited */
  bool signalled;        /* we sent it SIGTERM or SIGKILL */
  double last_report;    /* monotonic seconds: any report */
  double last_progress;  /* monotonic seconds: phase, step or bytes changed */
  report_wire_t last;    /* the report that last moved its progress */
  char fail_msg[512];    /* message of its last "failed" report */
  bool reported;         /* it has sent a report */
  int gpu;               /* GPU index held, or -1 */
} srank_t;

typedef struct run {
  char id[DB_ID_MAX];
  int attempt, world, max_restarts;
  int preempted_before; /* earlier attempts preempted: not counted against max_restarts */
  bool gpu;
  srank_t *ranks;
  dispatch_run_t *drun; /* the ranks as the dispatcher started them; NULL: none */
  bool decided;         /* the job's state for this attempt is written */
  bool stopping;        /* SIGTERM sent; SIGKILL at kill_at */
  double kill_at;
  bool killed;
  char rdv[2200];   /* the ranks' rendezvous; an shm one is removed at the end */
  int out_lock;     /* ty_dir_lock of the output folder while the ranks run; -1 */
  char *out_dir;    /* the job's resolved output folder; NULL: none */
  char reason[256]; /* the ranks' phases as last written into the job's reason */
  struct run *next;
} run_t;

typedef struct cancel_req {
  char id[DB_ID_MAX];
  struct cancel_req *next;
} cancel_req_t;

struct sched {
  svc_t *svc;
  const srv_config_t *cfg;
  dispatcher_t *disp;
  char url_base[256];
  char worker[PATH_MAX];
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool wake, quit, started;
  pthread_t thread;
  run_t *runs;
  run_t *ending; /* runs being released by tick, outside s->lock */
  cancel_req_t *cancels;
  int64_t cpu_used, gpu_used;
  uint64_t gpu_busy;    /* bit g: GPU g is held by a rank (gpus <= 64) */
  double start_backoff; /* seconds; 0 while starts are written */
  double start_at;      /* ty_mono_s() before which no start is tried again */
};

/* The default worker: trainyard-worker in the directory of this binary (an
 * installed layout), else in ../worker/ beside it (the build tree). */
int sched_create(svc_t *svc, const srv_config_t *cfg, dispatcher_t *disp,
                 const char *report_url_base, sched_t **out, char *msg, size_t msgsz) {
  sched_t *s = xcalloc(1, sizeof *s);
  s->svc = svc;
  s->cfg = cfg;
  s->disp = disp;
  snprintf(s->url_base, sizeof s->url_base, "%s", report_url_base);
  if (*cfg->worker)
    snprintf(s->worker, sizeof s->worker, "%s", cfg->worker);
  else
    ty_find_worker(s->worker, sizeof s->worker); /* checked just below */
  if (access(s->worker, X_OK))
    ty_warn("the worker program %s cannot be run (%s): jobs will fail until it can (--worker)",
            s->worker, strerror(errno));
  pthread_mutex_init(&s->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cond, &ca);
  pthread_condattr_destroy(&ca);
  (void)msg;
  (void)msgsz;
  *out = s;
  return 0;
}

int sched_fits(const srv_config_t *cfg, const char *device, int world_size, char *msg,
               size_t msgsz) {
  bool gpu = !strcmp(device, "cuda");
  int64_t slots = gpu ? cfg->gpus : cfg->cpu_slots;
  if (world_size <= slots) return 0;
  snprintf(msg, msgsz,
           "%d %s ranks can never run on this server: it has %lld %s (%s); lower world_size",
           world_size, gpu ? "GPU" : "CPU", (long long)slots, gpu ? "GPUs" : "CPU rank slots",
           gpu ? "--gpus" : "--cpu_slots");
  return TY_EINVAL;
}

int64_t sched_ranks_running(sched_t *s) {
  pthread_mutex_lock(&s->lock);
  int64_t n = 0;
  for (run_t *r = s->runs; r; r = r->next)
    for (int i = 0; i < r->world; i++) n += r->ranks[i].started && !r->ranks[i].exited;
  pthread_mutex_unlock(&s->lock);
  return n;
}

void sched_wake(sched_t *s) {
  pthread_mutex_lock(&s->lock);
  s->wake = true;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

void sched_cancel(sched_t *s, const char *id) {
  cancel_req_t *c = xcalloc(1, sizeof *c);
  snprintf(c->id, sizeof c->id, "%s", id);
  pthread_mutex_lock(&s->lock);
  c->next = s->cancels;
  s->cancels = c;
  s->wake = true;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

/* Appends ranks (a bitmap over world ranks) as "rank 3" or "ranks 0-1, 4". */
static size_t append_ranks(char *out, size_t size, size_t used, const bool *in, int world) {
  int n = 0;
  for (int i = 0; i < world; i++) n += in[i];
  used += (size_t)snprintf(out + used, used < size ? size - used : 0, "rank%s ", n == 1 ? "" : "s");
  const char *sep = "";
  for (int i = 0; i < world; i++) {
    if (!in[i]) continue;
    int j = i;
    while (j + 1 < world && in[j + 1]) j++;
    if (j == i)
      used += (size_t)snprintf(out + used, used < size ? size - used : 0, "%s%d", sep, i);
    else
      used += (size_t)snprintf(out + used, used < size ? size - used : 0, "%s%d-%d", sep, i, j);
    sep = ", ";
    i = j;
  }
  return used;
}

/* What r's ranks do now, by their last phases: "all 2 ranks training",
 * "rank 0 training, rank 1 tokenizing" (a rank not heard from yet counts
 * as starting). */
static void phases_reason(const run_t *r, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  bool *in = xcalloc((size_t)r->world, sizeof *in);
  for (int p = 0; p < REPORT_PHASE_COUNT; p++) {
    int n = 0;
    for (int i = 0; i < r->world; i++) {
      const srank_t *k = &r->ranks[i];
      in[i] = (int)(k->reported ? k->last.phase : REPORT_PHASE_STARTING) == p;
      n += in[i];
    }
    if (!n) continue;
    if (n == r->world && r->world > 1) {
      snprintf(out, size, "all %d ranks %s", r->world, report_phase_name(p));
      break;
    }
    if (used) used += (size_t)snprintf(out + used, used < size ? size - used : 0, ", ");
    used = append_ranks(out, size, used, in, r->world);
    used +=
        (size_t)snprintf(out + used, used < size ? size - used : 0, " %s", report_phase_name(p));
  }
  free(in);
}

void sched_note_report(sched_t *s, const char *id, const report_wire_t *rep, char *why,
                       size_t size) {
  if (why && size) why[0] = '\0';
  pthread_mutex_lock(&s->lock);
  for (run_t *r = s->runs; r; r = r->next) {
    if (strcmp(r->id, id) || r->attempt != rep->attempt || rep->rank >= r->world) continue;
    srank_t *k = &r->ranks[rep->rank];
    double now = ty_mono_s();
    k->last_report = now;
    if (!k->reported || report_wire_progressed(&k->last, rep)) {
      k->last_progress = now;
      k->last = *rep;
    }
    k->reported = true;
    if (rep->phase == REPORT_PHASE_FAILED && rep->message[0])
      snprintf(k->fail_msg, sizeof k->fail_msg, "%.*s", (int)sizeof k->fail_msg - 1, rep->message);
    if (why && size && !r->decided && !r->stopping) {
      char now_why[sizeof r->reason];
      phases_reason(r, now_why, sizeof now_why);
      if (strcmp(now_why, r->reason)) snprintf(why, size, "%s", now_why);
    }
  }
  pthread_mutex_unlock(&s->lock);
}

void sched_reason_written(sched_t *s, const char *id, int attempt, const char *why) {
  pthread_mutex_lock(&s->lock);
  for (run_t *r = s->runs; r; r = r->next)
    if (!strcmp(r->id, id) && r->attempt == attempt)
      snprintf(r->reason, sizeof r->reason, "%s", why);
  pthread_mutex_unlock(&s->lock);
}

/* SIGTERM to every live rank of r; SIGKILL follows after the grace period. */
static void begin_stop(sched_t *s, run_t *r) {
  if (r->stopping) return;
  r->stopping = true;
  r->kill_at = ty_mono_s() + s->cfg->grace;
  for (int i = 0; i < r->world; i++) {
    srank_t *k = &r->ranks[i];
    if (!k->started || k->exited) continue;
    k->signalled = true;
    s->disp->ops->signal(r->drun, i, SIGTERM);
  }
}

/* Decides a failed attempt: queued again while max_restarts allows, else
 * failed; then stops the ranks. */
static void fail_attempt(sched_t *s, run_t *r, const char *why) {
  if (!r->decided) {
    r->decided = true;
    char reason[1024];
    int to;
    const int restart = r->attempt - r->preempted_before;
    if (restart <= r->max_restarts) {
      to = DB_JOB_QUEUED;
      snprintf(reason, sizeof reason, "attempt %d failed: %s; retrying (restart %d of %d)",
               r->attempt, why, restart, r->max_restarts);
    } else {
      to = DB_JOB_FAILED;
      snprintf(reason, sizeof reason, "%s", why);
      if (r->max_restarts > 0)
        snprintf(reason, sizeof reason, "attempt %d failed: %s (max_restarts %d used up)",
                 r->attempt, why, r->max_restarts);
    }
    int rc = svc_transition(s->svc, r->id, DB_MASK_ACTIVE, to, reason, NULL, NULL);
    if (rc && rc != TY_EPRECONDITION)
      ty_error("job %s: cannot record the failure (%s): %s", r->id, ty_err_name(rc), reason);
  }
  begin_stop(s, r);
}

/* The ranks stopped on SIGTERM at a step boundary, a checkpoint written
 * (RANKPROC_EXIT_PREEMPTED): the job is queued again, and the next
 * attempt resumes from that checkpoint; this one does not count against
 * max_restarts. */
static void preempt_attempt(sched_t *s, run_t *r, int rank) {
  if (!r->decided) {
    r->decided = true;
    char reason[512];
    snprintf(reason, sizeof reason,
             "attempt %d preempted: rank %d stopped on SIGTERM after the ranks wrote a checkpoint "
             "together; resuming from it (a preemption does not count against max_restarts)",
             r->attempt, rank);
    int rc = svc_transition(s->svc, r->id, DB_MASK_ACTIVE, DB_JOB_QUEUED, reason, NULL, NULL);
    if (!rc) rc = db_attempt_set_preempted(svc_db(s->svc), r->id, r->attempt);
    if (rc && rc != TY_EPRECONDITION)
      ty_error("job %s: cannot record the preemption (%s)", r->id, ty_err_name(rc));
  }
  begin_stop(s, r);
}

/* Why a rank ended, from its wait status and its last failed report. */
static void exit_reason(const srank_t *k, int rank, char *out, size_t size, int *code) {
  if (WIFEXITED(k->status)) {
    *code = WEXITSTATUS(k->status);
    if (k->fail_msg[0])
      snprintf(out, size, "rank %d failed: %s", rank, k->fail_msg);
    else
      snprintf(out, size, "rank %d exited with status %d", rank, *code);
  } else {
    int sig = WIFSIGNALED(k->status) ? WTERMSIG(k->status) : 0;
    *code = 128 + sig;
    snprintf(out, size, "rank %d was killed by signal %d (%s)%s%s", rank, sig, strsignal(sig),
             k->fail_msg[0] ? ": " : "", k->fail_msg);
  }
}

/* Learns from the dispatcher which ranks have ended. */
static void reap(sched_t *s) {
  for (run_t *r = s->runs; r; r = r->next)
    for (int i = 0; i < r->world; i++) {
      srank_t *k = &r->ranks[i];
      if (k->started && !k->exited && s->disp->ops->ended(r->drun, i, &k->status)) {
        k->exited = true;
        /* What the engine saw (a time limit, a failed node) where the
         * rank itself said nothing. */
        if (!k->fail_msg[0] && s->disp->ops->why)
          s->disp->ops->why(r->drun, i, k->fail_msg, sizeof k->fail_msg);
      }
    }
}

/* What the log pump of one rank needs to ingest the reports it prints. */
typedef struct {
  svc_t *svc;
  char id[DB_ID_MAX];
  char token[DB_TOKEN_MAX];
} line_ctx_t;

/* A rank that prints its reports as JSON lines (no report URL used) is
 * heard all the same: each such line is a report, with the job's token. */
static void on_report_line(void *ctx, int rank, const char *line) {
  (void)rank; /* the report names its rank */
  line_ctx_t *c = ctx;
  json_t *o = json_loads(line, 0, NULL);
  if (json_is_object(o) && json_object_get(o, "phase")) {
    ty_errlist_t errs = TY_ERRLIST_INIT;
    svc_report(c->svc, c->id, c->token, o, &errs, NULL, 0);
    ty_errlist_clear(&errs);
  }
  json_decref(o);
}

static void write_spec_file(const char *path, const char *spec) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(spec, f);
  fputc('\n', f);
  fclose(f);
}

/* How often a rank repeats its last report while it computes
 * (RANKENV_HEARTBEAT_MS): four times per heartbeat_timeout, so that a load
 * or a step longer than the timeout is not taken for a dead rank, while one
 * lost repeat is not taken for one either. */
static int heartbeat_ms(const srv_config_t *cfg) {
  double ms = cfg->heartbeat_timeout * 1000.0 / 4.0;
  return ms < 10 ? 10 : (int)ms;
}

/* The start of a job could not be written: no start is tried again before
 * a backoff (0.1 s doubling to 5 s), and the server says why it is not
 * healthy, once. */
static void start_failed(sched_t *s, const db_job_t *j, int rc) {
  s->start_backoff = s->start_backoff ? s->start_backoff * 2 : 0.1;
  if (s->start_backoff > 5) s->start_backoff = 5;
  s->start_at = ty_mono_s() + s->start_backoff;
  char err[512], cause[800];
  db_last_error(svc_db(s->svc), err, sizeof err);
  snprintf(cause, sizeof cause,
           "queued jobs cannot be started: the start of job %s could not be written (%s: %s); "
           "retrying",
           j->id, ty_err_name(rc), err);
  svc_start_blocked(s->svc, cause);
}

/* Job j's spec (its stored, normalized JSON) into *spec: what the attempt's
 * rendezvous and a cluster engine's request are made from. */
static void job_spec(const db_job_t *j, jobspec_t *spec) {
  jobspec_init(spec);
  json_t *sj = json_loads(j->spec, 0, NULL);
  ty_errlist_t serr = TY_ERRLIST_INIT;
  if (sj) jobspec_from_json(spec, sj, &serr);
  ty_errlist_clear(&serr);
  json_decref(sj);
}

/* A run of job j's attempt in s->runs, its ranks counted against the CPU
 * slots or the GPUs (the caller holds s->lock); its output folder not yet
 * locked. */
static run_t *run_add(sched_t *s, const db_job_t *j, int attempt) {
  run_t *r = xcalloc(1, sizeof *r);
  snprintf(r->id, sizeof r->id, "%s", j->id);
  r->attempt = attempt;
  r->world = j->world_size;
  r->max_restarts = j->max_restarts;
  db_job_preemptions(svc_db(s->svc), j->id, &r->preempted_before);
  r->gpu = !strcmp(j->device, "cuda");
  r->ranks = xcalloc((size_t)r->world, sizeof *r->ranks);
  r->out_lock = -1;
  r->out_dir = j->output_dir && j->output_dir[0] ? xstrdup(j->output_dir) : NULL;
  r->next = s->runs;
  s->runs = r;
  if (r->gpu)
    s->gpu_used += r->world;
  else
    s->cpu_used += r->world;
  return r;
}

/* Claims the slots of job j's attempt: a run in s->runs, its ranks' CPU
 * slots or GPUs (each rank its own free GPU). */
static run_t *claim_slots(sched_t *s, const db_job_t *j, int attempt) {
  run_t *r = run_add(s, j, attempt);
  for (int i = 0; i < r->world; i++) {
    r->ranks[i].gpu = -1;
    for (int g = 0; r->gpu && !s->disp->ops->queues && g < s->cfg->gpus && g < 64; g++)
      if (!(s->gpu_busy & (1ull << g))) {
        s->gpu_busy |= 1ull << g;
        r->ranks[i].gpu = g;
        break;
      }
  }
  return r;
}

/* Where an attempt's files are: its folder, the job's spec file, the
 * report URL and each rank's log. */
typedef struct {
  char dir[2048];
  char spec_path[2200];
  char url[512];
  char gloo_dir[2100]; /* "" unless the ranks meet over Gloo */
  char (*log_paths)[2300];
  const char **log_ptrs;
  int *gpus;
} attempt_files_t;

static void attempt_files_free(attempt_files_t *f) {
  free(f->log_paths);
  free(f->log_ptrs);
  free(f->gpus);
}

/* Prepares run r's attempt of job j: where its ranks meet (r->rdv: GPU
 * ranks through NCCL, CPU ranks through this host's shared memory, or over
 * TCP (Gloo) where the spec asks, exchanging addresses through files in the
 * attempt's folder, or where a batch system places them, through this
 * server's rendezvous keys), the attempt's folder, the spec file and the output
 * folder's lock. 0, or a TY_E* code with the reason in msg. */
static int prepare_attempt(sched_t *s, const db_job_t *j, const jobspec_t *spec, run_t *r,
                           attempt_files_t *f, char *msg, size_t msgsz) {
  snprintf(f->dir, sizeof f->dir, "%s/jobs/%s/attempt-%d", s->cfg->state_dir, j->id, r->attempt);
  snprintf(f->spec_path, sizeof f->spec_path, "%s/jobs/%s/spec.json", s->cfg->state_dir, j->id);
  snprintf(f->url, sizeof f->url, "%s/v1/internal/jobs/%s/report", s->url_base, j->id);
  f->gloo_dir[0] = '\0';
  if (r->gpu) {
    snprintf(r->rdv, sizeof r->rdv, "nccl:file:%s/nccl.id", f->dir);
  } else if (s->disp->ops->queues) {
    /* A batch system may place the ranks on several hosts: shm reaches
     * none but its own, and they meet through this server's rendezvous
     * keys (no shared folder needed for it). */
    snprintf(r->rdv, sizeof r->rdv, "gloo:http:%s/v1/jobs/%s/attempts/%d/rendezvous", s->url_base,
             j->id, r->attempt);
  } else if (spec->dist.backend == JOBSPEC_DIST_GLOO) {
    snprintf(f->gloo_dir, sizeof f->gloo_dir, "%s/gloo", f->dir);
    snprintf(r->rdv, sizeof r->rdv, "gloo:file:%s", f->gloo_dir);
  } else {
    ty_shm_server_rendezvous(j->id, r->attempt, r->rdv, sizeof r->rdv);
  }
  f->log_paths = xcalloc((size_t)r->world, sizeof *f->log_paths);
  f->log_ptrs = xcalloc((size_t)r->world, sizeof *f->log_ptrs);
  f->gpus = xcalloc((size_t)r->world, sizeof *f->gpus);
  for (int i = 0; i < r->world; i++) {
    snprintf(f->log_paths[i], sizeof f->log_paths[i], "%s/rank-%d.log", f->dir, i);
    f->log_ptrs[i] = f->log_paths[i];
    f->gpus[i] = r->ranks[i].gpu;
  }
  int mk = ty_mkdirs(f->dir, msg, msgsz);
  if (!mk && f->gloo_dir[0]) mk = ty_mkdirs(f->gloo_dir, msg, msgsz);
  if (!mk) write_spec_file(f->spec_path, j->spec);
  /* The output folder is this attempt's alone, also against runs that the
   * database does not know (a `trainyard train`, another trainyardd). */
  if (!mk && j->output_dir[0]) {
    r->out_lock = ty_dir_lock(j->output_dir, msg, msgsz);
    if (r->out_lock == TY_EPRECONDITION)
      snprintf(msg, msgsz,
               "output_dir %s is in use by another trainyard run on this host (a `trainyard "
               "train`, or another trainyardd); wait for it to end, or submit the job again "
               "with another output_dir",
               j->output_dir);
    if (r->out_lock < 0) mk = r->out_lock;
  }
  return mk;
}

/* Starts run r's ranks through the dispatcher and records each one that
 * started; *started receives their number. 0, or the dispatcher's code
 * with the reason in msg. */
static int spawn_ranks(sched_t *s, const db_job_t *j, const jobspec_t *spec, run_t *r,
                       const attempt_files_t *f, int *started, char *msg, size_t msgsz) {
  line_ctx_t *lc = xcalloc(1, sizeof *lc);
  lc->svc = s->svc;
  snprintf(lc->id, sizeof lc->id, "%s", j->id);
  snprintf(lc->token, sizeof lc->token, "%s", j->token);
  /* What a cluster engine asks for: the spec's resources and the memory
   * rules' bound of a rank. */
  const int nodes = spec->resources.nodes >= 1 ? spec->resources.nodes : 1;
  const int rpn =
      spec->resources.ranks_per_node >= 1 ? spec->resources.ranks_per_node : r->world / nodes;
  dispatch_attempt_t a = {
      .worker = s->worker,
      .job_name = j->name,
      .dir = f->dir,
      .nodes = nodes,
      .ranks_per_node = rpn,
      .cuda = r->gpu,
      .mem_mib_per_rank = (int64_t)((jobspec_rank_host_bytes(spec) + (1u << 20) - 1) >> 20),
      .grace_s = s->cfg->grace < 1 ? 1 : (int)(s->cfg->grace + 0.5),
      .spec_path = f->spec_path,
      .job_id = j->id,
      .attempt = r->attempt,
      .world_size = r->world,
      .rendezvous = r->rdv,
      .report_url = f->url,
      .token = j->token,
      .gpus = f->gpus,
      .log_paths = f->log_ptrs,
      .log_max = s->cfg->log_max,
      .gpu_mem_limit_mib = s->cfg->gpu_mem_limit_mib,
      .heartbeat_ms = heartbeat_ms(s->cfg),
      .on_line = on_report_line,
      .line_ctx = lc};
  *started = 0;
  int rc = s->disp->ops->start(s->disp, &a, &r->drun, started, msg, msgsz);
  double now = ty_mono_s();
  for (int i = 0; i < *started; i++) {
    srank_t *k = &r->ranks[i];
    k->started = true;
    k->last_report = k->last_progress = now;
    report_wire_init(&k->last);
    int pid;
    int64_t ticks;
    s->disp->ops->where(r->drun, i, &pid, &ticks);
    svc_rank_spawned(s->svc, j->id, r->attempt, i, pid, ticks, f->log_paths[i]);
  }
  return rc;
}

/* Job j's next attempt: queued -> starting, its slots claimed, its folder
 * prepared, its ranks spawned; an attempt that cannot start fails with the
 * reason (and is retried as any failed attempt). 0, or the transition's
 * code when the job was no longer queued. */
static int start_attempt(sched_t *s, const db_job_t *j) {
  int attempt;
  char why[128];
  snprintf(why, sizeof why, "%d %s slot%s free: starting the ranks", j->world_size,
           !strcmp(j->device, "cuda") ? "GPU" : "CPU", j->world_size == 1 ? "" : "s");
  int moved = svc_transition_now(s->svc, j->id, DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING, why, NULL,
                                 &attempt);
  if (moved) return moved;
  s->start_backoff = 0;
  svc_start_blocked(s->svc, NULL);
  run_t *r = claim_slots(s, j, attempt);
  attempt_files_t f = {0};
  char msg[2600];
  int started = 0;
  jobspec_t spec;
  job_spec(j, &spec);
  int rc = prepare_attempt(s, j, &spec, r, &f, msg, sizeof msg);
  if (!rc) rc = spawn_ranks(s, j, &spec, r, &f, &started, msg, sizeof msg);
  if (rc) {
    char reason[2700];
    snprintf(reason, sizeof reason, "cannot start rank %d: %s", started, msg);
    fail_attempt(s, r, reason);
  }
  attempt_files_free(&f);
  return 0;
}

int sched_adopt(sched_t *s, const char *id, int attempt, int pid, int64_t start_ticks) {
  db_job_t *j = NULL;
  int rc = db_job_get(svc_db(s->svc), id, &j);
  if (rc) return rc;
  dispatch_run_t *drun =
      s->disp->ops->adopt ? s->disp->ops->adopt(s->disp, pid, start_ticks, j->world_size) : NULL;
  if (!drun) {
    db_job_free(j);
    return TY_EUNAVAILABLE;
  }
  pthread_mutex_lock(&s->lock);
  run_t *r = run_add(s, j, attempt);
  r->drun = drun;
  if (r->out_dir) r->out_lock = ty_dir_lock(r->out_dir, NULL, 0);
  if (r->out_lock < 0) r->out_lock = -1;
  snprintf(r->rdv, sizeof r->rdv, "gloo:file:%s/jobs/%s/attempt-%d/gloo", s->cfg->state_dir, j->id,
           attempt);
  const double now = ty_mono_s();
  for (int i = 0; i < r->world; i++) {
    srank_t *k = &r->ranks[i];
    k->started = true;
    k->gpu = -1;
    k->last_report = k->last_progress = now;
    report_wire_init(&k->last);
  }
  pthread_mutex_unlock(&s->lock);
  db_job_free(j);
  return 0;
}

/* Whether an attempt of job id still has ranks to stop or reap (the caller
 * holds s->lock). */
static bool job_has_run(const sched_t *s, const char *id) {
  for (const run_t *r = s->runs; r; r = r->next)
    if (!strcmp(r->id, id)) return true;
  for (const run_t *r = s->ending; r; r = r->next)
    if (!strcmp(r->id, id)) return true; /* only its id is read: tick is releasing it */
  return false;
}

/* Whether a run of this scheduler still has dir as its output folder: its
 * ranks may still write it, and it holds the folder's lock until they are
 * reaped. */
static bool dir_has_run(const sched_t *s, const char *dir) {
  if (!dir || !dir[0]) return false;
  for (const run_t *r = s->runs; r; r = r->next)
    if (r->out_dir && !strcmp(r->out_dir, dir)) return true;
  for (const run_t *r = s->ending; r; r = r->next)
    if (r->out_dir && !strcmp(r->out_dir, dir)) return true;
  return false;
}

bool sched_has_run(sched_t *s, const char *id) {
  pthread_mutex_lock(&s->lock);
  bool has = job_has_run(s, id);
  pthread_mutex_unlock(&s->lock);
  return has;
}

/* Starts queued jobs, oldest first, while the oldest fits the free slots
 * (strict FIFO: a large job at the head is never overtaken). A job queued
 * again after a failed attempt waits until that attempt's ranks are gone:
 * they may still be writing its output folder; so does a job whose output
 * folder is that of a run still stopping (a cancelled job's, say), which
 * holds the folder's lock until its ranks are reaped. */
static void start_queued(sched_t *s) {
  if (s->start_backoff && ty_mono_s() < s->start_at) return;
  for (;;) {
    db_job_t **jobs;
    size_t n;
    if (db_job_list_fifo(svc_db(s->svc), DB_MASK(DB_JOB_QUEUED), 0, 1, &jobs, &n)) return;
    if (n == 0) {
      db_jobs_free(jobs, n);
      if (s->start_backoff) {
        s->start_backoff = 0; /* nothing left to start */
        svc_start_blocked(s->svc, NULL);
      }
      return;
    }
    db_job_t *j = jobs[0];
    bool gpu = !strcmp(j->device, "cuda");
    int64_t free_slots = gpu ? s->cfg->gpus - s->gpu_used : s->cfg->cpu_slots - s->cpu_used;
    bool go = (s->disp->ops->queues || j->world_size <= free_slots) && !job_has_run(s, j->id) &&
              !dir_has_run(s, j->output_dir);
    int rc = go ? start_attempt(s, j) : 0;
    /* A start that could not be written is tried again after a backoff,
     * never at once: the job is still queued and first in line. */
    if (rc && rc != TY_EPRECONDITION && rc != TY_ENOTFOUND) {
      start_failed(s, j, rc);
      go = false;
    }
    db_jobs_free(jobs, n);
    if (!go) return;
  }
}

/* Everything one tick does for one run; returns true when it is over (every
 * rank exited and recorded) and can be freed. */
static bool step_run(sched_t *s, run_t *r, double now) {
  int live = 0;
  for (int i = 0; i < r->world; i++) {
    srank_t *k = &r->ranks[i];
    if (!k->started) continue;
    if (!k->exited) {
      live++;
      continue;
    }
    if (k->recorded) continue;
    k->recorded = true;
    char why[800];
    int code;
    exit_reason(k, i, why, sizeof why, &code);
    bool ok = WIFEXITED(k->status) && code == 0;
    bool preempted = WIFEXITED(k->status) && code == RANKPROC_EXIT_PREEMPTED;
    if (preempted)
      snprintf(why, sizeof why,
               "rank %d stopped on SIGTERM at a checkpoint or before its first step (preempted)",
               i);
    const char *state = ok ? "exited" : (k->signalled || preempted ? "stopped" : "failed");
    svc_rank_finished(s->svc, r->id, r->attempt, i, state, code, ok ? "" : why);
    if (preempted && !r->decided) preempt_attempt(s, r, i);
    if (!ok && !r->decided) fail_attempt(s, r, why);
  }
  /* Ranks that a batch system still holds in its queue say nothing: their
   * silence starts when they do. */
  if (!r->decided && !r->stopping && r->drun && s->disp->ops->waiting &&
      s->disp->ops->waiting(r->drun))
    for (int i = 0; i < r->world; i++) r->ranks[i].last_report = r->ranks[i].last_progress = now;
  if (!r->decided && !r->stopping) {
    for (int i = 0; i < r->world && !r->decided; i++) {
      srank_t *k = &r->ranks[i];
      if (!k->started || k->exited) continue;
      char why[256];
      if (now - k->last_report > s->cfg->heartbeat_timeout) {
        snprintf(why, sizeof why, "rank %d sent no report for %.1f s (heartbeat_timeout)", i,
                 now - k->last_report);
        fail_attempt(s, r, why);
      } else if (now - k->last_progress > s->cfg->progress_timeout) {
        snprintf(why, sizeof why,
                 "rank %d made no progress for %.1f s (phase %s, step %lld; progress_timeout)", i,
                 now - k->last_progress, report_phase_name(k->last.phase), (long long)k->last.step);
        fail_attempt(s, r, why);
      }
    }
  }
  if (r->stopping && !r->killed && now >= r->kill_at) {
    r->killed = true;
    for (int i = 0; i < r->world; i++)
      if (r->ranks[i].started && !r->ranks[i].exited) {
        ty_warn("job %s rank %d ignored SIGTERM for %.1f s: SIGKILL", r->id, i, s->cfg->grace);
        s->disp->ops->signal(r->drun, i, SIGKILL);
      }
  }
  if (live) return false;
  if (!r->decided) {
    char why[128];
    snprintf(why, sizeof why, "all %d rank%s finished", r->world, r->world == 1 ? "" : "s");
    r->decided = true;
    svc_transition(s->svc, r->id, DB_MASK_ACTIVE, DB_JOB_SUCCEEDED, why, NULL, NULL);
  }
  /* Stragglers a rank left behind get the same end. */
  if (r->drun) s->disp->ops->clear(r->drun);
  return true;
}

static void handle_cancels(sched_t *s) {
  while (s->cancels) {
    cancel_req_t *c = s->cancels;
    s->cancels = c->next;
    for (run_t *r = s->runs; r; r = r->next)
      if (!strcmp(r->id, c->id)) {
        r->decided = true; /* the service already wrote cancelled */
        begin_stop(s, r);
      }
    free(c);
  }
}

/* Called with s->lock held; drops it while joining the log pumps of ended
 * runs, since a pump may be waiting for the lock to pass on a report. */
static void tick(sched_t *s) {
  /* Reports are group-committed; none waits longer than a tick. */
  db_flush(svc_db(s->svc));
  svc_tick(s->svc);
  handle_cancels(s);
  reap(s);
  double now = ty_mono_s();
  run_t *ended = NULL;
  for (run_t **pp = &s->runs; *pp;) {
    run_t *r = *pp;
    if (step_run(s, r, now)) {
      *pp = r->next;
      if (r->gpu)
        s->gpu_used -= r->world;
      else
        s->cpu_used -= r->world;
      for (int i = 0; i < r->world; i++)
        if (r->ranks[i].gpu >= 0) s->gpu_busy &= ~(1ull << r->ranks[i].gpu);
      r->next = ended;
      ended = r;
    } else {
      pp = &r->next;
    }
  }
  if (ended) {
    s->ending = ended; /* still this job's run for sched_has_run */
    pthread_mutex_unlock(&s->lock);
    for (run_t *r = ended; r; r = r->next) {
      s->disp->ops->release(r->drun);
      r->drun = NULL;
      /* Ranks unlink the segment once all have joined; one that died
       * before that leaves it, so the attempt's end removes it. */
      if (!r->gpu) ty_shm_remove(r->rdv);
      /* A checkpoint a killed rank was writing: a next attempt's ranks
       * would remove it, and after the last nobody else would. */
      if (r->out_lock >= 0) recovery_remove_unfinished(r->out_dir, r->id);
      if (r->out_lock >= 0) close(r->out_lock);
    }
    pthread_mutex_lock(&s->lock);
    s->ending = NULL;
    while (ended) {
      run_t *r = ended;
      ended = r->next;
      free(r->out_dir);
      free(r->ranks);
      free(r);
    }
  }
  if (!s->quit) start_queued(s);
}

static void *sched_main(void *arg) {
  sched_t *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    tick(s);
    if (s->quit && !s->runs) break;
    if (!s->wake) {
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_nsec += (long)(TICK_S * 1e9);
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&s->cond, &s->lock, &until);
    }
    s->wake = false;
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

int sched_start(sched_t *s) {
  if (pthread_create(&s->thread, NULL, sched_main, s)) return TY_EINTERNAL;
  s->started = true;
  return 0;
}

void sched_shutdown(sched_t *s) {
  if (!s->started) return;
  pthread_mutex_lock(&s->lock);
  s->quit = true;
  for (run_t *r = s->runs; r; r = r->next) {
    char why[160];
    snprintf(why, sizeof why, "trainyardd shut down while attempt %d ran; its ranks were stopped",
             r->attempt);
    fail_attempt(s, r, why);
  }
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  s->started = false;
}

void sched_free(sched_t *s) {
  if (!s) return;
  while (s->cancels) {
    cancel_req_t *c = s->cancels;
    s->cancels = c->next;
    free(c);
  }
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
}
