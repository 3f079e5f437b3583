/* service.c - the service layer of trainyardd; see service.h. Every job
 * state change passes through svc_transition (db_job_transition). */
#include "server/service.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/report_wire.h"
#include "common/beneath.h"
#include "common/clock.h"
#include "common/fsutil.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/rankenv.h"
#include "common/xalloc.h"
#include "server/gpu_info.h"
#include "server/health.h"
#include "server/pending.h"
#include "server/scheduler.h"
#include "server/token.h"

#define PAGE_DEFAULT 50
#define ROOTS_MAX 32
#define JOB_CACHE 1024 /* slots of rendered job JSON (direct-mapped by id) */

/* One rendered job. A job's row changes only in svc_transition, which
 * invalidates its slot; gen orders an invalidation against a render that
 * read the row before it. */
typedef struct {
  char id[DB_ID_MAX];
  char *text;   /* owned; NULL when empty */
  size_t len;
  uint64_t gen; /* bumped on every invalidation of this slot */
} job_cache_t;

struct svc {
  const srv_config_t *cfg;
  db_t *db;
  sched_t *sched;
  pthread_mutex_t ev_lock;
  pthread_cond_t ev_cond;
  uint64_t ev_gen;             /* bumped on every new event (under ev_lock) */
  atomic_llong reports_ok, reports_bad;
  char *roots_buf, *out_roots_buf; /* storage of the root lists below */
  const char *read_roots[2 * ROOTS_MAX + 1];
  const char *write_roots[ROOTS_MAX + 1];
  pthread_mutex_t cache_lock;
  job_cache_t cache[JOB_CACHE];
  uint64_t host_mem_total; /* MemTotal, read once: what CPU jobs must fit */
  uint64_t gpu_mem_total;  /* the largest GPU's memory (NVML), or 0: what GPU ranks must fit */
  health_t *health;        /* what keeps the server from its work now (/healthz) */
  pend_t *pend;            /* state changes kept until the database takes them */
  double file_checked_at;  /* ty_mono_s() of the last db_file_check */
};

/* Splits a colon-separated list in place into list (NULL-terminated, at
 * most max entries); returns the count. */
static size_t split_roots(char *buf, const char **list, size_t max) {
  size_t n = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ":", &save); tok && n < max;
       tok = strtok_r(NULL, ":", &save))
    list[n++] = tok;
  list[n] = NULL;
  return n;
}

/* The largest GPU's memory, from NVML, into s->gpu_mem_total (0 where NVML
 * cannot tell), saying what cuda jobs are then held to. */
static void gpu_memory(svc_t *s, const srv_config_t *cfg) {
  gpu_info_t gi;
  char why[160];
  if (gpu_info_query(&gi, why, sizeof why)) {
    ty_warn(
        "%s: cuda jobs are held to a GPU's memory only where --gpu_mem_limit_mib is set; "
        "a job over a GPU fails at load",
        why);
    return;
  }
  s->gpu_mem_total = gi.max_total;
  ty_info(
      "NVML: %d GPU%s, the largest with %.1f MiB: each GPU rank of a cuda job must fit it "
      "(rule device-memory)",
      gi.count, gi.count == 1 ? "" : "s", (double)gi.max_total / 1048576.0);
  if (gi.count < cfg->gpus)
    ty_warn("--gpus %lld, but NVML reports %d GPU%s", (long long)cfg->gpus, gi.count,
            gi.count == 1 ? "" : "s");
}

static void on_written(void *ctx, const pend_op_t *op);
static void refresh_store_health(svc_t *s);

int svc_open(const srv_config_t *cfg, svc_t **out, char *msg, size_t msgsz) {
  svc_t *s = xcalloc(1, sizeof *s);
  s->cfg = cfg;
  pthread_mutex_init(&s->ev_lock, NULL);
  pthread_mutex_init(&s->cache_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->ev_cond, &ca);
  pthread_condattr_destroy(&ca);
  /* Outputs may be read by later jobs, so the write roots are readable. */
  s->roots_buf = xstrdup(cfg->roots);
  s->out_roots_buf = xstrdup(cfg->output_roots);
  size_t nr = split_roots(s->roots_buf, s->read_roots, ROOTS_MAX);
  size_t nw = split_roots(s->out_roots_buf, s->write_roots, ROOTS_MAX);
  for (size_t i = 0; i < nw; i++) s->read_roots[nr + i] = s->write_roots[i];
  s->read_roots[nr + nw] = NULL;
  /* Jobs' files are reached only from handles on these roots, here and in
   * the ranks (common/beneath.h); a root made later counts after a restart. */
  long walk = 0;
  int brc = rankenv_long(RANKENV_BENEATH_WALK, &walk, msg, msgsz);
  if (!brc) brc = ty_beneath_set_roots(cfg->roots, cfg->output_roots, true, msg, msgsz);
  if (brc) {
    svc_close(s);
    return brc;
  }
  ty_beneath_force_walk(walk == 1);
  s->host_mem_total = jobspec_host_memory();
  if (cfg->gpus > 0) gpu_memory(s, cfg);
  /* A root that does not exist holds nothing until it does: say so now,
   * not only in the errors of the jobs it refuses. */
  for (size_t i = 0; i < nr + nw; i++) {
    char real[PATH_MAX];
    if (!realpath(s->read_roots[i], real))
      ty_warn(
          "root %s does not exist (%s): no job path lies inside it until it does and "
          "trainyardd is restarted",
          s->read_roots[i], strerror(errno));
  }
  int rc = db_open(cfg->db, &s->db, msg, msgsz);
  if (rc) {
    svc_close(s);
    return rc;
  }
  s->health = health_new();
  s->pend = pend_new(s->db, s->health, on_written, s);
  *out = s;
  return 0;
}

