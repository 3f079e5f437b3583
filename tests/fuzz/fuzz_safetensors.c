/* fuzz_safetensors.c - libFuzzer target for the safetensors header parser.
 * Input: 8 bytes little-endian data-section length (taken modulo 2^40),
 * then the header text. Any input must either parse into tensors that tile
 * the data section exactly, or fail with a message: never crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_len = 0;
  for (int i = 7; i >= 0; i--) data_len = (data_len << 8) | data[i];
  data_len &= (1ull << 40) - 1;
  st_header_t h;
  char err[256];
  if (st_header_parse((const char *)data + 8, size - 8, data_len, &h, err, sizeof err) == 0) {
    uint64_t total = 0;
    for (size_t i = 0; i < h.ntensors; i++) {
      const st_tensor_t *t = &h.tensors[i];
      if (t->begin + t->nbytes > data_len) abort();
      if (i && strcmp(h.tensors[i - 1].name, t->name) >= 0) abort();
      total += t->nbytes;
    }
    if (total != data_len) abort();
    st_header_free(&h);
  } else if (!err[0]) {
    abort(); /* every failure explains itself */
  }
  return 0;
}
