/* comm_shm.c - the shared-memory backend: the segment's rendezvous and
 * removal, the futex barrier, and how a rank tells a peer is dead (robust
 * mutexes) or late (the timeout); layout in comm_shm.h, the collectives in
 * comm_shm_coll.c.
 *
 * Lifetime of the name: rank 0 creates /dev/shm/trainyard-<name> (O_EXCL),
 * every rank maps it and the last to join unlinks it, so once the job is
 * running nothing is left in /dev/shm whatever happens to its processes. A
 * rank closing before everyone joined unlinks it too; a launcher removes it
 * (comm_shm_remove) when ranks died before joining. */
#include "worker/dist/comm_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/rankenv.h"
#include "common/shm_name.h"
#include "common/xalloc.h"

#define SHM_MAGIC 0x48435954u /* "TYCH" */
#define SHM_VERSION 1u
#define SHM_SPIN 2000   /* polls before sleeping in a barrier */
#define SHM_SLICE_MS 10 /* futex sleep between liveness checks */
#define SHM_CHECK_MS 20 /* how often a waiter checks its peers */

int comm_shm_path(const char *rendezvous, char *out, size_t outlen, char *err, size_t errlen) {
  return ty_shm_path(rendezvous, out, outlen, err, errlen);
}

int comm_shm_remove(const char *rendezvous) {
  return ty_shm_remove(rendezvous);
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Per-rank half size: RANKENV_COMM_SHM_CHUNK_KB, else 4 MiB bounded so
 * the whole data area stays near 64 MiB however many ranks there are
 * (2 halves x world x half). Rank 0 decides; the others read the header. */
static int half_bytes_for(int world, size_t *out, char *err, size_t errlen) {
  size_t half = (size_t)32 << 20;
  half /= (size_t)world;
  if (half > ((size_t)4 << 20)) half = (size_t)4 << 20;
  if (half < ((size_t)256 << 10)) half = (size_t)256 << 10;
  long kb = -1;
  if (rankenv_long(RANKENV_COMM_SHM_CHUNK_KB, &kb, err, errlen))
    return TY_EINVAL; /* spelled out so the compiler sees *out is set whenever 0 returns */
  if (kb > 0) half = (size_t)kb << 10;
  half &= ~(size_t)4095;
  /* reduce_scatter splits a half into one piece per rank: keep >= 1 KiB. */
  if (half < (size_t)world * 1024) half = ((size_t)world * 1024 + 4095) & ~(size_t)4095;
  *out = half;
  return 0;
}

static size_t header_bytes(int world) {
  size_t h = sizeof(shm_hdr_t);
  h = (h + 63) & ~(size_t)63;
  h += (size_t)world * sizeof(shm_rank_t);
  return (h + 4095) & ~(size_t)4095;
}

static void map_layout(shm_t *s, int world, void *base) {
  s->hdr = base;
  s->ranks = (shm_rank_t *)((char *)base + ((sizeof(shm_hdr_t) + 63) & ~(size_t)63));
  s->data = (char *)base + header_bytes(world);
}

/* Rank 0: creates, sizes and initialises the segment. */
static int create_segment(comm_t *c, shm_t *s, char *err, size_t errlen) {
  size_t half;
  int rc = half_bytes_for(c->world, &half, err, errlen);
  if (rc) return rc;
  size_t size = header_bytes(c->world) + (size_t)c->world * 2 * half;
  int fd = shm_open(s->path, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      ty_errf(err, errlen, 0,
              "shared memory /dev/shm%s already exists: another job uses this rendezvous name, "
              "or a dead one left it (remove the file if no job runs)",
              s->path);
    else
      ty_errf(err, errlen, 0, "shm_open /dev/shm%s: %s", s->path, strerror(errno));
    return TY_EUNAVAILABLE;
  }
  /* posix_fallocate, not only ftruncate: a full /dev/shm must be an error
   * here, not a SIGBUS in the middle of a collective. */
  int e = ftruncate(fd, (off_t)size) ? errno : posix_fallocate(fd, 0, (off_t)size);
  if (e) {
    ty_errf(err, errlen, 0,
            "cannot size /dev/shm%s to %zu KiB: %s (free space in /dev/shm, or lower %s)", s->path,
            size >> 10, strerror(e), rankenv_name(RANKENV_COMM_SHM_CHUNK_KB));
    close(fd);
    shm_unlink(s->path);
    return TY_EEXHAUSTED;
  }
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    ty_errf(err, errlen, 0, "mmap /dev/shm%s: %s", s->path, strerror(errno));
    shm_unlink(s->path);
    return TY_EINTERNAL;
  }
  s->map_size = size;
  map_layout(s, c->world, base);
  shm_hdr_t *h = s->hdr;
  h->version = SHM_VERSION;
  h->world = c->world;
  h->half_bytes = half;
  h->size = size;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  for (int r = 0; r < c->world; r++) pthread_mutex_init(&s->ranks[r].alive, &ma);
  pthread_mutexattr_destroy(&ma);
  atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
  return 0;
}