void svc_close(svc_t *s) {
  if (!s) return;
  if (s->pend) pend_retry(s->pend, true);
  pend_free(s->pend);
  health_free(s->health);
  db_close(s->db);
  pthread_mutex_destroy(&s->ev_lock);
  pthread_mutex_destroy(&s->cache_lock);
  for (int i = 0; i < JOB_CACHE; i++) free(s->cache[i].text);
  pthread_cond_destroy(&s->ev_cond);
  free(s->roots_buf);
  free(s->out_roots_buf);
  free(s);
}

void svc_set_scheduler(svc_t *s, sched_t *sched) { s->sched = sched; }
db_t *svc_db(svc_t *s) { return s->db; }
const srv_config_t *svc_config(svc_t *s) { return s->cfg; }

static void set_msg(char *msg, size_t msgsz, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_msg(char *msg, size_t msgsz, const char *fmt, ...) {
  if (!msg || !msgsz) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, msgsz, fmt, ap);
  va_end(ap);
}

static void notify(svc_t *s) {
  pthread_mutex_lock(&s->ev_lock);
  s->ev_gen++;
  pthread_cond_broadcast(&s->ev_cond);
  pthread_mutex_unlock(&s->ev_lock);
}

uint64_t svc_event_generation(svc_t *s) {
  pthread_mutex_lock(&s->ev_lock);
  uint64_t g = s->ev_gen;
  pthread_mutex_unlock(&s->ev_lock);
  return g;
}

uint64_t svc_wait_events(svc_t *s, uint64_t seen, double timeout_s) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  double t = until.tv_sec + until.tv_nsec / 1e9 + timeout_s;
  until.tv_sec = (time_t)t;
  until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
  pthread_mutex_lock(&s->ev_lock);
  while (s->ev_gen == seen)
    if (pthread_cond_timedwait(&s->ev_cond, &s->ev_lock, &until)) break;
  uint64_t g = s->ev_gen;
  pthread_mutex_unlock(&s->ev_lock);
  return g;
}

/* Makes a relative path absolute against the working directory. */
static void absolutize(char *path, size_t size) {
  if (!*path || path[0] == '/') return;
  char cwd[JOBSPEC_PATH_MAX], joined[2 * JOBSPEC_PATH_MAX + 2];
  if (!getcwd(cwd, sizeof cwd)) return;
  const char *rel = path;
  while (rel[0] == '.' && rel[1] == '/') rel += 2;
  snprintf(joined, sizeof joined, "%s/%s", cwd, rel);
  if (strlen(joined) < size) memcpy(path, joined, strlen(joined) + 1);
}

/* Replaces path with its resolved form (jobspec_resolve_path: links and
 * '..' followed): with partly true, also one whose end does not exist yet
 * (an output folder to be made); else only one that exists whole. */
static void resolve(char *path, size_t size, bool partly) {
  char res[PATH_MAX];
  if (!*path) return;
  if (partly ? jobspec_resolve_path(path, NULL, res) != 0 : !realpath(path, res)) return;
  if (strlen(res) < size) memcpy(path, res, strlen(res) + 1);
}

/* "cpu" or "cuda": what device auto means on this host. */
static const char *resolve_device(const svc_t *s, const jobspec_t *spec) {
  if (spec->device == JOBSPEC_DEVICE_CUDA) return "cuda";
  if (spec->device == JOBSPEC_DEVICE_CPU) return "cpu";
  return s->cfg->gpus > 0 ? "cuda" : "cpu";
}

/* The checks of the spec alone (jobspec_validate with the filesystem, the
 * roots, the devices, the slots), adding to errs; out_dir receives the
 * resolved output_dir (PATH_MAX bytes; "" when it has none), the key under
 * which a job's folder is stored, even when other fields are invalid, so
 * that validate names every problem at once. */
