/* sim_nccl.c - NCCL on the simulated device. A unique id names a shared
 * memory segment (made by ncclGetUniqueId, unlinked once every rank has
 * joined). Each rank has a slot in it; a collective goes in chunks that fit
 * a slot, and each chunk is one step: a rank waits until every rank is done
 * reading the previous step's slots, writes its part and a header saying
 * which call it is, and once every rank has written, checks that all issued
 * the same call (a mismatch aborts, naming both) and computes its own result
 * in rank order. A collective is an op on its stream that polls, so a
 * missing peer shows as a stream that is not ready, as on GPUs. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "cudasim.h"

#define MAX_RANKS 8
#define SLOT_BYTES ((size_t)16 << 20)

enum { K_ALLREDUCE = 1, K_BROADCAST, K_REDUCE, K_REDUCE_SCATTER, K_ALLGATHER };
static const char *const g_kind_names[] = {"?",      "AllReduce",     "Broadcast",
                                           "Reduce", "ReduceScatter", "AllGather"};

typedef struct {
  int kind, root, dt;
  size_t count;
  uint64_t step;
} call_t;

typedef struct {
  atomic_int nranks, joined, aborted;
  atomic_uint_fast64_t arrived[MAX_RANKS], consumed[MAX_RANKS];
  call_t call[MAX_RANKS];
} seg_t;

#define SEG_HEADER ((sizeof(seg_t) + 4095) / 4096 * 4096)
#define SEG_BYTES (SEG_HEADER + MAX_RANKS * SLOT_BYTES)

struct ncclComm {
  seg_t *seg;
  char *slots;
  int rank, nranks;
  uint64_t step; /* chunks completed */
  int aborted;
};

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static atomic_int counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/tycudasim-nccl-%d-%d-%ld", (int)getpid(),
           atomic_fetch_add(&counter, 1), (long)ts.tv_nsec);
  int fd = shm_open(id->internal, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  int bad = ftruncate(fd, (off_t)SEG_BYTES);
  close(fd);
  if (bad) {
    shm_unlink(id->internal);
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
  *out = NULL;
  if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  id.internal[sizeof id.internal - 1] = '\0';
  int fd = shm_open(id.internal, O_RDWR, 0);
  if (fd < 0) return ncclSystemError;
  void *m = mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return ncclSystemError;
  struct ncclComm *c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  c->seg = m;
  c->slots = (char *)m + SEG_HEADER;
  c->rank = rank;
  c->nranks = nranks;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&c->seg->nranks, &expect, nranks) && expect != nranks) {
    fprintf(stderr, "cudasim: NCCL rank %d joined with %d ranks, another with %d\n", rank, nranks,
            expect);
    munmap(m, SEG_BYTES);
    free(c);
    return ncclInvalidUsage;
  }
  if (atomic_fetch_add(&c->seg->joined, 1) + 1 == nranks) shm_unlink(id.internal);
  *out = c;
  return config && !config->blocking ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  ncclResult_t r = ncclCommInitRankConfig(out, nranks, id, rank, NULL);
  if (r != ncclSuccess) return r;
  for (int s = 0; atomic_load(&(*out)->seg->joined) < nranks; s++) {
    if (s > sim_hang_seconds() * 20000) return ncclSystemError;
    sim_nap();
  }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
  if (!c) return ncclInvalidArgument;
  if (c->aborted || atomic_load(&c->seg->aborted))
    *state = ncclRemoteError;
  else if (atomic_load(&c->seg->joined) < c->nranks)
    *state = ncclInProgress;
  else
    *state = ncclSuccess;
  return ncclSuccess;
}

/* Queued ops of an aborted communicator complete at once (doing nothing),
 * so the device can be drained before the communicator goes. */
static void comm_release(struct ncclComm *c) {
  sim_device_sync();
  munmap(c->seg, SEG_BYTES);
  free(c);
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  c->aborted = 1;
  atomic_store(&c->seg->aborted, 1);
  comm_release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  comm_release(c); /* its queued collectives finish first */
  return ncclSuccess;
}

static int g_group;
ncclResult_t ncclGroupStart(void) {
  g_group++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (g_group <= 0) return ncclInvalidUsage;
  g_group--;
  return ncclSuccess;
}

/* ---- one collective: an op that polls ---- */

typedef struct {
  struct ncclComm *c;
  int kind, root, dt;
  size_t esz;
  const char *send;
  char *recv;
  size_t count; /* AllGather: per rank sent; ReduceScatter: per rank received */
  size_t lo;    /* elements done */
  int posted;   /* this chunk's part is in the slot */
  int chunks;   /* chunks done (a zero-count call is one empty chunk) */
  char what[64];
} coll_t;

static char *slot(struct ncclComm *c, int r) {
  return c->slots + (size_t)r * SLOT_BYTES;
}
static const float *fslot(struct ncclComm *c, int r) {
  return (const float *)(const void *)slot(c, r);
}

static size_t chunk_of(const coll_t *o) {
  size_t per = SLOT_BYTES / o->esz;
  return o->kind == K_REDUCE_SCATTER ? per / (size_t)o->c->nranks : per;
}