/* Ranks > 0: waits for rank 0's segment, then maps it. */
static int attach_segment(comm_t *c, shm_t *s, long long deadline, char *err, size_t errlen) {
  int fd = -1, delay = 1;
  struct stat st;
  for (;;) {
    if (fd < 0) fd = shm_open(s->path, O_RDWR, 0600);
    if (fd < 0 && errno != ENOENT) {
      return ty_errf(err, errlen, TY_EUNAVAILABLE, "shm_open /dev/shm%s: %s", s->path,
                     strerror(errno));
    }
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= header_bytes(c->world)) {
      void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) {
        ty_errf(err, errlen, 0, "mmap /dev/shm%s: %s", s->path, strerror(errno));
        close(fd);
        return TY_EINTERNAL;
      }
      shm_hdr_t *h = base;
      if (atomic_load_explicit(&h->magic, memory_order_acquire) == SHM_MAGIC) {
        close(fd);
        if (h->version != SHM_VERSION || h->world != c->world || h->size != (uint64_t)st.st_size) {
          ty_errf(err, errlen, 0,
                  "/dev/shm%s was made for %d ranks (version %u), this rank expects %d: every "
                  "rank must get the same %s",
                  s->path, h->world, h->version, c->world, rankenv_name(RANKENV_WORLD_SIZE));
          munmap(base, (size_t)st.st_size);
          return TY_EINVAL;
        }
        s->map_size = (size_t)st.st_size;
        map_layout(s, c->world, base);
        return 0;
      }
      munmap(base, (size_t)st.st_size);
    }
    if (ty_mono_ms() >= deadline) {
      if (fd >= 0) close(fd);
      return ty_errf(err, errlen, TY_EDEADLINE,
                     "rank 0 did not create /dev/shm%s within %d ms (did it start?)", s->path,
                     c->timeout_ms);
    }
    sleep_ms(delay);
    if (delay < 20) delay *= 2;
  }
}

/* Records a failure in the header (the first one wins) and wakes waiters. */
static void record_failure(shm_t *s, uint32_t kind, int rank) {
  shm_hdr_t *h = s->hdr;
  uint32_t expect = 0;
  if (atomic_compare_exchange_strong(&h->fail_claim, &expect, 1)) {
    atomic_store(&h->fail_rank, rank);
    atomic_store(&h->fail_pid, rank >= 0 ? atomic_load(&s->ranks[rank].pid) : 0);
    atomic_store(&h->fail_kind, kind);
  }
  atomic_fetch_add(&h->bar_gen, 0x10000u); /* wakes without opening: see wait */
  futex(&h->bar_gen, FUTEX_WAKE, INT_MAX, NULL);
}

/* Turns the header's failure record into this rank's error. */
static int fail_from_header(comm_t *c, shm_t *s) {
  shm_hdr_t *h = s->hdr;
  uint32_t kind;
  /* The claimer stores the kind right after its claim; bounded, in case it
   * was killed in between. */
  for (long i = 0; (kind = atomic_load(&h->fail_kind)) == 0 && i < 100000000L; i++) cpu_relax();
  int r = atomic_load(&h->fail_rank);
  const char *op = s->op ? s->op : "rendezvous";
  switch (kind) {
    case SHM_FAIL_DIED:
      return comm_fail(c, TY_EABORTED, r, "rank %d (pid %d) died during %s", r,
                       (int)atomic_load(&h->fail_pid), op);
    case SHM_FAIL_LEFT:
      return comm_fail(c, TY_EABORTED, r,
                       "rank %d left the job (closed its communicator) "
                       "while this rank was in %s",
                       r, op);
    case SHM_FAIL_TIMEOUT:
      return comm_fail(c, TY_EDEADLINE, r,
                       "rank %d did not reach %s within %d ms (stuck or "
                       "slow: %s raises the limit)",
                       r, op, c->timeout_ms, rankenv_name(RANKENV_COMM_TIMEOUT_MS));
    case SHM_FAIL_MISMATCH:
      return comm_fail(c, TY_EINVAL, r,
                       "rank %d called a different collective than this "
                       "rank's %s, or with different counts: every rank must make the same "
                       "calls in the same order",
                       r, op);
    default:
      return comm_fail(c, TY_EABORTED, -1, "a rank failed during %s and died recording why", op);
  }
}

