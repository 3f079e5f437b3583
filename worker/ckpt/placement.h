/* placement.h - where a rank's weight shards live ("device" memory), kept
 * apart from host staging so that a GPU backend can slot in.
 *
 * The loader stages bytes in host memory and hands them to a placement:
 * alloc a shard, copy a host bucket into it at an offset, copy between two
 * placement buffers, release. Every alloc and release goes through
 * placement_alloc / placement_release, which keep the placement's own
 * high-water mark (the device peak a rank reports). The CPU placement is
 * plain host memory.
 *
 * When bytes are there: copy_in, stage_in and copy_within may only queue
 * their copy (the CUDA placement does, on its own stream, so that the
 * loader reads and converts the next chunk while the last one crosses the
 * bus). The copies of one placement run in the order they were queued;
 * placement_finish is the completion point: when it returns 0, every byte
 * queued so far is in placement memory. Whoever queues copies calls it
 * before it hands that memory on (the loader: before loader_* return, on
 * success and on error alike), and placement_release waits for the queue
 * itself, so that no copy is ever in flight into memory being freed. */
#ifndef TY_WORKER_PLACEMENT_H
#define TY_WORKER_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

typedef struct placement placement_t;

/* What a worker built without the CUDA toolkit says to a device cuda job. */
#define PLACEMENT_NO_CUDA_MSG                                                      \
  "device cuda: this worker was built without the CUDA toolkit; rebuild where one " \
  "is installed, or use device cpu"

typedef struct {
  const char *name; /* "cpu", "cuda", ... */
  /* n bytes of placement memory into *out (n may be 0: *out may then be
   * NULL). 0 or TY_EEXHAUSTED. */
  int (*alloc)(placement_t *p, size_t n, void **out);
  /* Called by placement_release once the queued copies are done. */
  void (*release)(placement_t *p, void *ptr, size_t n);
  /* Host src (n bytes) -> placement memory dst + off. src is read before
   * it returns (the caller may reuse it at once); dst holds the bytes by
   * the next finish. */
  int (*copy_in)(placement_t *p, void *dst, size_t off, const void *src, size_t n);
  /* Placement memory src + src_off -> placement memory dst + dst_off, after
   * every copy queued before it. */
  int (*copy_within)(placement_t *p, void *dst, size_t dst_off, const void *src, size_t src_off,
                     size_t n);
  /* Optional (NULL: every copy is done when it returns). Waits until every
   * copy queued so far is done: 0, or TY_EINTERNAL when one failed. */
  int (*finish)(placement_t *p);
  /* Optional pair (NULL: the caller stages in its own memory and calls
   * copy_in), so that a caller reads or converts straight into the memory
   * the copy leaves from. stage lends the placement's next free host
   * staging buffer, *buf of *cap bytes (its earlier copy waited for; *cap
   * the same every time); the
   * caller writes up to *cap bytes there and hands it back with stage_in,
   * which queues its first n bytes -> dst + off. The buffer is the
   * placement's again once stage_in is called; a buffer lent and never
   * handed back is simply lent again. No other op on p in between. */
  int (*stage)(placement_t *p, void **buf, size_t *cap);
  int (*stage_in)(placement_t *p, void *dst, size_t off, size_t n);
} placement_ops_t;

struct placement {
  const placement_ops_t *ops;
  void *ctx;       /* the backend's own state (device index, stream, ...) */
  uint64_t in_use; /* bytes allocated now */
  uint64_t peak;   /* high-water mark of in_use, in bytes */
};

/* Host memory as the "device": every copy done when it returns. */
void placement_cpu_init(placement_t *p);

/* Accounting wrappers: use these, not p->ops directly. placement_release
 * waits for the queued copies (placement_finish) before it releases. */
int placement_alloc(placement_t *p, size_t n, void **out);
void placement_release(placement_t *p, void *ptr, size_t n);

/* The completion point (ops->finish; 0 at once where there is none). */
int placement_finish(placement_t *p);

#endif
