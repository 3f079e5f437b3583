/* comm.h - collective communication between the ranks of one job.
 *
 * One interface, three implementations chosen by the rendezvous string:
 *   self         one rank; every collective is a copy or nothing
 *   shm:<name>   CPU ranks on one host, through one POSIX shared-memory
 *                segment (/dev/shm/trainyard-<name>) and futex barriers
 *   gloo:file:<dir>
 *                CPU ranks on several hosts, over Gloo's TCP transport;
 *                the ranks exchange addresses through files in <dir>, which
 *                every rank must see (a shared file system). Each listens on
 *                RANKENV_GLOO_HOST (unset: the machine's hostname). Sums
 *                are made as shm makes them, so results are bitwise equal.
 *                Only where trainyard was built with Gloo.
 *   nccl:file:<path>
 *                GPU ranks (NCCL); rank 0 publishes the NCCL unique id in
 *                <path>, which every rank must see (a shared file system
 *                for several hosts). Only where trainyard was built with
 *                CUDA and NCCL.
 *
 * Buffers are fp32 in the memory the backend works on: host memory for self
 * and shm; device memory for nccl, which also takes host buffers (staged
 * through a device buffer of its own: the training loop's adapter
 * gradients and loss, a few MiB a step). Every rank must call the same collectives
 * in the same order with the same counts array (shm checks the element
 * totals and fails every rank with TY_EINVAL when they disagree).
 *
 * Uneven shards: all_gather and reduce_scatter take counts[world_size], the
 * number of elements of each rank's block; blocks are laid out in rank order
 * (rank r's block starts at the sum of counts[0..r-1]). comm_shard_rows()
 * gives the dim-0 split trainyard uses everywhere: the first rows % N ranks
 * get one extra row.
 *
 * Failure: a collective that cannot complete returns a negative TY_E* code
 * and comm_error() says why, naming the rank at fault:
 *   TY_EABORTED   a peer died or left (shm sees it within ~0.1 s)
 *   TY_EDEADLINE  a live peer did not arrive within the timeout
 * After a failure the communicator is broken: every later call returns the
 * same code at once; close it. The timeout is RANKENV_COMM_TIMEOUT_MS
 * (default 300000 ms; it also bounds the rendezvous).
 *
 * Not thread-safe: one thread drives a communicator. With shm that thread
 * must live as long as the communicator (its liveness is how peers tell
 * the process is alive). */
#ifndef TY_WORKER_COMM_H
#define TY_WORKER_COMM_H

#include <stddef.h>

typedef struct comm comm_t;

/* Default and environment override of the collective timeout. */
#define COMM_TIMEOUT_MS_DEFAULT 300000

/* Opens rank `rank` of `world_size` on `rendezvous` ("self", "shm:<name>",
 * "gloo:file:<dir>", "nccl:file:<path>"); blocks until every rank has joined (or the timeout).
 * "self" requires world_size 1. A shm name is 1-200 characters of
 * [A-Za-z0-9._-]. On success *out is the caller's (comm_close). On failure
 * returns a TY_E* code and, when err is not NULL, writes a message naming
 * what was wrong into err[errlen]. */
int comm_open(comm_t **out, const char *rendezvous, int rank, int world_size, char *err,
              size_t errlen);

/* The same, from the worker contract's environment: RANKENV_RENDEZVOUS
 * (default "self" when RANKENV_WORLD_SIZE is unset or 1), RANKENV_RANK,
 * RANKENV_WORLD_SIZE. */
int comm_open_env(comm_t **out, char *err, size_t errlen);

/* Leaves the job and frees the communicator; accepts NULL. With shm, the
 * segment's name is already gone once every rank has joined; a rank closing
 * after a failed rendezvous removes it. */
void comm_close(comm_t *c);

int comm_rank(const comm_t *c);
int comm_world_size(const comm_t *c);
/* "self", "shm", "gloo" or "nccl". */
const char *comm_backend(const comm_t *c);
/* Why the last call failed ("" when none did); valid until the next call. */
const char *comm_error(const comm_t *c);
/* The rank a failure was blamed on (a dead, departed or late peer), or -1. */
int comm_failed_rank(const comm_t *c);

