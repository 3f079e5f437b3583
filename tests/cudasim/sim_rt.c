/* sim_rt.c - the simulated device's runtime core: devices, errors, streams
 * as queues of ops, events as positions in them (a timing event also
 * stamps the host clock when its stream reaches it, for
 * cudaEventElapsedTime), and the order in which the queues run
 * (TY_SIM_ORDER, cudasim.h). All state is under one lock; ops
 * run on whichever host thread needs them done. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudasim.h"

typedef struct sim_op {
  struct sim_op *next;
  const char *what;
  sim_run_fn run; /* NULL: a wait for wait_s to reach wait_seq */
  void *arg;
  sim_drop_fn drop;
  struct CUstream_st *wait_s;
  uint64_t wait_seq;
} sim_op_t;

struct CUstream_st {
  sim_op_t *head, *tail;
  uint64_t enq, done; /* ops queued and finished so far */
  int blocking;       /* synchronises with the legacy stream */
  int running;        /* inside run_to: a wait back on it is a cycle */
  struct CUstream_st *next_all;
};

/* A timing event (created without cudaEventDisableTiming) is also an op
 * on its stream that stamps the host's monotonic clock when the stream
 * runs it: cudaEventElapsedTime's two ends, read only once both ran. */
struct CUevent_st {
  struct CUstream_st *s; /* NULL until recorded */
  uint64_t seq;
  int timing;         /* created without cudaEventDisableTiming */
  uint64_t gen;       /* records so far: a stamp of an earlier record is ignored */
  uint64_t stamp_gen; /* the record whose stamp t holds (0: none) */
  double t;           /* seconds, CLOCK_MONOTONIC */
  int pending;        /* stamps queued, not run: a destroyed event is freed after them */
  int destroyed;
};

enum { ORDER_LAZY, ORDER_SIDE, ORDER_SYNC };

static pthread_mutex_t g_lock;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct CUstream_st g_legacy;
static struct CUstream_st *g_streams = &g_legacy; /* every stream, legacy first */
static int g_order, g_devices, g_hang_s;
static cudaError_t g_error;
static __thread int t_device;

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

/* CUDA_VISIBLE_DEVICES over the TY_SIM_GPUS machine, by CUDA's rule: the
 * listed ordinals, in order, up to the first that is not a device or is
 * listed twice; set but empty hides every device. */
static int visible_devices(int machine) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v) return machine;
  int n = 0;
  unsigned long long seen = 0;
  while (*v) {
    char *end;
    long d = strtol(v, &end, 10);
    if (end == v || d < 0 || d >= machine || d >= 64 || (seen >> d & 1)) break;
    seen |= 1ull << d;
    n++;
    while (*end == ' ') end++;
    if (*end != ',') break;
    v = end + 1;
  }
  return n;
}

static void init_once(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&g_lock, &a);
  pthread_mutexattr_destroy(&a);
  g_legacy.blocking = 1;
  g_devices = visible_devices(env_int("TY_SIM_GPUS", 2));
  g_hang_s = env_int("TY_SIM_HANG_S", 300);
  const char *o = getenv("TY_SIM_ORDER");
  if (!o || !*o || !strcmp(o, "lazy"))
    g_order = ORDER_LAZY;
  else if (!strcmp(o, "side"))
    g_order = ORDER_SIDE;
  else if (!strcmp(o, "sync"))
    g_order = ORDER_SYNC;
  else
    sim_fatal("TY_SIM_ORDER=%s: use lazy, side or sync", o);
}

static void lock(void) {
  pthread_once(&g_once, init_once);
  pthread_mutex_lock(&g_lock);
}
static void unlock(void) {
  pthread_mutex_unlock(&g_lock);
}

