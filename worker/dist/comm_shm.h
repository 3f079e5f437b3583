/* comm_shm.h - the shared-memory backend's segment layout and
 * synchronisation, shared by comm_shm.c (rendezvous, barrier, liveness) and
 * comm_shm_coll.c (the chunked collectives). Internal to comm.
 *
 * Segment /dev/shm/trainyard-<name>:
 *   shm_hdr_t | shm_rank_t[world] | pad to 4 KiB | data
 * data holds, per rank, two halves of half_bytes each:
 *   rank r, half h at data + (2 r + h) * half_bytes.
 * Collectives run in rounds; round k of the communicator's life uses half
 * k % 2 and ends its writes before a barrier, and every rank finishes its
 * reads of round k before it enters any barrier of round k + 1. So the
 * writes of round k + 2 into the same half never race a slow reader, with
 * one barrier per round for gathers and broadcasts. The round counter runs
 * across collectives (every rank calls the same sequence). */
#ifndef TY_WORKER_COMM_SHM_H
#define TY_WORKER_COMM_SHM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/dist/comm_impl.h"

enum { SHM_ABSENT = 0, SHM_JOINED = 1, SHM_LEFT = 2 };
/* Why the job's communicator failed (shm_hdr_t.fail_kind). */
enum { SHM_FAIL_DIED = 1, SHM_FAIL_LEFT, SHM_FAIL_TIMEOUT, SHM_FAIL_MISMATCH };
/* Collective kinds in the per-round metadata, checked across ranks. */
enum {
  SHM_OP_ALL_GATHER = 1,
  SHM_OP_REDUCE_SCATTER,
  SHM_OP_ALL_REDUCE,
  SHM_OP_BROADCAST,
  SHM_OP_BARRIER
};

/* What a rank says about the collective it starts (one per half). */
typedef struct {
  _Atomic uint32_t op;
  _Atomic uint32_t arg;   /* broadcast root, else 0 */
  _Atomic uint64_t total; /* elements: sum(counts) or count */
  _Atomic uint64_t seq;   /* collectives started before this one */
} shm_meta_t;

typedef struct {
  _Atomic uint32_t state; /* SHM_ABSENT, SHM_JOINED, SHM_LEFT */
  _Atomic int32_t pid;
  _Atomic uint64_t arrivals; /* barriers this rank has entered */
  /* Held by the rank's thread while it is joined; robust, so a peer's
   * trylock answers EOWNERDEAD once the process is dead, zombie or not. */
  pthread_mutex_t alive;
  shm_meta_t meta[2];
} __attribute__((aligned(64))) shm_rank_t;

typedef struct {
  _Atomic uint32_t magic; /* SHM_MAGIC, stored last by rank 0 */
  uint32_t version;
  int32_t world;
  int32_t pad0;
  uint64_t half_bytes; /* bytes of one rank's half; a multiple of 4 KiB */
  uint64_t size;       /* bytes of the whole segment */
  _Atomic uint32_t joined;
  _Atomic uint32_t fail_kind;  /* 0, or SHM_FAIL_* */
  _Atomic int32_t fail_rank;   /* the rank blamed */
  _Atomic int32_t fail_pid;    /* its pid, for SHM_FAIL_DIED */
  _Atomic uint32_t fail_claim; /* 0 until one rank records the failure */
  _Atomic uint32_t bar_count;  /* ranks inside the current barrier */
  _Atomic uint32_t bar_gen;    /* futex word: bumped when a barrier opens */
} shm_hdr_t;

typedef struct {
  char path[256]; /* "/trainyard-<name>" */
  shm_hdr_t *hdr;
  shm_rank_t *ranks;
  char *data;
  size_t map_size;
  size_t half_bytes;
  size_t half_floats;
  int all_joined;
  int mapped; /* created or attached: the name is this job's to remove */
  int holds_alive;
  uint64_t round; /* rounds run so far (selects the half) */
  uint64_t epoch; /* barriers entered so far */
  uint64_t seq;   /* collectives started so far */
  const char *op; /* name of the running collective, for messages */
  size_t *displ;  /* world scratch offsets */
} shm_t;

/* Rank r's half for the current round (s->round). */
static inline float *shm_slot(shm_t *s, int r) {
  return (float *)(void *)(s->data + ((size_t)r * 2 + (s->round & 1)) * s->half_bytes);
}

/* Starts a collective: records what this rank is calling in the metadata of
 * the current round's half, for shm_sync(first = 1) to compare. */
void shm_begin(comm_t *c, uint32_t op, uint32_t arg, uint64_t total, const char *name);

/* Ends the current round's writes: the barrier (failing with the rank to
 * blame when a peer died, left or is late), then, when `first`, checks that
 * every rank started the same collective. Does not advance s->round. */
int shm_sync(comm_t *c, int first);

/* Leaves the job: comm_ops_t.close of the shm backend. */
void shm_close(comm_t *c);

/* The collectives (comm_shm_coll.c). */
extern const comm_ops_t comm_shm_ops;

#endif
