/* comm_impl.h - what the comm backends (comm_self.c, comm_shm.c,
 * comm_gloo.cc, comm_nccl.c) share with the dispatcher in comm.c. Not for other modules:
 * they use comm.h. */
#ifndef TY_WORKER_COMM_IMPL_H
#define TY_WORKER_COMM_IMPL_H

#include <stddef.h>

#include "common/clock.h"
#include "worker/dist/comm.h"

/* One backend. The dispatcher has already checked the arguments (non-NULL
 * buffers where counts are non-zero, a valid root) and that the
 * communicator is not broken; `total` is sum(counts). */
typedef struct {
  const char *name;
  int (*all_gather)(comm_t *c, const float *send, float *recv, const size_t *counts, size_t total);
  int (*reduce_scatter)(comm_t *c, const float *send, float *recv, const size_t *counts,
                        size_t total);
  int (*all_reduce)(comm_t *c, float *buf, size_t count);
  int (*broadcast)(comm_t *c, float *buf, size_t count, int root);
  int (*barrier)(comm_t *c);
  /* Optional (NULL: the dispatcher runs comm_all_gather_queue as a blocking
   * all_gather, and the waits return 0). */
  int (*all_gather_queue)(comm_t *c, const void *send, void *recv, const size_t *counts,
                          size_t elem_size);
  /* Optional (NULL: comm_reduce_scatter_queue runs reduce_scatter). */
  int (*reduce_scatter_queue)(comm_t *c, float *send, float *recv, const size_t *counts,
                              size_t total);
  void *(*stream)(comm_t *c);
  int (*wait_event)(comm_t *c, void *event, const char *what);
  int (*drain)(comm_t *c);
  /* Frees c->impl (the dispatcher frees c itself). */
  void (*close)(comm_t *c);
} comm_ops_t;

struct comm {
  const comm_ops_t *ops;
  int rank, world;
  int broken;      /* 0, or the TY_E* code every later call returns */
  int failed_rank; /* the rank a failure was blamed on, or -1 */
  int timeout_ms;  /* RANKENV_COMM_TIMEOUT_MS */
  char err[512];
  void *impl; /* the backend's state */
};

/* Each backend's open: fills c->ops and c->impl, or returns a TY_E* code
 * with a message in err. `arg` is the rendezvous after its "shm:" or
 * "nccl:" prefix. */
int comm_self_open(comm_t *c, char *err, size_t errlen);
int comm_shm_open(comm_t *c, const char *arg, char *err, size_t errlen);
#ifdef TRAINYARD_HAVE_GLOO
int comm_gloo_open(comm_t *c, const char *arg, char *err, size_t errlen);
#endif
#ifdef TRAINYARD_HAVE_NCCL
int comm_nccl_open(comm_t *c, const char *arg, char *err, size_t errlen);
#endif

/* Marks c broken with `code`, blaming `rank` (-1: none), and formats the
 * message into c->err. Returns code. */
int comm_fail(comm_t *c, int code, int rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
