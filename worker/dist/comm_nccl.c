/* comm_nccl.c - the NCCL backend (GPU ranks): buffers are device memory on
 * the rank's device (rank % visible devices). Rendezvous "nccl:file:<path>":
 * rank 0 writes the NCCL unique id to <path> (atomically, by rename) and
 * removes it once every rank has joined; the others poll for it.
 *
 * A blocking collective's stream first waits for the work queued on the
 * compute (legacy) stream, whose results it reads. The communicator is
 * non-blocking, and each collective waits for its stream by polling, so a
 * dead or stuck peer turns into TY_EDEADLINE after RANKENV_COMM_TIMEOUT_MS
 * (the communicator is then aborted) or into TY_EABORTED when NCCL reports
 * the failure itself; NCCL cannot say which peer it was, so
 * comm_failed_rank() is -1. Uneven all_gather and reduce_scatter are
 * grouped broadcasts and reduces, one per rank.
 *
 * Host buffers (the training loop's adapter gradients and loss) are staged
 * through one device buffer of the communicator's, grown to the largest
 * call. Queued gathers and reduce-scatters (comm_all_gather_queue,
 * comm_reduce_scatter_queue) go on the same stream and return at once; comm_wait_event and
 * comm_drain poll as a blocking collective does. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/errors.h"
#include "common/rankenv.h"
#include "common/xalloc.h"
#include "worker/dist/comm_impl.h"
#include "worker/cuda/mem_cuda.h"

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  float *scratch;       /* one float on the device, for the barrier */
  cudaEvent_t computed; /* the compute stream's place at a blocking collective */
  int device;
  void *bounce; /* device staging for host buffers */
  size_t bounce_bytes;
} nccl_t;

static void nap(void) {
  struct timespec ts = {0, 100000}; /* 0.1 ms */
  nanosleep(&ts, NULL);
}

/* Waits until the communicator's pending NCCL calls are issued. */
static int wait_issued(comm_t *c, nccl_t *n, long long deadline, const char *op) {
  ncclResult_t st;
  for (;;) {
    if (ncclCommGetAsyncError(n->comm, &st) != ncclSuccess) st = ncclInternalError;
    if (st == ncclSuccess) return 0;
    if (st != ncclInProgress) {
      ncclCommAbort(n->comm);
      n->comm = NULL;
      return comm_fail(c, TY_EABORTED, -1, "%s: NCCL failed: %s", op, ncclGetErrorString(st));
    }
    if (ty_mono_ms() >= deadline) {
      ncclCommAbort(n->comm);
      n->comm = NULL;
      return comm_fail(c, TY_EDEADLINE, -1,
                       "%s: NCCL did not finish within %d ms (a peer died or is stuck)", op,
                       c->timeout_ms);
    }
    nap();
  }
}

/* Polls until `done` says the work is complete, applying the deadline and
 * NCCL's asynchronous errors. */
static int poll_until(comm_t *c, cudaError_t (*done)(void *), void *what_to_poll, const char *op) {
  nccl_t *n = c->impl;
  long long deadline = ty_mono_ms() + c->timeout_ms;
  int rc = wait_issued(c, n, deadline, op);
  if (rc) return rc;
  for (;;) {
    cudaError_t e = done(what_to_poll);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady)
      return comm_fail(c, TY_EINTERNAL, -1, "%s: CUDA: %s", op, cudaGetErrorString(e));
    rc = wait_issued(c, n, deadline, op); /* async errors, and the deadline */
    if (rc) return rc;
    nap();
  }
}

static cudaError_t stream_done(void *s) {
  return cudaStreamQuery((cudaStream_t)s);
}
static cudaError_t event_done(void *e) {
  return cudaEventQuery((cudaEvent_t)e);
}

/* Checks an enqueue's result (NCCL's, or TY_E* from staging), then polls
 * the stream to completion. */
static int enqueued(comm_t *c, ncclResult_t enq, const char *op) {
  nccl_t *n = c->impl;
  if (enq != ncclSuccess && enq != ncclInProgress) {
    ncclCommAbort(n->comm);
    n->comm = NULL;
    return comm_fail(c, TY_EABORTED, -1, "%s: %s", op, ncclGetErrorString(enq));
  }
  return 0;
}

static int finish(comm_t *c, ncclResult_t enq, const char *op) {
  int rc = enqueued(c, enq, op);
  return rc ? rc : poll_until(c, stream_done, ((nccl_t *)c->impl)->stream, op);
}

/* --- Host buffers: up to two staged spans per call (send and receive). */
typedef struct {
  void *host; /* the caller's host pointer, or NULL when on the device */
  void *dev;  /* what NCCL is given */
  size_t bytes;
} stage_t;

