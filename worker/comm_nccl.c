/* comm_nccl.c - the NCCL backend (GPU ranks): buffers are device memory on
 * the rank's device (rank % visible devices). Rendezvous "nccl:file:<path>":
 * rank 0 writes the NCCL unique id to <path> (atomically, by rename) and
 * removes it once every rank has joined; the others poll for it.
 *
 * The communicator is non-blocking, and each collective waits for its
 * stream by polling, so a dead or stuck peer turns into TY_EDEADLINE after
 * TRAINYARD_COMM_TIMEOUT_MS (the communicator is then aborted) or into
 * TY_EABORTED when NCCL reports the failure itself; NCCL cannot say which
 * peer it was, so comm_failed_rank() is -1. Uneven all_gather and
 * reduce_scatter are grouped broadcasts and reduces, one per rank. */
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

#include "api/errors.h"
#include "common/xalloc.h"
#include "worker/comm_impl.h"

typedef struct {
  ncclComm_t comm;
  cudaStream_t stream;
  float *scratch; /* one float on the device, for the barrier */
  int device;
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

/* Checks an enqueue's result, then polls the stream to completion. */
static int finish(comm_t *c, ncclResult_t enq, const char *op) {
  nccl_t *n = c->impl;
  long long deadline = ty_mono_ms() + c->timeout_ms;
  if (enq != ncclSuccess && enq != ncclInProgress) {
    ncclCommAbort(n->comm);
    n->comm = NULL;
    return comm_fail(c, TY_EABORTED, -1, "%s: %s", op, ncclGetErrorString(enq));
  }
  int rc = wait_issued(c, n, deadline, op);
  if (rc) return rc;
  for (;;) {
    cudaError_t e = cudaStreamQuery(n->stream);
    if (e == cudaSuccess) return 0;
    if (e != cudaErrorNotReady)
      return comm_fail(c, TY_EINTERNAL, -1, "%s: CUDA: %s", op, cudaGetErrorString(e));
    rc = wait_issued(c, n, deadline, op); /* async errors, and the deadline */
    if (rc) return rc;
    nap();
  }
}

static int all_equal(const size_t *counts, int world) {
  for (int r = 1; r < world; r++)
    if (counts[r] != counts[0]) return 0;
  return 1;
}

static int nccl_all_gather(comm_t *c, const float *send, float *recv, const size_t *counts,
                           size_t total) {
  nccl_t *n = c->impl;
  if (!total) return 0;
  if (all_equal(counts, c->world))
    return finish(c, ncclAllGather(send, recv, counts[0], ncclFloat, n->comm, n->stream),
                  "all_gather");
  ncclResult_t res = ncclGroupStart();
  size_t d = 0;
  for (int r = 0; r < c->world && res == ncclSuccess; d += counts[r], r++) {
    if (!counts[r]) continue;
    const float *src = r == c->rank ? send : recv + d;
    res = ncclBroadcast(src, recv + d, counts[r], ncclFloat, r, n->comm, n->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  return finish(c, res != ncclSuccess ? res : end, "all_gather");
}

static int nccl_reduce_scatter(comm_t *c, const float *send, float *recv, const size_t *counts,
                               size_t total) {
  nccl_t *n = c->impl;
  if (!total) return 0;
  if (all_equal(counts, c->world))
    return finish(c,
                  ncclReduceScatter(send, recv, counts[0], ncclFloat, ncclSum, n->comm, n->stream),
                  "reduce_scatter");
  ncclResult_t res = ncclGroupStart();
  size_t d = 0;
  for (int r = 0; r < c->world && res == ncclSuccess; d += counts[r], r++) {
    if (!counts[r]) continue;
    /* recvbuff is only written on the root. */
    float *dst = r == c->rank ? recv : (float *)send + d;
    res = ncclReduce(send + d, dst, counts[r], ncclFloat, ncclSum, r, n->comm, n->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  return finish(c, res != ncclSuccess ? res : end, "reduce_scatter");
}

static int nccl_all_reduce(comm_t *c, float *buf, size_t count) {
  nccl_t *n = c->impl;
  if (!count) return 0;
  return finish(c, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, n->comm, n->stream),
                "all_reduce");
}

static int nccl_broadcast(comm_t *c, float *buf, size_t count, int root) {
  nccl_t *n = c->impl;
  if (!count) return 0;
  return finish(c, ncclBroadcast(buf, buf, count, ncclFloat, root, n->comm, n->stream),
                "broadcast");
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
  if (n->scratch) cudaFree(n->scratch);
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
  nccl_t *n = xcalloc(1, sizeof *n);
  n->device = c->rank % ndev;
  int rc = 0;
  if ((ce = cudaSetDevice(n->device)) != cudaSuccess ||
      (ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (ce = cudaMalloc((void **)&n->scratch, sizeof(float))) != cudaSuccess) {
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
