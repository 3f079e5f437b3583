/* cpu_pool.h - the worker's thread pool for the elementwise kernels.
 *
 * Why not OpenMP: its threads spin after each parallel region (libgomp's
 * default wait policy), competing on every core with OpenBLAS's threads that
 * run the next matrix product; on a busy host that halved the step rate.
 * These threads sleep on a condition variable as soon as their share is
 * done. One pool per process (a forked child starts its own), started at
 * first use; calls from several threads at once are serialised. */
#ifndef TY_WORKER_CPU_POOL_H
#define TY_WORKER_CPU_POOL_H

#include <stddef.h>

/* Runs fn(ctx, begin, end) over [0, n) split into one contiguous range per
 * thread (the calling thread takes the first), and returns when all are
 * done. With n < 2 * min_per_thread (or one thread) fn runs inline on the
 * whole range. The split depends only on n and the thread count. */
typedef void (*pool_fn)(void *ctx, size_t begin, size_t end);
void pool_for(size_t n, size_t min_per_thread, pool_fn fn, void *ctx);

/* Threads the pool uses: RANKENV_THREADS from the environment if set
 * (1..256), else the CPUs this process may run on. */
int pool_threads(void);

/* RANKENV_THREADS in *n, 0 when unset; TY_EINVAL naming it when it is not
 * a whole number in 1..256 (the pool would then take its default, so the
 * worker refuses such a value before it starts). */
int pool_threads_env(long *n, char *err, size_t errlen);

#endif