/* Is every joined peer alive and present? Records the first that is not. */
static int check_peers(comm_t *c, shm_t *s) {
  for (int r = 0; r < c->world; r++) {
    if (r == c->rank) continue;
    shm_rank_t *p = &s->ranks[r];
    uint32_t st = atomic_load(&p->state);
    if (st == SHM_LEFT) {
      record_failure(s, SHM_FAIL_LEFT, r);
      return fail_from_header(c, s);
    }
    if (st != SHM_JOINED) continue;
    int e = pthread_mutex_trylock(&p->alive);
    if (e == 0) {
      /* Unlocked by a peer on its way out: it stores SHM_LEFT first. */
      pthread_mutex_unlock(&p->alive);
    } else if (e == EOWNERDEAD || e == ENOTRECOVERABLE) {
      record_failure(s, SHM_FAIL_DIED, r);
      return fail_from_header(c, s);
    }
  }
  return 0;
}

int shm_sync(comm_t *c, int first) {
  shm_t *s = c->impl;
  shm_hdr_t *h = s->hdr;
  uint32_t gen = atomic_load(&h->bar_gen);
  s->epoch++;
  atomic_store(&s->ranks[c->rank].arrivals, s->epoch);
  if (atomic_load(&h->fail_claim)) return fail_from_header(c, s);
  if (atomic_fetch_add(&h->bar_count, 1) == (uint32_t)c->world - 1) {
    atomic_store(&h->bar_count, 0);
    atomic_fetch_add(&h->bar_gen, 1);
    futex(&h->bar_gen, FUTEX_WAKE, INT_MAX, NULL);
  } else {
    /* Opening adds 1 to bar_gen; a recorded failure adds 0x10000 (so a
     * waiter wakes either way and looks at fail_claim). */
    int spins = 0;
    long long start = 0, last = 0;
    while (atomic_load(&h->bar_gen) == gen) {
      if (spins < SHM_SPIN) {
        spins++;
        cpu_relax();
        continue;
      }
      if (atomic_load(&h->fail_claim)) return fail_from_header(c, s);
      struct timespec ts = {0, SHM_SLICE_MS * 1000000L};
      futex(&h->bar_gen, FUTEX_WAIT, gen, &ts);
      long long now = ty_mono_ms();
      if (!start) start = last = now;
      if (now - last >= SHM_CHECK_MS) {
        last = now;
        if (atomic_load(&h->bar_gen) != gen) break;
        int rc = check_peers(c, s);
        if (rc) return rc;
        if (now - start >= c->timeout_ms) {
          int late = -1;
          for (int r = 0; r < c->world && late < 0; r++)
            if (atomic_load(&s->ranks[r].arrivals) < s->epoch) late = r;
          record_failure(s, SHM_FAIL_TIMEOUT, late);
          return fail_from_header(c, s);
        }
      }
    }
  }
  if (atomic_load(&h->fail_claim)) return fail_from_header(c, s);
  if (!first) return 0;
  shm_meta_t *mine = &s->ranks[c->rank].meta[s->round & 1];
  for (int r = 0; r < c->world; r++) {
    shm_meta_t *m = &s->ranks[r].meta[s->round & 1];
    if (atomic_load(&m->op) != atomic_load(&mine->op) ||
        atomic_load(&m->arg) != atomic_load(&mine->arg) ||
        atomic_load(&m->total) != atomic_load(&mine->total) ||
        atomic_load(&m->seq) != atomic_load(&mine->seq)) {
      record_failure(s, SHM_FAIL_MISMATCH, r);
      return fail_from_header(c, s);
    }
  }
  return 0;
}