static void post(coll_t *o, size_t lo, size_t n, uint64_t step) {
  struct ncclComm *c = o->c;
  char *mine = slot(c, c->rank);
  size_t e = o->esz;
  switch (o->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
    case K_ALLGATHER:
      memcpy(mine, o->send + lo * e, n * e);
      break;
    case K_BROADCAST:
      if (c->rank == o->root) memcpy(mine, o->send + lo * e, n * e);
      break;
    case K_REDUCE_SCATTER:
      for (int q = 0; q < c->nranks; q++)
        memcpy(mine + (size_t)q * n * e, o->send + ((size_t)q * o->count + lo) * e, n * e);
      break;
  }
  c->seg->call[c->rank] = (call_t){o->kind, o->root, o->dt, o->count, step};
}

static void compute(coll_t *o, size_t lo, size_t n) {
  struct ncclComm *c = o->c;
  int R = c->nranks, me = c->rank;
  size_t e = o->esz;
  float *out = (float *)(void *)o->recv; /* the sums: float32 only */
  switch (o->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
      if (o->kind == K_REDUCE && me != o->root) break;
      for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int q = 0; q < R; q++) s += fslot(c, q)[i];
        out[lo + i] = s;
      }
      break;
    case K_BROADCAST:
      memcpy(o->recv + lo * e, slot(c, o->root), n * e);
      break;
    case K_ALLGATHER:
      for (int q = 0; q < R; q++)
        memcpy(o->recv + ((size_t)q * o->count + lo) * e, slot(c, q), n * e);
      break;
    case K_REDUCE_SCATTER:
      for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int q = 0; q < R; q++) s += fslot(c, q)[(size_t)me * n + i];
        out[lo + i] = s;
      }
      break;
  }
}

static int coll_run(void *arg) {
  coll_t *o = arg;
  struct ncclComm *c = o->c;
  seg_t *g = c->seg;
  for (;;) {
    if (c->aborted || atomic_load(&g->aborted)) return 1; /* finishes, failed */
    if (o->chunks && o->lo >= o->count) return 1;
    size_t n = o->count - o->lo < chunk_of(o) ? o->count - o->lo : chunk_of(o);
    uint64_t step = c->step + 1;
    if (!o->posted) {
      for (int q = 0; q < c->nranks; q++)
        if (atomic_load(&g->consumed[q]) < step - 1) return 0;
      post(o, o->lo, n, step);
      atomic_store(&g->arrived[c->rank], step);
      o->posted = 1;
    }
    for (int q = 0; q < c->nranks; q++)
      if (atomic_load(&g->arrived[q]) < step) return 0;
    const call_t *me = &g->call[c->rank];
    for (int q = 0; q < c->nranks; q++) {
      const call_t *p = &g->call[q];
      if (p->kind != me->kind || p->count != me->count || p->root != me->root || p->dt != me->dt)
        sim_fatal(
            "NCCL step %llu: rank %d issued %s(count %zu, type %d, root %d) while rank %d "
            "issued %s(count %zu, type %d, root %d)",
            (unsigned long long)step, c->rank, g_kind_names[me->kind], me->count, me->dt, me->root,
            q, g_kind_names[p->kind], p->count, p->dt, p->root);
    }
    compute(o, o->lo, n);
    atomic_store(&g->consumed[c->rank], step);
    c->step = step;
    o->posted = 0;
    o->lo += n;
    o->chunks++;
  }
}

static ncclResult_t queue_coll(int kind, const void *send, void *recv, size_t count,
                               ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t c,
                               cudaStream_t s) {
  if (!c || c->aborted) return ncclInvalidUsage;
  size_t esz = dt == ncclFloat32                         ? 4
               : dt == ncclBfloat16 || dt == ncclFloat16 ? 2
               : dt == ncclUint8 || dt == ncclInt8       ? 1
                                                         : 0;
  int reduces = kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCE_SCATTER;
  if (!esz || op != ncclSum || (reduces && dt != ncclFloat32)) return ncclInvalidArgument;
  if (root < 0 || root >= c->nranks) return ncclInvalidArgument;
  size_t R = (size_t)c->nranks, in = count, out = count;
  if (kind == K_ALLGATHER) out = count * R;
  if (kind == K_REDUCE_SCATTER) in = count * R;
  char what[64];
  snprintf(what, sizeof what, "nccl%s send", g_kind_names[kind]);
  if (in && (kind != K_BROADCAST || c->rank == root)) sim_require_device(send, in * esz, what);
  snprintf(what, sizeof what, "nccl%s recv", g_kind_names[kind]);
  if (out && (kind != K_REDUCE || c->rank == root)) sim_require_device(recv, out * esz, what);
  coll_t *o = calloc(1, sizeof *o);
  if (!o) return ncclSystemError;
  *o = (coll_t){c, kind, root, (int)dt, esz, send, recv, count, 0, 0, 0, ""};
  snprintf(o->what, sizeof o->what, "nccl%s on rank %d of %d", g_kind_names[kind], c->rank,
           c->nranks);
  sim_enqueue(s, o->what, coll_run, o, free);
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return queue_coll(K_ALLREDUCE, send, recv, count, dt, op, 0, c, s);
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root,
                           ncclComm_t c, cudaStream_t s) {
  return queue_coll(K_BROADCAST, send, recv, count, dt, ncclSum, root, c, s);
}
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
  return queue_coll(K_REDUCE, send, recv, count, dt, op, root, c, s);
}
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return queue_coll(K_REDUCE_SCATTER, send, recv, recvcount, dt, op, 0, c, s);
}
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt,
                           ncclComm_t c, cudaStream_t s) {
  return queue_coll(K_ALLGATHER, send, recv, sendcount, dt, ncclSum, 0, c, s);
}