static void check_spec(svc_t *s, jobspec_t *spec, ty_errlist_t *errs, char *out_dir) {
  /* The rules read the files the ranks will read, as they will: resolved. */
  resolve(spec->model_path, sizeof spec->model_path, false);
  resolve(spec->data.path, sizeof spec->data.path, false);
  if (jobspec_validate(spec, true, errs) == 0) {
    /* Paths are checked and stored absolute: ranks may run elsewhere. */
    absolutize(spec->model_path, sizeof spec->model_path);
    absolutize(spec->data.path, sizeof spec->data.path);
    absolutize(spec->data.tokenizer, sizeof spec->data.tokenizer);
    absolutize(spec->output_dir, sizeof spec->output_dir);
    size_t before = errs->len;
    jobspec_roots_t roots = {s->read_roots, s->write_roots, NULL, out_dir};
    jobspec_check_roots(spec, &roots, errs);
    /* ...and stored resolved: a link made or swapped after this submit
     * is met by the ranks, which open these paths beneath the roots and
     * follow no link out of them. */
    if (errs->len == before) {
      resolve(spec->model_path, sizeof spec->model_path, true);
      resolve(spec->data.path, sizeof spec->data.path, true);
      resolve(spec->output_dir, sizeof spec->output_dir, true);
    }
    jobspec_check_nodes(spec, "the local dispatcher", strcmp(s->cfg->dispatcher, "local") != 0,
                        errs);
    /* The checks of this host's devices, memory and slots are the local
     * dispatcher's: a cluster's nodes are sized by its batch system, which
     * refuses a job asking more than they have. */
    const bool local = !strcmp(s->cfg->dispatcher, "local");
    if (local) jobspec_check_devices(spec, (int)s->cfg->gpus, errs);
    const char *device = resolve_device(s, spec);
    if (!local) {
      /* nodes-dispatcher and the rules above only */
    } else if (!strcmp(device, "cpu")) {
      const bool set = s->cfg->host_mem_mib > 0;
      jobspec_check_host_memory(spec, true,
                                set ? (uint64_t)s->cfg->host_mem_mib << 20 : s->host_mem_total,
                                set ? "--host_mem_mib" : "MemTotal", errs);
    } else {
      /* GPU ranks: their cap, or the largest GPU where NVML told its size
       * and no smaller cap is set (where neither is known, a job over a
       * GPU fails at load, naming the fix). */
      const uint64_t cap = (uint64_t)s->cfg->gpu_mem_limit_mib << 20;
      if (cap && (!s->gpu_mem_total || cap <= s->gpu_mem_total))
        jobspec_check_device_memory(spec, cap, "that --gpu_mem_limit_mib allows each GPU rank",
                                    "or a larger --gpu_mem_limit_mib", errs);
      else if (s->gpu_mem_total)
        jobspec_check_device_memory(spec, s->gpu_mem_total, "of this host's largest GPU (NVML)",
                                    "or GPUs with more memory", errs);
    }
    char why[256];
    if (local && sched_fits(s->cfg, device, spec->world_size, why, sizeof why))
      ty_errlist_add(errs, "world_size", "%s", why);
  } else if (!spec->output_dir[0] || jobspec_resolve_path(spec->output_dir, NULL, out_dir)) {
    out_dir[0] = '\0';
  }
}

/* The problem of a spec whose output folder an unfinished job holds. */
static void output_taken(ty_errlist_t *errs, const char *out_dir, const db_job_t *user) {
  ty_errlist_add(errs, "output_dir",
                 "%s is the output folder of job %s ('%s', %s), which has not finished; two "
                 "jobs in one folder overwrite each other's checkpoints and outputs: give this "
                 "job another output_dir (by default it is runs/<name>), or submit it once "
                 "that job has ended",
                 out_dir, user->id, user->name, db_state_name(user->state));
}

static int invalid(ty_errlist_t *errs, size_t before, char *msg, size_t msgsz) {
  if (errs->len == before) return 0;
  set_msg(msg, msgsz, "the job spec is invalid (%zu problem%s; see details)", errs->len - before,
          errs->len - before == 1 ? "" : "s");
  return TY_EINVAL;
}

int svc_validate(svc_t *s, jobspec_t *spec, ty_errlist_t *errs, char *msg, size_t msgsz) {
  size_t before = errs->len;
  char out_dir[PATH_MAX];
  check_spec(s, spec, errs, out_dir);
  db_job_t *user = NULL;
  if (out_dir[0] && db_job_output_user(s->db, out_dir, &user) == 0) {
    output_taken(errs, out_dir, user);
    db_job_free(user);
  }
  return invalid(errs, before, msg, msgsz);
}

/* 128 random bits as hex (2 * n + 1 bytes of out). */
static void random_hex(char *out, size_t nbytes) {
  unsigned char buf[32];
  if (nbytes > sizeof buf) nbytes = sizeof buf;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = fd >= 0 ? read(fd, buf, nbytes) : -1;
  if (fd >= 0) close(fd);
  if (got != (ssize_t)nbytes) {
    /* /dev/urandom is always there on Linux; a failure here is fatal. */
    ty_error("cannot read /dev/urandom");
    abort();
  }
  for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", buf[i]);
}