void shm_begin(comm_t *c, uint32_t op, uint32_t arg, uint64_t total, const char *name) {
  shm_t *s = c->impl;
  shm_meta_t *m = &s->ranks[c->rank].meta[s->round & 1];
  atomic_store(&m->op, op);
  atomic_store(&m->arg, arg);
  atomic_store(&m->total, total);
  atomic_store(&m->seq, s->seq++);
  s->op = name;
}

/* Joins: takes this rank's liveness mutex, counts itself in, the last
 * joiner unlinks the name, then waits for everyone. */
static int join(comm_t *c, shm_t *s, long long deadline, char *err, size_t errlen) {
  shm_rank_t *me = &s->ranks[c->rank];
  if (atomic_load(&me->state) != SHM_ABSENT) {
    return ty_errf(err, errlen, TY_EINVAL,
                   "rank %d joined /dev/shm%s twice: two processes got %s=%d", c->rank, s->path,
                   rankenv_name(RANKENV_RANK), c->rank);
  }
  int e = pthread_mutex_lock(&me->alive);
  if (e == EOWNERDEAD) {
    pthread_mutex_consistent(&me->alive);
  } else if (e) {
    return ty_errf(err, errlen, TY_EINTERNAL, "cannot lock rank %d's liveness mutex: %s", c->rank,
                   strerror(e));
  }
  s->holds_alive = 1;
  atomic_store(&me->pid, (int32_t)getpid());
  atomic_store(&me->state, SHM_JOINED);
  if (atomic_fetch_add(&s->hdr->joined, 1) + 1 == (uint32_t)c->world) shm_unlink(s->path);
  int delay = 1;
  s->op = "rendezvous";
  while (atomic_load(&s->hdr->joined) < (uint32_t)c->world) {
    if (atomic_load(&s->hdr->fail_claim) || check_peers(c, s)) {
      fail_from_header(c, s);
      ty_errf(err, errlen, 0, "%s", c->err);
      return c->broken;
    }
    if (ty_mono_ms() >= deadline) {
      int missing = -1;
      for (int r = 0; r < c->world && missing < 0; r++)
        if (atomic_load(&s->ranks[r].state) == SHM_ABSENT) missing = r;
      return ty_errf(err, errlen, TY_EDEADLINE,
                     "rank %d did not join /dev/shm%s within %d ms (did it start?)", missing,
                     s->path, c->timeout_ms);
    }
    sleep_ms(delay);
    if (delay < 10) delay *= 2;
  }
  s->all_joined = 1;
  s->op = NULL;
  return 0;
}

static void detach(comm_t *c, shm_t *s) {
  if (s->hdr) {
    if (s->holds_alive) {
      atomic_store(&s->ranks[c->rank].state, SHM_LEFT);
      pthread_mutex_unlock(&s->ranks[c->rank].alive);
    }
    munmap(s->hdr, s->map_size);
  }
  /* The last joiner unlinked it; before that, the job never ran. A rank
   * that never mapped it leaves alone a name that may be another job's. */
  if (s->mapped && !s->all_joined) shm_unlink(s->path);
  free(s->displ);
  free(s);
}

void shm_close(comm_t *c) {
  if (c->impl) detach(c, c->impl);
  c->impl = NULL;
}

int comm_shm_open(comm_t *c, const char *arg, char *err, size_t errlen) {
  shm_t *s = xcalloc(1, sizeof *s);
  char rdv[256];
  snprintf(rdv, sizeof rdv, "shm:%s", arg);
  int rc = comm_shm_path(rdv, s->path, sizeof s->path, err, errlen);
  if (rc) {
    free(s);
    return rc;
  }
  c->impl = s;
  c->ops = &comm_shm_ops;
  s->displ = xcalloc((size_t)c->world, sizeof(size_t));
  long long deadline = ty_mono_ms() + c->timeout_ms;
  rc = c->rank == 0 ? create_segment(c, s, err, errlen)
                    : attach_segment(c, s, deadline, err, errlen);
  if (rc == 0) {
    s->mapped = 1;
    s->half_bytes = s->hdr->half_bytes;
    s->half_floats = s->half_bytes / sizeof(float);
    rc = join(c, s, deadline, err, errlen);
  }
  if (rc) {
    detach(c, s);
    c->impl = NULL;
    return rc;
  }
  return 0;
}