void sim_fatal(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("cudasim: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

void sim_nap(void) {
  struct timespec ts = {0, 50000};
  nanosleep(&ts, NULL);
}

int sim_hang_seconds(void) {
  pthread_once(&g_once, init_once);
  return g_hang_s;
}

void sim_set_error(cudaError_t e) {
  lock();
  if (g_error == cudaSuccess) g_error = e;
  unlock();
}

static struct CUstream_st *resolve(cudaStream_t s) {
  if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_legacy;
  return s;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int run_to(struct CUstream_st *s, uint64_t seq, int block);

/* Runs s until `seq` of its ops are done. With block, polls an op that is
 * not ready until it is; without, returns 0 at the first such op. */
static int run_ops(struct CUstream_st *s, uint64_t seq, int block) {
  if (s->running) sim_fatal("a stream waits, through events, on its own later work (a cycle)");
  s->running = 1;
  int ok = 1;
  while (s->done < seq) {
    sim_op_t *op = s->head;
    if (!op->run) {
      if (!run_to(op->wait_s, op->wait_seq, block)) {
        ok = 0;
        break;
      }
    } else if (!op->run(op->arg)) {
      if (!block) {
        ok = 0;
        break;
      }
      double t0 = now_s();
      while (!op->run(op->arg)) {
        if (now_s() - t0 > g_hang_s)
          sim_fatal("%s did not complete within %d s (TY_SIM_HANG_S)", op->what, g_hang_s);
        sim_nap();
      }
    }
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->done++;
    if (op->drop) op->drop(op->arg);
    free(op);
  }
  s->running = 0;
  return ok;
}

/* Device memory is accessible only while ops run (the outermost run_to):
 * host code that dereferences a device pointer faults, as it would on a
 * GPU. */
static int g_depth;
static int run_to(struct CUstream_st *s, uint64_t seq, int block) {
  if (s->done >= seq) return 1;
  if (g_depth++ == 0) sim_device_access(1);
  int ok = run_ops(s, seq, block);
  if (--g_depth == 0) sim_device_access(0);
  return ok;
}

void sim_lock(void) {
  lock();
}
void sim_unlock(void) {
  unlock();
}
int sim_executing(void) {
  return g_depth > 0;
}

static void push(struct CUstream_st *s, sim_op_t *op) {
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->enq++;
}

static void push_wait(struct CUstream_st *s, struct CUstream_st *on, uint64_t seq) {
  if (on == s || on->done >= seq) return;
  sim_op_t *op = calloc(1, sizeof *op);
  if (!op) sim_fatal("out of host memory");
  op->what = "a wait on another stream";
  op->wait_s = on;
  op->wait_seq = seq;
  push(s, op);
}

/* What the order asks for after s got new work. */
static void progress(struct CUstream_st *s) {
  if (g_order == ORDER_SYNC) {
    run_to(s, s->enq, 1);
  } else if (g_order == ORDER_SIDE) {
    for (struct CUstream_st *x = g_streams->next_all; x; x = x->next_all)
      if (!x->running) run_to(x, x->enq, 0);
  }
}

void sim_enqueue(cudaStream_t stream, const char *what, sim_run_fn run, void *arg,
                 sim_drop_fn drop) {
  lock();
  struct CUstream_st *s = resolve(stream);
  /* The legacy stream and blocking streams wait for each other. */
  if (s == &g_legacy) {
    for (struct CUstream_st *x = g_streams->next_all; x; x = x->next_all)
      if (x->blocking) push_wait(s, x, x->enq);
  } else if (s->blocking) {
    push_wait(s, &g_legacy, g_legacy.enq);
  }
  sim_op_t *op = calloc(1, sizeof *op);
  if (!op) sim_fatal("out of host memory");
  op->what = what;
  op->run = run;
  op->arg = arg;
  op->drop = drop;
  push(s, op);
  progress(s);
  unlock();
}

void sim_stream_drain(cudaStream_t stream) {
  lock();
  struct CUstream_st *s = resolve(stream);
  run_to(s, s->enq, 1);
  unlock();
}

static void drain_all(void) {
  for (struct CUstream_st *x = g_streams; x; x = x->next_all) run_to(x, x->enq, 1);
}

/* ---- errors ---- */

static const struct {
  cudaError_t e;
  const char *name, *text;
} g_errs[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};

const char *cudaGetErrorString(cudaError_t e) {
  for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
    if (g_errs[i].e == e) return g_errs[i].text;
  return "unrecognized error code";
}
const char *cudaGetErrorName(cudaError_t e) {
  for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
    if (g_errs[i].e == e) return g_errs[i].name;
  return "cudaErrorUnknown";
}
cudaError_t cudaGetLastError(void) {
  lock();
  cudaError_t e = g_error;
  g_error = cudaSuccess;
  unlock();
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  lock();
  cudaError_t e = g_error;
  unlock();
  return e;
}

/* ---- devices ---- */

cudaError_t cudaGetDeviceCount(int *count) {
  pthread_once(&g_once, init_once);
  *count = g_devices > 0 ? g_devices : 0;
  return g_devices > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int device) {
  pthread_once(&g_once, init_once);
  if (g_devices <= 0) return cudaErrorNoDevice;
  if (device < 0 || device >= g_devices) return cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = t_device;
  return cudaSuccess;
}
int sim_current_device(void) {
  return t_device;
}
cudaError_t cudaDeviceSynchronize(void) {
  lock();
  drain_all();
  unlock();
  return cudaSuccess;
}
void sim_device_sync(void) {
  cudaDeviceSynchronize();
}

/* ---- streams and events ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  s->blocking = !(flags & cudaStreamNonBlocking);
  lock();
  struct CUstream_st *x = g_streams;
  while (x->next_all) x = x->next_all;
  x->next_all = s;
  unlock();
  *out = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *out) {
  return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}
/* Its work is finished first; the queue itself stays (events may name it). */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return cudaErrorInvalidResourceHandle;
  sim_stream_drain(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  sim_stream_drain(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  lock();
  struct CUstream_st *s = resolve(stream);
  int done = run_to(s, s->enq, 0);
  unlock();
  return done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags) {
  (void)flags;
  if (!e) return cudaErrorInvalidResourceHandle;
  lock();
  struct CUstream_st *s = resolve(stream);
  if (e->s) {
    push_wait(s, e->s, e->seq);
    progress(s);
  }
  unlock();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags) {
  *out = calloc(1, sizeof **out);
  if (!*out) return cudaErrorMemoryAllocation;
  (*out)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *out) {
  return cudaEventCreateWithFlags(out, cudaEventDefault);
}
/* As on a GPU, an event may be destroyed while a record of it is queued:
 * it is freed once its stamps have run. */
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return cudaSuccess;
  lock();
  e->destroyed = 1;
  if (!e->pending) free(e);
  unlock();
  return cudaSuccess;
}

typedef struct {
  cudaEvent_t e;
  uint64_t gen;
} stamp_t;
static int stamp_run(void *arg) {
  stamp_t *st = arg;
  if (st->gen == st->e->gen) st->e->t = now_s(), st->e->stamp_gen = st->gen;
  return 1;
}
static void stamp_drop(void *arg) {
  stamp_t *st = arg;
  if (--st->e->pending == 0 && st->e->destroyed) free(st->e);
  free(st);
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (!e || e->destroyed) return cudaErrorInvalidResourceHandle;
  lock();
  struct CUstream_st *s = resolve(stream);
  e->gen++;
  if (e->timing) {
    stamp_t *st = malloc(sizeof *st);
    if (!st) sim_fatal("out of host memory");
    st->e = e, st->gen = e->gen;
    e->pending++;
    sim_enqueue(stream, "an event's time stamp", stamp_run, st, stamp_drop);
  }
  e->s = s;
  e->seq = s->enq;
  unlock();
  return cudaSuccess;
}
/* CUDA's rules: both events recorded and made with timing
 * (cudaErrorInvalidResourceHandle otherwise), both completed
 * (cudaErrorNotReady otherwise: no stream is run here, so a caller that
 * reads the times without waiting for the events sees it). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms || !start || !end) return cudaErrorInvalidValue;
  lock();
  cudaError_t r = cudaSuccess;
  if (!start->timing || !end->timing || !start->s || !end->s || start->destroyed || end->destroyed)
    r = cudaErrorInvalidResourceHandle;
  else if (start->stamp_gen != start->gen || end->stamp_gen != end->gen)
    r = cudaErrorNotReady;
  else
    *ms = (float)((end->t - start->t) * 1e3);
  unlock();
  return r;
}
static cudaError_t event_wait(cudaEvent_t e, int block) {
  if (!e) return cudaErrorInvalidResourceHandle;
  lock();
  int done = !e->s || run_to(e->s, e->seq, block);
  unlock();
  return done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return event_wait(e, 0);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return event_wait(e, 1);
}