/* send: counts[rank] elements. recv: sum(counts) elements, every rank's
 * block in rank order. send may be recv's own block (in place). */
int comm_all_gather(comm_t *c, const float *send, float *recv, const size_t *counts);

/* send: sum(counts) elements (block r is destined for rank r). recv:
 * counts[rank] elements, the sum over ranks of their block `rank`. shm adds
 * in rank order ((r0 + r1) + r2 ...), so a run is bitwise repeatable; NCCL
 * chooses its own order. recv may be send's own block (in place). */
int comm_reduce_scatter(comm_t *c, const float *send, float *recv, const size_t *counts);

/* In place: buf[count] becomes the element-wise sum over ranks; with shm
 * every rank gets bitwise the same values (each element is summed once, in
 * rank order, by one rank). */
int comm_all_reduce(comm_t *c, float *buf, size_t count);

/* In place: every rank's buf[count] becomes root's. */
int comm_broadcast(comm_t *c, float *buf, size_t count, int root);

int comm_barrier(comm_t *c);

/* --- Queued collectives, for overlapping communication with computation
 * (the units of worker/dist/prefetch.h). Gathers move bytes, never add them, so
 * any dtype goes: elem_size is 2 (bfloat16) or 4 (float32). --- */

/* The all_gather of comm_all_gather on elements of elem_size bytes, queued
 * rather than waited for. nccl queues it on the communicator's stream
 * (comm_stream) and returns: recv may be read only after an event recorded
 * on that stream after it has completed (comm_wait_event) or after
 * comm_drain. self and shm complete it before returning (host buffers;
 * shm needs every counts[r] x elem_size to be a multiple of 4). */
int comm_all_gather_queue(comm_t *c, const void *send, void *recv, const size_t *counts,
                          size_t elem_size);

/* The reduce_scatter of comm_reduce_scatter (float32 sums), queued rather
 * than waited for, as comm_all_gather_queue is: nccl queues it on
 * comm_stream (device buffers; send is read only once the stream reaches
 * it), self and shm complete it before returning. For the gradients of
 * full training (worker/dist/prefetch.h's prefetch_scatter_add). */
int comm_reduce_scatter_queue(comm_t *c, float *send, float *recv, const size_t *counts);

/* The nccl communicator's CUDA stream (a cudaStream_t); NULL for self and
 * shm. */
void *comm_stream(comm_t *c);

/* Waits until `event` (a cudaEvent_t) has completed, polling, under the
 * collective timeout and NCCL's asynchronous errors as a blocking
 * collective is; `what` names the wait in the error. self and shm return 0
 * at once (their gathers are done already). */
int comm_wait_event(comm_t *c, void *event, const char *what);

/* Waits for everything queued on the communicator, as comm_wait_event. */
int comm_drain(comm_t *c);

/* The dim-0 shard of `rows` rows that rank `rank` of `world_size` holds:
 * the first rows % world_size ranks get rows / world_size + 1 rows, the
 * rest rows / world_size. */
void comm_shard_rows(size_t rows, int world_size, int rank, size_t *first_row, size_t *nrows);

/* counts[world_size] for a dim-0 sharded tensor of `rows` rows of
 * `row_elems` elements each (the counts array of all_gather and
 * reduce_scatter). */
void comm_shard_counts(size_t rows, size_t row_elems, int world_size, size_t *counts);

/* Element offset of rank r's block: sum(counts[0..r-1]). */
size_t comm_displ(const size_t *counts, int r);

/* Removes the shm segment of a "shm:<name>" rendezvous if it still exists
 * (a launcher cleaning up after ranks that died before joining). Returns 0
 * when it removed one, 1 when there was none, TY_EINVAL for a rendezvous
 * that is not shm:, or another TY_E* code. */
int comm_shm_remove(const char *rendezvous);

/* The /dev/shm name ("/trainyard-<name>") of a "shm:<name>" rendezvous into
 * out[outlen]; TY_EINVAL with a message in err when the name is invalid. */
int comm_shm_path(const char *rendezvous, char *out, size_t outlen, char *err, size_t errlen);

#endif