int svc_submit(svc_t *s, jobspec_t *spec, const char *idempotency_key, db_job_t **out,
               bool *created, ty_errlist_t *errs, char *msg, size_t msgsz) {
  *out = NULL;
  *created = false;
  /* The output folder is checked when the job is stored, after its
   * Idempotency-Key: a replay of a submit whose job runs is no conflict. */
  size_t before = errs->len;
  char out_dir[PATH_MAX];
  check_spec(s, spec, errs, out_dir);
  int rc = invalid(errs, before, msg, msgsz);
  if (rc) return rc;
  /* The database's own failures are not asked here: the submit's write
   * is itself the test of whether the disk takes writes again (a failed
   * one answers 503 naming the cause, below). */
  char why[1024];
  if (!health_ok_except(s->health, HEALTH_DB_STORE, why, sizeof why)) {
    set_msg(msg, msgsz, "this server cannot take jobs now: %s", why);
    return TY_EUNAVAILABLE;
  }
  if (idempotency_key && strlen(idempotency_key) > SVC_IDEMPOTENCY_KEY_MAX) {
    ty_errlist_add(errs, "Idempotency-Key", "at most %d characters, got %zu",
                   SVC_IDEMPOTENCY_KEY_MAX, strlen(idempotency_key));
    set_msg(msg, msgsz, "the Idempotency-Key header is too long");
    return TY_EINVAL;
  }
  db_job_t j = {0};
  char idhex[17];
  random_hex(idhex, 8);
  snprintf(j.id, sizeof j.id, "j-%s", idhex);
  random_hex(j.token, 32);
  j.name = spec->name;
  j.spec = jobspec_dumps(spec, false);
  j.idempotency_key = idempotency_key && *idempotency_key ? (char *)idempotency_key : NULL;
  j.world_size = spec->world_size;
  snprintf(j.device, sizeof j.device, "%s", resolve_device(s, spec));
  j.max_restarts = spec->max_restarts;
  j.output_dir = out_dir;
  db_job_t *existing = NULL;
  rc = db_job_insert(s->db, &j, &existing);
  if (rc == TY_EPRECONDITION) {
    output_taken(errs, out_dir, existing);
    db_job_free(existing);
    rc = invalid(errs, before, msg, msgsz);
  } else if (rc == TY_EEXISTS) {
    json_t *a = json_loads(existing->spec, 0, NULL), *b = json_loads(j.spec, 0, NULL);
    bool same = a && b && json_equal(a, b);
    json_decref(a);
    json_decref(b);
    if (same) {
      *out = existing;
      rc = 0;
    } else {
      set_msg(msg, msgsz,
              "Idempotency-Key '%s' was used for job %s with a different spec; use a new key "
              "for a new job",
              idempotency_key, existing->id);
      db_job_free(existing);
    }
  } else if (rc == 0) {
    *created = true;
    rc = db_job_get(s->db, j.id, out);
    ty_info("job %s (%s) queued: %d %s rank%s", j.id, spec->name, j.world_size, j.device,
            j.world_size == 1 ? "" : "s");
    notify(s);
    if (s->sched) sched_wake(s->sched);
  } else if (rc == TY_EUNAVAILABLE) {
    char err[512];
    db_last_error(s->db, err, sizeof err);
    set_msg(msg, msgsz, "this server cannot take jobs now: the job could not be stored (%s); "
            "nothing was kept: submit it again once the server is healthy (GET /healthz)", err);
    refresh_store_health(s);
  } else {
    set_msg(msg, msgsz, "the job could not be stored (see the server log)");
  }
  free(j.spec);
  free(j.reason);
  return rc;
}

int svc_get(svc_t *s, const char *id, db_job_t **out, char *msg, size_t msgsz) {
  int rc = db_job_get(s->db, id, out);
  if (rc == TY_ENOTFOUND) set_msg(msg, msgsz, "no job with id '%s'", id);
  return rc;
}

static job_cache_t *cache_slot(svc_t *s, const char *id) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return &s->cache[h % JOB_CACHE];
}

static void cache_invalidate(svc_t *s, const char *id) {
  pthread_mutex_lock(&s->cache_lock);
  job_cache_t *c = cache_slot(s, id);
  c->gen++;
  if (!strcmp(c->id, id)) {
    free(c->text);
    c->text = NULL;
    c->id[0] = '\0';
  }
  pthread_mutex_unlock(&s->cache_lock);
}

int svc_get_text(svc_t *s, const char *id, char **text, size_t *len, char *msg, size_t msgsz) {
  *text = NULL;
  pthread_mutex_lock(&s->cache_lock);
  job_cache_t *c = cache_slot(s, id);
  uint64_t gen = c->gen;
  if (c->text && !strcmp(c->id, id)) {
    *len = c->len;
    *text = xmalloc(c->len + 1);
    memcpy(*text, c->text, c->len + 1);
  }
  pthread_mutex_unlock(&s->cache_lock);
  if (*text) return 0;
  db_job_t *j;
  int rc = svc_get(s, id, &j, msg, msgsz);
  if (rc) return rc;
  json_t *o = svc_job_view(s, j);
  db_job_free(j);
  char *body = ty_json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!body) return TY_EINTERNAL;
  *len = strlen(body);
  *text = xrealloc(body, *len + 2);
  (*text)[(*len)++] = '\n';
  (*text)[*len] = '\0';
  if (strlen(id) < DB_ID_MAX) {
    pthread_mutex_lock(&s->cache_lock);
    if (c->gen == gen) { /* no state change since the row was read */
      free(c->text);
      snprintf(c->id, sizeof c->id, "%s", id);
      c->text = xmalloc(*len + 1);
      memcpy(c->text, *text, *len + 1);
      c->len = *len;
    }
    pthread_mutex_unlock(&s->cache_lock);
  }
  return 0;
}

