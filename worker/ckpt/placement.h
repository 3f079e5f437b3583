/* placement.h - where a rank's weight shards live ("device" memory), kept
 * apart from host staging so that a GPU backend can slot in.
 *
 * The loader stages bytes in host memory and hands them to a placement:
 * alloc a shard, copy a host bucket into it at an offset, copy between two
 * placement buffers, release. Every alloc and release goes through
 * placement_alloc / placement_release, which keep the placement's own
 * high-water mark (the device peak a rank reports). The CPU placement is
 * plain host memory. */
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
  void (*release)(placement_t *p, void *ptr, size_t n);
  /* Host src (n bytes) -> placement memory dst + off. */
  int (*copy_in)(placement_t *p, void *dst, size_t off, const void *src, size_t n);
  /* Placement memory src + src_off -> placement memory dst + dst_off. */
  int (*copy_within)(placement_t *p, void *dst, size_t dst_off, const void *src, size_t src_off,
                     size_t n);
} placement_ops_t;

struct placement {
  const placement_ops_t *ops;
  void *ctx;       /* the backend's own state (device index, stream, ...) */
  uint64_t in_use; /* bytes allocated now */
  uint64_t peak;   /* high-water mark of in_use, in bytes */
};

/* Host memory as the "device". */
void placement_cpu_init(placement_t *p);

/* Accounting wrappers: use these, not p->ops directly. */
int placement_alloc(placement_t *p, size_t n, void **out);
void placement_release(placement_t *p, void *ptr, size_t n);

#endif
