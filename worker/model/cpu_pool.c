/* cpu_pool.c - a fixed pool of sleeping worker threads (see cpu_pool.h). */
#include "worker/model/cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/rankenv.h"

#define POOL_MAX 256

/* Serialises starting the pool. */
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static struct {
  pid_t pid;            /* the process whose threads these are; 0 before the start */
  pthread_mutex_t call; /* one pool_for at a time */
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  int nthreads;      /* including the caller */
  unsigned long gen; /* bumped for each job */
  int pending;       /* worker shares not yet finished */
  pool_fn fn;
  void *ctx;
  size_t n;
} P;

static void share(int i, size_t n, int nt, size_t *b, size_t *e) {
  *b = n * (size_t)i / (size_t)nt;
  *e = n * (size_t)(i + 1) / (size_t)nt;
}

static void *pool_main(void *arg) {
  int me = (int)(size_t)arg;
  unsigned long seen = 0;
  pthread_mutex_lock(&P.mu);
  for (;;) {
    while (P.gen == seen) pthread_cond_wait(&P.go, &P.mu);
    seen = P.gen;
    pool_fn fn = P.fn;
    void *ctx = P.ctx;
    size_t n = P.n, b, e;
    pthread_mutex_unlock(&P.mu);
    share(me, n, P.nthreads, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&P.mu);
    if (--P.pending == 0) pthread_cond_signal(&P.done);
  }
  return NULL;
}

int pool_threads_env(long *n, char *err, size_t errlen) {
  *n = 0;
  return rankenv_long_in(RANKENV_THREADS, 1, POOL_MAX, n, err, errlen);
}

/* A forked child has none of its parent's threads: it starts its own
 * pool (with fresh locks, whatever state the parent's were in). */
static void pool_start(void) {
  pthread_mutex_init(&P.call, NULL);
  pthread_mutex_init(&P.mu, NULL);
  pthread_cond_init(&P.go, NULL);
  pthread_cond_init(&P.done, NULL);
  P.gen = 0;
  P.pending = 0;
  long n = 0;
  /* A bad value has been refused by the worker's start (pool_threads_env). */
  if (pool_threads_env(&n, NULL, 0) || n < 1) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  if (n > POOL_MAX) n = POOL_MAX;
  /* Threads live for the process; they hold no resources beyond their stacks. */
  int started = 1;
  for (int i = 1; i < n; i++) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, pool_main, (void *)(size_t)i) == 0) started++;
    pthread_attr_destroy(&attr);
    if (started != i + 1) break; /* could not start one: run with fewer */
  }
  P.nthreads = started;
}

int pool_threads(void) {
  pid_t me = getpid();
  if (__atomic_load_n(&P.pid, __ATOMIC_ACQUIRE) != me) {
    pthread_mutex_lock(&start_mu);
    if (P.pid != me) {
      pool_start();
      __atomic_store_n(&P.pid, me, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&start_mu);
  }
  return P.nthreads;
}

void pool_for(size_t n, size_t min_per_thread, pool_fn fn, void *ctx) {
  int nt = pool_threads();
  if (nt == 1 || n < 2 * (min_per_thread ? min_per_thread : 1)) {
    if (n) fn(ctx, 0, n);
    return;
  }
  pthread_mutex_lock(&P.call);
  pthread_mutex_lock(&P.mu);
  P.fn = fn;
  P.ctx = ctx;
  P.n = n;
  P.pending = nt - 1;
  P.gen++;
  pthread_cond_broadcast(&P.go);
  pthread_mutex_unlock(&P.mu);
  size_t b, e;
  share(0, n, nt, &b, &e);
  if (b < e) fn(ctx, b, e);
  pthread_mutex_lock(&P.mu);
  while (P.pending) pthread_cond_wait(&P.done, &P.mu);
  pthread_mutex_unlock(&P.mu);
  pthread_mutex_unlock(&P.call);
}
