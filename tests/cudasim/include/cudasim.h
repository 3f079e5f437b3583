/* cudasim.h - the simulated device's own interface, shared by its parts
 * (the sim_ sources beside it) and not by trainyard's code. The simulator
 * is a CUDA runtime, cuBLAS and NCCL that run on the host so that the GPU
 * code (the worker's _cuda sources, its .cu files compiled as C++, and
 * comm_nccl.c) and the GPU suites run on a machine without a GPU (TRAINYARD_CUDA=SIM).
 *
 * What it checks that a plain host emulation would not:
 *   - device memory lives in its own mapping, each allocation ending at a
 *     page that is never readable (an overrun faults, in a kernel or a copy)
 *     and unmapped for good once freed (a use after free faults); it is
 *     accessible only while device work runs, so host code that
 *     dereferences a device pointer faults too;
 *   - copies and collectives must lie inside one live allocation;
 *   - streams are queues, run only when something waits on them (lazy), or
 *     side streams first (side): work that reads another stream's results
 *     without an event, or a host that reads a pinned buffer before the copy
 *     into it ran, then sees stale data;
 *   - kernels run with every thread of a block as a fiber: __syncthreads
 *     and warp shuffles mean what they mean on a GPU, and a barrier that not
 *     every thread reaches is reported, not hung on;
 *   - collectives check that every rank issued the same call;
 *   - an event's time (cudaEventElapsedTime) is the host clock when its
 *     stream ran the record, and reading it before both events ran gives
 *     cudaErrorNotReady, as reading it before they completed does on a GPU
 *     (a profiler that forgets to wait fails here too).
 *
 * Environment: TY_SIM_GPUS (the machine's devices, default 2; 0 = none; a
 * process sees those CUDA_VISIBLE_DEVICES lists, by CUDA's rule), TY_SIM_MEM_MIB
 * (each device's memory, default 16384), TY_SIM_ORDER (lazy | side | sync,
 * default lazy), TY_SIM_HANG_S (seconds a wait may last before the process
 * aborts saying what it waited for, default 300). */
#ifndef TY_CUDASIM_H
#define TY_CUDASIM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One queued piece of device work: run(arg) returns 1 when done, 0 when it
 * must be polled again (a collective waiting for its peers). drop(arg), if
 * set, frees arg once the op is done. */
typedef int (*sim_run_fn)(void *arg);
typedef void (*sim_drop_fn)(void *arg);

/* Queues an op on stream s (NULL: the legacy default stream). */
void sim_enqueue(cudaStream_t s, const char *what, sim_run_fn run, void *arg, sim_drop_fn drop);
/* Runs stream s until everything queued on it so far is done. */
void sim_stream_drain(cudaStream_t s);
/* Records a sticky error (cudaGetLastError returns it once). */
void sim_set_error(cudaError_t e);
/* Aborts the process after printing "cudasim: " and the message. */
void sim_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Waits for every stream (what cudaFree and cudaFreeHost do first). */
void sim_device_sync(void);
/* The calling thread's device (cudaSetDevice). */
int sim_current_device(void);
/* Sleeps a little (a poll's back-off). */
void sim_nap(void);
/* Seconds a blocking wait may last (TY_SIM_HANG_S). */
int sim_hang_seconds(void);

/* The runtime's lock (recursive); ops run under it. */
void sim_lock(void);
void sim_unlock(void);
/* 1 while ops run: device memory is accessible only then. */
int sim_executing(void);
/* Makes every live device allocation accessible (on) or not (off). */
void sim_device_access(int on);

/* 1 when [p, p + n) lies inside one live device allocation. */
int sim_is_device_range(const void *p, size_t n);
/* 1 when p points into a live pinned host allocation (cudaHostAlloc). */
int sim_is_pinned(const void *p);
/* Fails the process when [p, p + n) is not device memory: `what` names the
 * call and the operand. */
void sim_require_device(const void *p, size_t n, const char *what);

/* Kernel launches (cudasim_device.h): body(arg) runs one thread. */
typedef struct {
  const char *name;
  const void *key; /* the kernel's address: barrier-free kernels are learned */
  unsigned grid[3], block[3];
  size_t shmem;
  void (*body)(void *arg);
  void *arg;
  void (*drop)(void *arg);
} sim_launch_t;
void sim_launch(const sim_launch_t *l);

#ifdef __cplusplus
}
#endif

#endif
