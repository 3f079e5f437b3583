/* pytorch.h - PyTorch checkpoint files (torch.save since 1.6: a zip archive
 * whose tensors are stored uncompressed, described by a pickle, data.pkl),
 * read without executing anything.
 *
 * Three layers, each a trust boundary of its own:
 * - pt_zip_*: the zip's central directory (zip64 where torch writes it),
 *   each entry located by the local header's name and extra lengths. Every
 *   entry must be stored (method 0), unencrypted, inside the file, before
 *   the central directory, and overlap no other entry.
 * - pt_pickle_*: a restricted unpickler. It accepts only the opcodes and
 *   globals a state dict uses (collections.OrderedDict,
 *   torch._utils._rebuild_tensor_v2 and _rebuild_parameter, the
 *   torch.{Float,Half,BFloat16}Storage types, the float32/float16/bfloat16
 *   dtypes, persistent ids for storages) and refuses anything else by name:
 *   any other global, a REDUCE of anything else, a BUILD on anything but a
 *   dict. It builds values, never calls anything.
 * - pt_open_file: the two together, giving the tensors of one file as a
 *   safetensors header would (worker/ckpt/safetensors.h), so that the loader,
 *   the strict match and every other reader see one kind of checkpoint.
 *
 * Tensors must be contiguous (a transposed or strided view is refused
 * naming the tensor); a storage offset is fine, and several tensors may
 * view one storage (a tied head): each is read from its own byte range.
 * Errors: 0 or a negative TY_E* code, with a message in err (errlen bytes;
 * err may be NULL). */
#ifndef TY_WORKER_PYTORCH_H
#define TY_WORKER_PYTORCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "worker/ckpt/safetensors.h"

#define PT_PICKLE_MAX (256u << 20) /* data.pkl bytes; ~100 bytes a tensor */
#define PT_ENTRIES_MAX (1u << 22)  /* zip entries (a storage each, at most) */
#define PT_NAME_MAX 4096           /* bytes of one entry's name */
#define PT_INDEX_NAME "pytorch_model.bin.index.json"
#define PT_SINGLE_NAME "pytorch_model.bin"

/* ---- zip ---------------------------------------------------------------- */

typedef struct {
  char *name;        /* as stored, NUL-terminated */
  uint64_t header;   /* offset of the local header */
  uint64_t data_off; /* offset of the first data byte */
  uint64_t size;     /* data bytes (stored: compressed = uncompressed) */
  uint32_t crc;      /* CRC-32 the central directory records */
} pt_zip_entry_t;

typedef struct {
  pt_zip_entry_t *entries; /* sorted by name */
  size_t n;
} pt_zip_t;

/* Reads n bytes at off into dst: 0, or -1 when they cannot all be read. */
typedef int (*pt_read_fn)(void *ctx, uint64_t off, void *dst, size_t n);

/* Parses and checks the archive of size bytes that rd reads. On success
 * fills z (release with pt_zip_free). */
int pt_zip_parse(pt_read_fn rd, void *ctx, uint64_t size, pt_zip_t *z, char *err, size_t errlen);
void pt_zip_free(pt_zip_t *z);
/* The entry called name, or NULL. */
const pt_zip_entry_t *pt_zip_find(const pt_zip_t *z, const char *name);
/* CRC-32 (zip's polynomial) of n bytes, continuing from crc (0 to start). */
uint32_t pt_crc32(uint32_t crc, const void *p, size_t n);

/* ---- pickle ------------------------------------------------------------- */

typedef struct {
  char *name;                 /* the state dict's key */
  ty_dtype_t dtype;           /* the storage's */
  int ndim;                   /* at most ST_MAX_DIMS */
  int64_t shape[ST_MAX_DIMS]; /* sizes */
  uint64_t nelem;             /* product of shape */
  char *storage;              /* the storage's key: its bytes are data/<key> */
  uint64_t storage_numel;     /* elements of that storage */
  uint64_t offset;            /* storage offset, in elements */
} pt_tensor_t;

typedef struct {
  pt_tensor_t *tensors; /* in the pickle's order */
  size_t n;
} pt_dict_t;

/* Unpickles a state dict from the n bytes of data.pkl. The result must be
 * a dict of str -> tensor; a dict whose only key is "state_dict" or
 * "model" and whose value is a dict is unwrapped (repeatedly). Anything
 * else is refused with the key or opcode and why. Release with
 * pt_dict_free. */
int pt_pickle_load(const uint8_t *p, size_t n, pt_dict_t *d, char *err, size_t errlen);
void pt_dict_free(pt_dict_t *d);

/* ---- files -------------------------------------------------------------- */

/* Whether the first bytes of a file (n of them) start a zip archive. */
bool pt_is_zip(const unsigned char *head, size_t n);

/* The tensors of the zip archive of size bytes that rd reads, into h as
 * file fi, with absolute byte offsets (the whole of pt_open_file after the
 * file's first bytes; the fuzz target calls it on memory). */
int pt_read_archive(pt_read_fn rd, void *ctx, uint64_t size, int fi, st_header_t *h, char *err,
                    size_t errlen);

/* Reads the PyTorch checkpoint open as fd (path for messages, size bytes)
 * into h as file fi: each tensor's begin is its absolute byte offset in
 * the file (the caller's data_start is 0). A legacy (pre-1.6) file is
 * refused saying how to re-save it. Release h with st_header_free. */
int pt_open_file(int fd, const char *path, uint64_t size, int fi, st_header_t *h, char *err,
                 size_t errlen);

#endif
