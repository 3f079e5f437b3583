/* fuzz_pytorch.c - libFuzzer target for the PyTorch checkpoint reader: the
 * input is read both as a whole file (zip archive, central directory,
 * local headers, data.pkl through the restricted unpickler, tensors placed
 * in their storages) and as a bare data.pkl. Any input must either give
 * tensors whose byte ranges lie inside the input, or fail with a message:
 * never crash, never read outside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ckpt/pytorch.h"

typedef struct {
  const uint8_t *p;
  size_t n;
} mem_t;

static int mem_read(void *ctx, uint64_t off, void *dst, size_t n) {
  const mem_t *m = ctx;
  if (off > m->n || n > m->n - off) return -1;
  memcpy(dst, m->p + off, n);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mem_t m = {data, size};
  char err[512] = "";
  st_header_t h;
  if (pt_read_archive(mem_read, &m, size, 0, &h, err, sizeof err) == 0) {
    for (size_t i = 0; i < h.ntensors; i++) {
      const st_tensor_t *t = &h.tensors[i];
      if (t->begin > size || t->nbytes > size - t->begin) abort();
      if (t->nbytes != t->nelem * ty_dtype_size(t->dtype)) abort();
      if (i && strcmp(h.tensors[i - 1].name, t->name) >= 0) abort();
    }
    st_header_free(&h);
  } else if (!err[0]) {
    abort(); /* every failure explains itself */
  }
  err[0] = 0;
  pt_dict_t d;
  if (pt_pickle_load(data, size, &d, err, sizeof err) == 0) {
    for (size_t i = 0; i < d.n; i++) {
      const pt_tensor_t *t = &d.tensors[i];
      if (t->offset > t->storage_numel || t->nelem > t->storage_numel - t->offset) abort();
    }
    pt_dict_free(&d);
  } else if (!err[0]) {
    abort();
  }
  return 0;
}