int svc_list(svc_t *s, const char *states, int64_t page_size, const char *page_token,
             db_job_t ***out, size_t *n, char **next_token, ty_errlist_t *errs, char *msg,
             size_t msgsz) {
  *out = NULL;
  *n = 0;
  *next_token = NULL;
  unsigned mask = 0;
  if (states && *states) {
    char *copy = xstrdup(states);
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
      int st = db_state_parse(tok);
      if (st < 0)
        ty_errlist_add(errs, "state",
                       "unknown state '%s' (use queued, starting, running, succeeded, failed or "
                       "cancelled, comma-separated)",
                       tok);
      else
        mask |= DB_MASK(st);
    }
    free(copy);
  }
  if (page_size < 0 || page_size > s->cfg->page_max)
    ty_errlist_add(errs, "page_size",
                   "must be between 1 and %lld (0 or unset: the default, %d), got %lld",
                   (long long)s->cfg->page_max,
                   PAGE_DEFAULT < s->cfg->page_max ? PAGE_DEFAULT : (int)s->cfg->page_max,
                   (long long)page_size);
  int64_t before = 0;
  if (page_token && *page_token) {
    char *end = NULL;
    errno = 0;
    /* "p" and at most 16 hex digits: a longer one would overflow. */
    long long v = page_token[0] == 'p' && strlen(page_token) <= 17 && isxdigit(page_token[1])
                      ? strtoll(page_token + 1, &end, 16)
                      : -1;
    if (v <= 0 || errno == ERANGE || !end || *end)
      ty_errlist_add(errs, "page_token",
                     "not a page token of this server (pass next_page_token unchanged)");
    before = v;
  }
  if (errs->len) {
    set_msg(msg, msgsz, "invalid list request (see details)");
    return TY_EINVAL;
  }
  int limit = page_size ? (int)page_size : PAGE_DEFAULT;
  if (limit > s->cfg->page_max) limit = (int)s->cfg->page_max;
  /* One more row than asked tells whether a next page exists. */
  int rc = db_job_list(s->db, mask, before, limit + 1, out, n);
  if (rc) return rc;
  if (*n > (size_t)limit) {
    db_job_free((*out)[limit]);
    *n = (size_t)limit;
    char tok[32];
    snprintf(tok, sizeof tok, "p%llx", (unsigned long long)(*out)[limit - 1]->seq);
    *next_token = xstrdup(tok);
  }
  return 0;
}

int svc_cancel(svc_t *s, const char *id, const char *reason, db_job_t **out, ty_errlist_t *errs,
               char *msg, size_t msgsz) {
  if (out) *out = NULL;
  size_t n = reason ? strlen(reason) : 0;
  if (n > SVC_CANCEL_REASON_MAX) {
    ty_errlist_add(errs, "reason", "at most %d bytes, got %zu; say it shorter",
                   SVC_CANCEL_REASON_MAX, n);
    set_msg(msg, msgsz, "invalid cancel request");
    return TY_EINVAL;
  }
  char why[SVC_CANCEL_REASON_MAX + 32];
  snprintf(why, sizeof why, "cancelled by a client%s%s", n ? ": " : "", n ? reason : "");
  int cur;
  int rc = svc_transition_now(s, id, DB_MASK(DB_JOB_QUEUED) | DB_MASK_ACTIVE, DB_JOB_CANCELLED, why,
                              &cur, NULL);
  if (rc == TY_ENOTFOUND) {
    set_msg(msg, msgsz, "no job with id '%s'", id);
    return rc;
  }
  if (rc == TY_EPRECONDITION && cur == DB_JOB_CANCELLED) rc = 0;
  if (rc == TY_EPRECONDITION) {
    set_msg(msg, msgsz, "job %s already %s; only queued or running jobs can be cancelled", id,
            db_state_name(cur));
    return rc;
  }
  if (rc) {
    char err[512];
    db_last_error(s->db, err, sizeof err);
    set_msg(msg, msgsz, "the cancel could not be written (%s); nothing changed: try again", err);
    return rc;
  }
  if ((DB_MASK_ACTIVE & DB_MASK(cur)) && s->sched) sched_cancel(s->sched, id);
  return out ? db_job_get(s->db, id, out) : 0;
}

