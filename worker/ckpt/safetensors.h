/* safetensors.h - reading and writing safetensors checkpoints.
 *
 * A safetensors file is: 8 bytes little-endian N, N bytes of JSON header
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}), then the data section; offsets are
 * relative to the data section. Every header is validated before anything
 * in it is trusted: N at most ST_HEADER_MAX and inside the file, a JSON
 * object, dtypes F32/F16/BF16 (and U8, see st_open_flags) only, shape x
 * dtype size == byte length, offsets inside the data section with no
 * overlaps and no holes, __metadata__ strings only.
 *
 * A checkpoint is one file or a sharded set (model.safetensors.index.json
 * with a weight_map naming each tensor's file). PyTorch's files
 * (pytorch_model.bin, its index, a .pt file) open into the same structures
 * through worker/ckpt/pytorch.h, so every reader serves both formats. Tensor bytes are read by
 * byte range with pread: nothing needs the whole file in memory.
 *
 * Errors: functions return 0 or a negative TY_E* code and write a message
 * naming the file and tensor into the caller's err buffer (errlen bytes;
 * err may be NULL). */
#ifndef TY_WORKER_SAFETENSORS_H
#define TY_WORKER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/dtype.h"

#define ST_HEADER_MAX (100u * 1000u * 1000u) /* 100 MB, as the format's own readers */
#define ST_MAX_DIMS 8
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

typedef struct {
  char *name;
  ty_dtype_t dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  uint64_t nelem;  /* product of shape (1 for a scalar) */
  uint64_t begin;  /* byte offset inside the data section */
  uint64_t nbytes; /* nelem x dtype size */
  int file;        /* index into the checkpoint's files (0 for a parsed header) */
} st_tensor_t;

/* A parsed header: tensors sorted by name. */
typedef struct {
  st_tensor_t *tensors;
  size_t ntensors;
} st_header_t;

/* Parses and validates a header: json is the header text (len bytes, not
 * NUL-terminated), data_len the size of the data section that follows it.
 * On success fills h (release with st_header_free). This is the whole
 * trust boundary of a file; the fuzz target calls it directly. */
int st_header_parse(const char *json, size_t len, uint64_t data_len, st_header_t *h, char *err,
                    size_t errlen);
void st_header_free(st_header_t *h);

typedef struct {
  char *path;
  int fd;
  uint64_t data_start; /* absolute file offset of the data section (8 + N); 0 for a
                          PyTorch file (worker/ckpt/pytorch.h), whose offsets are absolute */
  uint64_t size;       /* file size in bytes */
} st_file_t;

/* An open checkpoint: its files and all their tensors, sorted by name. */
typedef struct {
  st_file_t *files;
  size_t nfiles;
  st_tensor_t *tensors;
  size_t ntensors;
  uint64_t data_bytes; /* sum of the tensors' nbytes */
} st_ckpt_t;

/* Opens path: a .safetensors, .bin, .pt or .pth file, a .index.json file,
 * or a directory holding model.safetensors.index.json (preferred),
 * model.safetensors, pytorch_model.bin.index.json or pytorch_model.bin.
 * A sharded checkpoint must agree with its index exactly (every tensor of
 * the weight_map in its named file and nowhere else, no tensor outside the
 * weight_map). *out is the caller's, released with st_close. */
int st_open(const char *path, st_ckpt_t **out, char *err, size_t errlen);
void st_close(st_ckpt_t *c);

/* st_open with flags. U8 tensors (bytes: bitsandbytes' 4-bit codes and
 * statistics, worker/ckpt/bnb4.h) pass the header parser like any other,
 * but st_open refuses them by name (TY_EUNIMPLEMENTED), so that no reader
 * of floats ever takes bytes for weights; ST_OPEN_U8 lets them in, for a
 * reader that knows what they hold. */
#define ST_OPEN_U8 1u
int st_open_flags(const char *path, unsigned flags, st_ckpt_t **out, char *err, size_t errlen);

/* The tensor called name, or NULL. */
const st_tensor_t *st_find(const st_ckpt_t *c, const char *name);

/* Reads n bytes of tensor t starting at byte off (relative to the tensor)
 * into dst with pread. A short file is TY_EDATALOSS ("truncated"). */
int st_read(const st_ckpt_t *c, const st_tensor_t *t, uint64_t off, void *dst, size_t n, char *err,
            size_t errlen);

/* Streaming writer. The header is written from the tensor descriptions at
 * open; the data follows in the same order through st_writer_write, in
 * pieces of any size, so a multi-GB file never needs to be in memory. The
 * bytes go to "<path>.partial", renamed onto path when st_writer_close
 * finds them whole: until then path keeps what it held (nothing, or the
 * previous file), so no reader and no crash ever sees part of a file. */
typedef struct {
  const char *name;
  ty_dtype_t dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
} st_desc_t;

typedef struct st_writer st_writer_t;

/* metadata: NULL or a NULL-terminated list of key, value, key, value, ...
 * strings for __metadata__. */
int st_writer_open(const char *path, const st_desc_t *descs, size_t n, const char *const *metadata,
                   st_writer_t **out, char *err, size_t errlen);
/* Appends n bytes of data (the next bytes of the tensors, in order). */
int st_writer_write(st_writer_t *w, const void *data, size_t n, char *err, size_t errlen);
/* Checks that every declared byte was written, flushes, closes and puts
 * the file in place; always frees w. An incomplete file is removed, and
 * path keeps what it held. */
int st_writer_close(st_writer_t *w, char *err, size_t errlen);

/* Hugging Face's sharded layout, as the writers (mkmodel, convert,
 * merge) make it. The name of file f (from 0) of nfiles: ST_SINGLE_NAME
 * alone, else "model-<f+1>-of-<nfiles>.safetensors" (five digits each). */
void st_shard_name(char *buf, size_t n, size_t f, size_t nfiles);
/* n tensors of bytes[i] each, in order, cut into files of at most
 * shard_bytes (0: one file; a tensor larger than that is alone in its
 * file): cut[f] is file f's first tensor and cut[nfiles] = n (cut has
 * room for n + 1). Returns nfiles, 1 for n = 0. */
size_t st_shard_plan(const uint64_t *bytes, size_t n, uint64_t shard_bytes, size_t *cut);
/* The index of such files (ST_INDEX_NAME's contents): {"metadata":
 * {"total_size": total}, "weight_map": {names[i]: tensor i's file}}. A new
 * reference. */
json_t *st_shard_index(const char *const *names, const size_t *cut, size_t nfiles, uint64_t total);

#endif
