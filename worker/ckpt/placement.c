/* placement.c - placement accounting and the CPU placement (host memory). */
#include "worker/ckpt/placement.h"

#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

int placement_alloc(placement_t *p, size_t n, void **out) {
  int rc = p->ops->alloc(p, n, out);
  if (rc) return rc;
  p->in_use += n;
  if (p->in_use > p->peak) p->peak = p->in_use;
  return 0;
}

void placement_release(placement_t *p, void *ptr, size_t n) {
  if (!ptr && !n) return;
  /* A failed copy is the loader's to report (its own finish); here only
   * the wait matters: nothing may still be copied into ptr. */
  (void)placement_finish(p);
  p->ops->release(p, ptr, n);
  p->in_use -= n;
}

int placement_finish(placement_t *p) {
  return p->ops->finish ? p->ops->finish(p) : 0;
}

static int cpu_alloc(placement_t *p, size_t n, void **out) {
  (void)p;
  /* Plain malloc, not xmalloc: a shard that does not fit is the rank's
   * error to report, not an abort. Large blocks come from mmap, so pages
   * count towards VmHWM only once they are written. */
  *out = malloc(n ? n : 1);
  return *out ? 0 : TY_EEXHAUSTED;
}

static void cpu_release(placement_t *p, void *ptr, size_t n) {
  (void)p;
  (void)n;
  free(ptr);
}

static int cpu_copy_in(placement_t *p, void *dst, size_t off, const void *src, size_t n) {
  (void)p;
  if (n) memcpy((char *)dst + off, src, n);
  return 0;
}

static int cpu_copy_within(placement_t *p, void *dst, size_t dst_off, const void *src,
                           size_t src_off, size_t n) {
  (void)p;
  if (n) memcpy((char *)dst + dst_off, (const char *)src + src_off, n);
  return 0;
}

/* No finish and no staging of its own: a copy is a memcpy, done when it
 * returns. */
static const placement_ops_t g_cpu_ops = {.name = "cpu",
                                          .alloc = cpu_alloc,
                                          .release = cpu_release,
                                          .copy_in = cpu_copy_in,
                                          .copy_within = cpu_copy_within};

void placement_cpu_init(placement_t *p) {
  memset(p, 0, sizeof *p);
  p->ops = &g_cpu_ops;
}