int svc_delete(svc_t *s, const char *id, db_job_t **out, char *msg, size_t msgsz) {
  if (out) *out = NULL;
  db_job_t *j = NULL;
  db_job_brief_t b;
  int rc = db_job_brief(s->db, id, &b);
  /* The scheduler lets go of an attempt only after its ranks are reaped,
   * recorded and their log pumps joined; db_job_delete checks the state
   * again, in its transaction. */
  bool stopping = false;
  if (!rc && db_state_final(b.state) &&
      ((stopping = s->sched && sched_has_run(s->sched, id)) || pend_has_job(s->pend, id)))
    rc = TY_EUNAVAILABLE;
  if (!rc) {
    cache_invalidate(s, id);
    rc = db_job_delete(s->db, id, &j);
    cache_invalidate(s, id);
    if (j) b.state = j->state;
  }
  if (rc == TY_ENOTFOUND) set_msg(msg, msgsz, "no job with id '%s'", id);
  if (rc == TY_EPRECONDITION)
    set_msg(msg, msgsz,
            "job %s is %s; only a job that has ended (succeeded, failed or cancelled) can be "
            "deleted: cancel it first",
            id, db_state_name(b.state));
  char why[1024];
  if (rc == TY_EUNAVAILABLE && !stopping && !svc_health(s, why, sizeof why))
    set_msg(msg, msgsz, "job %s cannot be deleted now: %s; delete it again later", id, why);
  else if (rc == TY_EUNAVAILABLE)
    set_msg(msg, msgsz,
            "job %s has ended but its ranks are still being stopped (at most the %.0f s grace "
            "period); delete it again once they have",
            id, s->cfg->grace);
  if (rc) {
    db_job_free(j);
    return rc;
  }
  char dir[PATH_MAX], err[PATH_MAX + 128];
  snprintf(dir, sizeof dir, "%s/jobs/%s", s->cfg->state_dir, id);
  if (ty_rmtree(dir, err, sizeof err))
    ty_warn("job %s deleted, but not all of its files: %s", id, err);
  ty_info("job %s deleted (%s, %s); its output_dir %s is left as it is", id, j->name,
          db_state_name(j->state), *j->output_dir ? j->output_dir : "(none)");
  notify(s);
  if (out)
    *out = j;
  else
    db_job_free(j);
  return 0;
}

/* Parses a report (api/report_wire.h) into *w, and *r as the database
 * keeps it, adding one error per bad field. */
static void report_from_json(const json_t *o, report_wire_t *w, db_report_t *r,
                             ty_errlist_t *errs) {
  memset(r, 0, sizeof *r);
  if (report_wire_parse(o, w, errs)) return;
  r->attempt = w->attempt, r->rank = w->rank, r->world_size = w->world_size;
  snprintf(r->phase, sizeof r->phase, "%s", report_phase_name(w->phase));
  r->step = w->step, r->total_steps = w->total_steps;
  r->loss = w->loss, r->tokens_per_s = w->tokens_per_s;
  r->bytes_loaded = w->bytes_loaded, r->bytes_total = w->bytes_total;
  r->host_peak_bytes = w->host_peak_bytes, r->device_peak_bytes = w->device_peak_bytes;
  r->load_seconds = w->load_seconds;
  memcpy(r->dpo, w->dpo, sizeof r->dpo);
  for (int i = 0; i < REPORT_DPO_N; i++) r->has_dpo |= isfinite(w->dpo[i]);
  snprintf(r->message, sizeof r->message, "%.*s", (int)sizeof r->message - 1, w->message);
  snprintf(r->sample_prompt, sizeof r->sample_prompt, "%s", w->sample_prompt);
  snprintf(r->sample_text, sizeof r->sample_text, "%s", w->sample_text);
}

int svc_rendezvous_check(svc_t *s, const char *id, const char *token, int attempt, char *msg,
                         size_t msgsz) {
  db_job_brief_t j;
  int rc = db_job_brief(s->db, id, &j);
  if (rc == TY_ENOTFOUND || (rc == 0 && (!token || !token_equal(token, j.token)))) {
    /* Unknown job or wrong token: the same answer, so ids cannot be probed. */
    set_msg(msg, msgsz, "a rendezvous needs the job's own token (%s)", rankenv_name(RANKENV_TOKEN));
    return TY_EUNAUTHENTICATED;
  }
  if (rc) return rc;
  if (attempt < 1 || attempt > j.attempt) {
    set_msg(msg, msgsz, "job %s has no attempt %d (its latest is %d)", id, attempt, j.attempt);
    return TY_ENOTFOUND;
  }
  if (!(DB_MASK_ACTIVE & DB_MASK(j.state)) || attempt != j.attempt) {
    set_msg(msg, msgsz, "attempt %d of job %s has ended (the job is %s, attempt %d)", attempt, id,
            db_state_name(j.state), j.attempt);
    return TY_EPRECONDITION;
  }
  return 0;
}