static int on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (!p) return 1;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError(); /* a plain host pointer on older runtimes */
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* A blocking collective reads what the compute (legacy) stream wrote: its
 * stream, which does not synchronise with that one, waits for the work
 * queued there so far. (Queued gathers are ordered by the caller's events
 * instead, so that they overlap compute.) */
static int after_compute(comm_t *c, const char *op) {
  nccl_t *n = c->impl;
  cudaError_t e = cudaEventRecord(n->computed, 0);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, n->computed, 0);
  if (e != cudaSuccess)
    return comm_fail(c, TY_EINTERNAL, -1, "%s: ordering after the compute stream: %s", op,
                     cudaGetErrorString(e));
  return 0;
}

/* Points st[i].dev at the caller's device buffer, or at the bounce buffer
 * (grown as needed) for a host one; copies the `in` spans there, after the
 * compute stream's work. */
static int stage_in(comm_t *c, stage_t *st, int k, const void *const *ptrs, const size_t *bytes,
                    const int *in, const char *op) {
  nccl_t *n = c->impl;
  size_t need = 0;
  int rc = after_compute(c, op);
  if (rc) return rc;
  for (int i = 0; i < k; i++) {
    st[i] = (stage_t){.host = on_device(ptrs[i]) ? NULL : (void *)ptrs[i],
                      .dev = (void *)ptrs[i],
                      .bytes = bytes[i]};
    if (st[i].host) need += (bytes[i] + 255) & ~(size_t)255;
  }
  if (need > n->bounce_bytes) {
    mem_cuda_free(n->bounce);
    n->bounce = NULL;
    n->bounce_bytes = 0;
    if (mem_cuda_alloc(&n->bounce, need)) {
      return comm_fail(c, TY_EEXHAUSTED, -1,
                       "%s: out of device memory staging %.1f MiB of host buffers through the "
                       "GPU for NCCL (the model and its training buffers fill the device: lower "
                       "the micro-batch or seq_len, or use more ranks)",
                       op, (double)need / (1 << 20));
    }
    n->bounce_bytes = need;
  }
  size_t off = 0;
  for (int i = 0; i < k; i++) {
    if (!st[i].host) continue;
    st[i].dev = (char *)n->bounce + off;
    off += (st[i].bytes + 255) & ~(size_t)255;
    if (in[i] && st[i].bytes &&
        cudaMemcpyAsync(st[i].dev, st[i].host, st[i].bytes, cudaMemcpyHostToDevice, n->stream) !=
            cudaSuccess)
      return comm_fail(c, TY_EINTERNAL, -1, "%s: staging a host buffer: %s", op,
                       cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}

/* After the collective finished: copies a staged receive span back. */
static int stage_out(comm_t *c, const stage_t *st, const char *op) {
  if (!st->host || !st->bytes) return 0;
  if (cudaMemcpy(st->host, st->dev, st->bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return comm_fail(c, TY_EINTERNAL, -1, "%s: copying the result to the host buffer: %s", op,
                     cudaGetErrorString(cudaGetLastError()));
  return 0;
}

static int all_equal(const size_t *counts, int world) {
  for (int r = 1; r < world; r++)
    if (counts[r] != counts[0]) return 0;
  return 1;
}

/* Queues the all_gather of elements of `dt` (counts in elements of esz
 * bytes) on the stream; device buffers. */
static ncclResult_t queue_all_gather(comm_t *c, const void *send, void *recv, const size_t *counts,
                                     ncclDataType_t dt, size_t esz) {
  nccl_t *n = c->impl;
  if (all_equal(counts, c->world))
    return ncclAllGather(send, recv, counts[0], dt, n->comm, n->stream);
  ncclResult_t res = ncclGroupStart();
  size_t d = 0;
  for (int r = 0; r < c->world && res == ncclSuccess; d += counts[r], r++) {
    if (!counts[r]) continue;
    const void *src = r == c->rank ? send : (const char *)recv + d * esz;
    res = ncclBroadcast(src, (char *)recv + d * esz, counts[r], dt, r, n->comm, n->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

static int nccl_all_gather(comm_t *c, const float *send, float *recv, const size_t *counts,
                           size_t total) {
  if (!total) return 0;
  stage_t st[2];
  const void *ptrs[2] = {send, recv};
  size_t bytes[2] = {counts[c->rank] * sizeof(float), total * sizeof(float)};
  int in[2] = {1, 0};
  int rc = stage_in(c, st, 2, ptrs, bytes, in, "all_gather");
  if (!rc)
    rc = finish(c, queue_all_gather(c, st[0].dev, st[1].dev, counts, ncclFloat, sizeof(float)),
                "all_gather");
  return rc ? rc : stage_out(c, &st[1], "all_gather");
}

static int nccl_all_gather_queue(comm_t *c, const void *send, void *recv, const size_t *counts,
                                 size_t elem_size) {
  size_t total = comm_displ(counts, c->world);
  if (!total) return 0;
  if (!on_device(send) || !on_device(recv))
    return comm_fail(c, TY_EINVAL, -1, "all_gather: a queued gather needs device buffers");
  ncclDataType_t dt = elem_size == 2 ? ncclBfloat16 : ncclFloat;
  int rc = enqueued(c, queue_all_gather(c, send, recv, counts, dt, elem_size), "all_gather");
  /* A non-blocking communicator takes its next call only once this one is
   * issued (the gather itself runs on). */
  return rc ? rc : wait_issued(c, c->impl, ty_mono_ms() + c->timeout_ms, "all_gather");
}

static void *nccl_stream(comm_t *c) {
  return ((nccl_t *)c->impl)->stream;
}

static int nccl_wait_event(comm_t *c, void *event, const char *what) {
  return poll_until(c, event_done, event, what);
}

static int nccl_drain(comm_t *c) {
  return poll_until(c, stream_done, ((nccl_t *)c->impl)->stream, "queued gathers");
}

/* Queues the float32 reduce_scatter on the stream; device buffers. */
static ncclResult_t queue_reduce_scatter(comm_t *c, const float *dsend, float *drecv,
                                         const size_t *counts) {
  nccl_t *n = c->impl;
  if (all_equal(counts, c->world))
    return ncclReduceScatter(dsend, drecv, counts[0], ncclFloat, ncclSum, n->comm, n->stream);
  ncclResult_t res = ncclGroupStart();
  size_t d = 0;
  for (int r = 0; r < c->world && res == ncclSuccess; d += counts[r], r++) {
    if (!counts[r]) continue;
    /* recvbuff is only written on the root. */
    float *dst = r == c->rank ? drecv : (float *)dsend + d;
    res = ncclReduce(dsend + d, dst, counts[r], ncclFloat, ncclSum, r, n->comm, n->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

static int nccl_reduce_scatter(comm_t *c, const float *send, float *recv, const size_t *counts,
                               size_t total) {
  if (!total) return 0;
  stage_t st[2];
  const void *ptrs[2] = {send, recv};
  size_t bytes[2] = {total * sizeof(float), counts[c->rank] * sizeof(float)};
  int in[2] = {1, 0};
  int rc = stage_in(c, st, 2, ptrs, bytes, in, "reduce_scatter");
  if (!rc) rc = finish(c, queue_reduce_scatter(c, st[0].dev, st[1].dev, counts), "reduce_scatter");
  return rc ? rc : stage_out(c, &st[1], "reduce_scatter");
}

static int nccl_reduce_scatter_queue(comm_t *c, float *send, float *recv, const size_t *counts,
                                     size_t total) {
  if (!total) return 0;
  if (!on_device(send) || !on_device(recv))
    return comm_fail(c, TY_EINVAL, -1,
                     "reduce_scatter: a queued reduce_scatter needs device buffers");
  int rc = enqueued(c, queue_reduce_scatter(c, send, recv, counts), "reduce_scatter");
  return rc ? rc : wait_issued(c, c->impl, ty_mono_ms() + c->timeout_ms, "reduce_scatter");
}

static int nccl_all_reduce(comm_t *c, float *buf, size_t count) {
  nccl_t *n = c->impl;
  if (!count) return 0;
  stage_t st;
  const void *ptrs[1] = {buf};
  size_t bytes[1] = {count * sizeof(float)};
  int in[1] = {1};
  int rc = stage_in(c, &st, 1, ptrs, bytes, in, "all_reduce");
  if (!rc)
    rc = finish(c, ncclAllReduce(st.dev, st.dev, count, ncclFloat, ncclSum, n->comm, n->stream),
                "all_reduce");
  return rc ? rc : stage_out(c, &st, "all_reduce");
}

static int nccl_broadcast(comm_t *c, float *buf, size_t count, int root) {
  nccl_t *n = c->impl;
  if (!count) return 0;
  stage_t st;
  const void *ptrs[1] = {buf};
  size_t bytes[1] = {count * sizeof(float)};
  int in[1] = {c->rank == root};
  int rc = stage_in(c, &st, 1, ptrs, bytes, in, "broadcast");
  if (!rc)
    rc = finish(c, ncclBroadcast(st.dev, st.dev, count, ncclFloat, root, n->comm, n->stream),
                "broadcast");
  return rc ? rc : stage_out(c, &st, "broadcast");
}

static int nccl_barrier(comm_t *c) {
  nccl_t *n = c->impl;
  return finish(c, ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat, ncclSum, n->comm, n->stream),
                "barrier");
}

static void nccl_release(nccl_t *n, int broken) {
  if (n->comm) {
    if (broken)
      ncclCommAbort(n->comm);
    else
      ncclCommDestroy(n->comm);
  }
  if (n->stream) cudaStreamDestroy(n->stream);
  if (n->computed) cudaEventDestroy(n->computed);
  mem_cuda_free(n->scratch);
  mem_cuda_free(n->bounce);
  free(n);
}

static void nccl_close(comm_t *c) {
  if (c->impl) nccl_release(c->impl, c->broken);
  c->impl = NULL;
}

static const comm_ops_t nccl_ops = {
    .name = "nccl",
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .all_gather_queue = nccl_all_gather_queue,
    .reduce_scatter_queue = nccl_reduce_scatter_queue,
    .stream = nccl_stream,
    .wait_event = nccl_wait_event,
    .drain = nccl_drain,
    .close = nccl_close,
};

/* Rank 0 publishes the id at path; the others read it, waiting for it. */
static int exchange_id(const char *path, int rank, ncclUniqueId *id, long long deadline, char *err,
                       size_t errlen) {
  if (rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, id, sizeof *id) != (ssize_t)sizeof *id || fsync(fd) || close(fd) ||
        rename(tmp, path)) {
      ty_errf(err, errlen, 0, "cannot publish the NCCL id at %s: %s", path, strerror(errno));
      if (fd >= 0) unlink(tmp);
      return TY_EUNAVAILABLE;
    }
    return 0;
  }
  for (;;) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      ssize_t got = read(fd, id, sizeof *id);
      close(fd);
      if (got == (ssize_t)sizeof *id) return 0;
    }
    if (ty_mono_ms() >= deadline) {
      return ty_errf(err, errlen, TY_EDEADLINE, "rank 0 did not publish the NCCL id at %s in time",
                     path);
    }
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
}

int comm_nccl_open(comm_t *c, const char *arg, char *err, size_t errlen) {
  if (strncmp(arg, "file:", 5) || !arg[5]) {
    return ty_errf(err, errlen, TY_EINVAL, "NCCL rendezvous 'nccl:%s' must be nccl:file:<path>",
                   arg);
  }
  const char *path = arg + 5;
  long long deadline = ty_mono_ms() + c->timeout_ms;
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess || ndev < 1) {
    return ty_errf(err, errlen, TY_EUNAVAILABLE, "NCCL backend: no CUDA device (%s)",
                   ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
  }
  int device;
  int rc = rankenv_gpu(c->rank, ndev, &device, err, errlen);
  if (rc) return rc;
  nccl_t *n = xcalloc(1, sizeof *n);
  n->device = device;
  if ((ce = cudaSetDevice(n->device)) != cudaSuccess ||
      (ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (ce = cudaEventCreateWithFlags(&n->computed, cudaEventDisableTiming)) != cudaSuccess ||
      (mem_cuda_alloc((void **)&n->scratch, sizeof(float)) && (ce = cudaErrorMemoryAllocation))) {
    ty_errf(err, errlen, 0, "NCCL backend: CUDA device %d: %s", n->device, cudaGetErrorString(ce));
    nccl_release(n, 0);
    return TY_EUNAVAILABLE;
  }
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclResult_t nr = ncclSuccess;
  if (c->rank == 0 && (nr = ncclGetUniqueId(&id)) != ncclSuccess) {
    ty_errf(err, errlen, 0, "ncclGetUniqueId: %s", ncclGetErrorString(nr));
    nccl_release(n, 0);
    return TY_EUNAVAILABLE;
  }
  rc = exchange_id(path, c->rank, &id, deadline, err, errlen);
  if (rc) {
    nccl_release(n, 0);
    return rc;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  nr = ncclCommInitRankConfig(&n->comm, c->world, id, c->rank, &config);
  c->impl = n;
  c->ops = &nccl_ops;
  if (nr != ncclSuccess && nr != ncclInProgress) {
    ty_errf(err, errlen, 0, "ncclCommInitRankConfig: %s", ncclGetErrorString(nr));
    n->comm = NULL;
    rc = TY_EUNAVAILABLE;
  } else {
    rc = wait_issued(c, n, deadline, "rendezvous");
    if (rc) ty_errf(err, errlen, 0, "%s", c->err);
  }
  if (c->rank == 0) unlink(path); /* every rank has used the id, or the job failed */
  if (rc) {
    nccl_release(n, rc != 0);
    c->impl = NULL;
    return rc;
  }
  return 0;
}