int svc_report(svc_t *s, const char *id, const char *token, const json_t *report,
               ty_errlist_t *errs, char *msg, size_t msgsz) {
  db_job_brief_t jb, *j = &jb;
  int rc = db_job_brief(s->db, id, &jb);
  if (rc == TY_ENOTFOUND || (rc == 0 && (!token || !token_equal(token, j->token)))) {
    /* Unknown job or wrong token: the same answer, so ids cannot be probed. */
    set_msg(msg, msgsz, "a report needs the job's own token (%s)", rankenv_name(RANKENV_TOKEN));
    rc = TY_EUNAUTHENTICATED;
    goto out;
  }
  if (rc) goto out;
  db_report_t r;
  report_wire_t w;
  report_from_json(report, &w, &r, errs);
  if (errs->len) {
    set_msg(msg, msgsz, "malformed report (see details)");
    rc = TY_EINVAL;
    goto out;
  }
  if (!(DB_MASK_ACTIVE & DB_MASK(j->state)) || r.attempt != j->attempt) {
    set_msg(msg, msgsz, "job %s is %s (attempt %d); this rank of attempt %d should stop", id,
            db_state_name(j->state), j->attempt, r.attempt);
    rc = TY_EPRECONDITION;
    goto out;
  }
  bool progressed = false;
  svc_report_progress(s, id, j->state, &r);
  rc = db_report_ingest(s->db, id, &r, &progressed);
  if (rc == TY_ENOTFOUND) {
    ty_errlist_add(errs, "rank", "job %s has ranks 0..%d", id, j->world_size - 1);
    set_msg(msg, msgsz, "no such rank");
    rc = TY_EINVAL;
  } else if (rc == TY_EPRECONDITION) {
    set_msg(msg, msgsz, "rank %d of attempt %d has already finished", r.rank, r.attempt);
  } else if (rc == TY_EUNAVAILABLE) {
    /* The rank is alive and says so: the watchdog hears it even though
     * the database cannot keep the report now; the rank keeps it. */
    char err[512];
    db_last_error(s->db, err, sizeof err);
    set_msg(msg, msgsz, "the database cannot take this report now (%s); keep it and send it "
            "again", err);
    if (s->sched) sched_note_report(s->sched, id, &w, NULL, 0);
    refresh_store_health(s);
  }
  if (rc) goto out;
  char now_why[256] = "";
  if (s->sched) sched_note_report(s->sched, id, &w, now_why, sizeof now_why);
  if (j->state == DB_JOB_STARTING && strcmp(r.phase, "starting")) {
    char why[300];
    snprintf(why, sizeof why, "%s", now_why[0] ? now_why : "");
    if (!why[0]) snprintf(why, sizeof why, "rank %d reported phase %s", r.rank, r.phase);
    svc_transition(s, id, DB_MASK(DB_JOB_STARTING), DB_JOB_RUNNING, why, NULL, NULL);
    if (now_why[0] && s->sched) sched_reason_written(s->sched, id, r.attempt, now_why);
  } else if (j->state == DB_JOB_RUNNING && now_why[0]) {
    /* What is true now (DESIGN.md "The server as built"): the reason
     * follows the ranks' phases, not the first report that moved it. One
     * that cannot be written now is tried again at the next report. */
    cache_invalidate(s, id);
    if (db_job_set_reason(s->db, id, DB_MASK(DB_JOB_RUNNING), now_why) == 0 && s->sched)
      sched_reason_written(s->sched, id, r.attempt, now_why);
    cache_invalidate(s, id);
  }
  if (progressed) {
    cache_invalidate(s, id); /* the job's view shows its progress */
    notify(s);
  }
out:
  atomic_fetch_add(rc ? &s->reports_bad : &s->reports_ok, 1);
  return rc;
}

int svc_events(svc_t *s, const char *id, int64_t after_seq, int limit, json_t **out,
               int64_t *last_seq, bool *final, char *msg, size_t msgsz) {
  db_job_t *j;
  int rc = svc_get(s, id, &j, msg, msgsz);
  if (rc) return rc;
  *final = db_state_final(j->state);
  db_job_free(j);
  int live = 0;
  if (*final && (rc = db_job_unfinished_ranks(s->db, id, &live))) return rc;
  /* The ranks of a cancelled or failed attempt stop after the state
   * change; their "rank" events still belong to the stream. */
  if (live) *final = false;
  return db_events_json(s->db, id, after_seq, limit, out, last_seq);
}

/* Whether job id has had attempt (0: the newest, always known): 0 with the
 * job's brief in *b, else TY_ENOTFOUND (or a database error) with the
 * reason in msg. */
static int known_attempt(svc_t *s, const char *id, int attempt, db_job_brief_t *b, char *msg,
                         size_t msgsz) {
  int rc = db_job_brief(s->db, id, b);
  if (rc == TY_ENOTFOUND) set_msg(msg, msgsz, "no job with id '%s'", id);
  if (rc) return rc;
  if (attempt <= b->attempt) return 0;
  set_msg(msg, msgsz, "job %s has had %d attempt%s, so no attempt %d", id, b->attempt,
          b->attempt == 1 ? "" : "s", attempt);
  return TY_ENOTFOUND;
}

int svc_ranks(svc_t *s, const char *id, int attempt, json_t **out, char *msg, size_t msgsz) {
  db_job_brief_t b;
  int rc = known_attempt(s, id, attempt, &b, msg, msgsz);
  return rc ? rc : db_ranks_json(s->db, id, attempt, out);
}

int svc_log_path(svc_t *s, const char *id, int attempt, int rank, char **out, char *msg,
                 size_t msgsz) {
  db_job_brief_t b;
  int rc = known_attempt(s, id, attempt, &b, msg, msgsz);
  if (rc) return rc;
  rc = db_rank_log_path(s->db, id, attempt, rank, out);
  if (rc != TY_ENOTFOUND) return rc;
  if (rank >= b.world_size)
    set_msg(msg, msgsz, "job %s has %d rank%s (0..%d), so no rank %d", id, b.world_size,
            b.world_size == 1 ? "" : "s", b.world_size - 1, rank);
  else if (b.attempt == 0)
    set_msg(msg, msgsz, "job %s has not started yet (%s): no rank has a log", id,
            db_state_name(b.state));
  else
    set_msg(msg, msgsz, "job %s has no log for rank %d of attempt %d (not started yet?)", id,
            rank, attempt ? attempt : b.attempt);
  return rc;
}

static json_t *time_json(double t) {
  if (t <= 0) return json_null();
  time_t sec = (time_t)t;
  struct tm tm;
  gmtime_r(&sec, &tm);
  char buf[40], out[48];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, sizeof out, "%s.%03dZ", buf, (int)((t - (double)sec) * 1000));
  return json_string(out);
}

json_t *svc_job_json(const db_job_t *j) {
  json_t *spec = json_loads(j->spec, 0, NULL);
  json_t *o = json_pack(
      "{s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:i, s:o, s:o, s:o, s:o, s:o}", "id", j->id, "name",
      j->name, "state", db_state_name(j->state), "reason", j->reason, "attempt", j->attempt,
      "world_size", j->world_size, "device", j->device, "max_restarts", j->max_restarts,
      "created_at", time_json(j->created_at), "updated_at", time_json(j->updated_at),
      "started_at", time_json(j->started_at), "finished_at", time_json(j->finished_at), "spec",
      spec ? spec : json_object());
  if (j->idempotency_key)
    json_object_set_new(o, "idempotency_key", json_string(j->idempotency_key));
  return o;
}

int svc_stats(svc_t *s, svc_stats_t *out) {
  memset(out, 0, sizeof *out);
  out->ranks_running = s->sched ? sched_ranks_running(s->sched) : 0;
  out->reports_ingested = atomic_load(&s->reports_ok);
  out->reports_rejected = atomic_load(&s->reports_bad);
  return db_job_count_by_state(s->db, out->jobs);
}

/* Called by the pending queue once a write has landed (now or later). */
static void on_written(void *ctx, const pend_op_t *op) {
  svc_t *s = ctx;
  if (op->kind == PEND_TRANSITION) {
    cache_invalidate(s, op->id);
    ty_info("job %s -> %s: %s", op->id, db_state_name(op->to), op->text);
  }
  if (op->kind != PEND_SPAWNED) notify(s);
}

static pend_op_t transition_op(const char *id, unsigned from_mask, int to, const char *reason) {
  pend_op_t op = {.kind = PEND_TRANSITION, .from_mask = from_mask, .to = to, .text = reason};
  snprintf(op.id, sizeof op.id, "%s", id);
  return op;
}

int svc_transition(svc_t *s, const char *id, unsigned from_mask, int to, const char *reason,
                   int *cur, int *attempt) {
  if (!db_state_name(to)) return TY_EINVAL;
  pend_op_t op = transition_op(id, from_mask, to, reason ? reason : "");
  /* Before and after: a render that read the old row between the two is
   * never stored. */
  cache_invalidate(s, id);
  int rc = pend_write(s->pend, &op, cur, attempt);
  cache_invalidate(s, id);
  return rc == 1 ? 0 : rc;
}

int svc_transition_now(svc_t *s, const char *id, unsigned from_mask, int to, const char *reason,
                       int *cur, int *attempt) {
  if (!db_state_name(to)) return TY_EINVAL;
  pend_op_t op = transition_op(id, from_mask, to, reason ? reason : "");
  cache_invalidate(s, id);
  int rc = pend_write_now(s->pend, &op, cur, attempt);
  cache_invalidate(s, id);
  return rc;
}

int svc_rank_spawned(svc_t *s, const char *id, int attempt, int rank, int pid,
                     int64_t pid_start, const char *log_path) {
  pend_op_t op = {.kind = PEND_SPAWNED,
                  .attempt = attempt,
                  .rank = rank,
                  .pid = pid,
                  .pid_start = pid_start,
                  .text = log_path};
  snprintf(op.id, sizeof op.id, "%s", id);
  int rc = pend_write(s->pend, &op, NULL, NULL);
  return rc == 1 ? 0 : rc;
}

int svc_rank_finished(svc_t *s, const char *id, int attempt, int rank, const char *state,
                      int exit_code, const char *message) {
  pend_op_t op = {.kind = PEND_FINISHED,
                  .attempt = attempt,
                  .rank = rank,
                  .exit_code = exit_code,
                  .text = message};
  snprintf(op.id, sizeof op.id, "%s", id);
  snprintf(op.state, sizeof op.state, "%s", state);
  int rc = pend_write(s->pend, &op, NULL, NULL);
  return rc == 1 ? 0 : rc;
}

/* The database's own word on its writes (db_write_failing): the first
 * failed write turns the server unhealthy, whoever made it. */
static void refresh_store_health(svc_t *s) {
  char why[1024];
  health_set(s->health, HEALTH_DB_STORE, db_write_failing(s->db, why, sizeof why) ? why : NULL);
}

bool svc_health(svc_t *s, char *why, size_t size) {
  refresh_store_health(s);
  return health_ok(s->health, why, size);
}

void svc_tick(svc_t *s) {
  pend_retry(s->pend, false);
  refresh_store_health(s);
  double now = ty_mono_s();
  if (now - s->file_checked_at < SVC_FILE_CHECK_S) return;
  s->file_checked_at = now;
  char why[PATH_MAX + 256];
  health_set(s->health, HEALTH_DB_FILE, db_file_check(s->db, why, sizeof why) ? why : NULL);
}

void svc_start_blocked(svc_t *s, const char *cause) {
  health_set(s->health, HEALTH_DB_START, cause);
}
