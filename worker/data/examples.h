/* examples.h - a tokenized data set on disk: training examples as token
 * ids, each token marked counted (a target the loss counts) or not, built
 * once from a source file and then mapped read-only by every rank.
 *
 * File layout (little-endian; one file, written whole under a temporary
 * name and renamed onto its name, so that a reader finds it complete or not
 * at all):
 *   header   64 bytes: magic "TYEXMPL1", u64 key, u64 examples E, u64
 *            tokens N, u64 source bytes, three u64 0 (reserved)
 *   tokens   u32 [N]: the id in bits 0..30, bit 31 set when counted, then
 *            one u32 0 when N is odd (the offsets are 8-byte aligned)
 *   offsets  u64 [E + 1]: example e is tokens [offsets[e], offsets[e+1])
 * The key names what the file was built from (the source's identity, the
 * tokenizer, the template and the options): a file whose key differs is
 * stale and built again. */
#ifndef TY_WORKER_EXAMPLES_H
#define TY_WORKER_EXAMPLES_H

#include <stddef.h>
#include <stdint.h>

#define EXAMPLES_COUNTED 0x80000000u /* bit 31 of a stored token */
#define EXAMPLES_ID_MAX 0x7fffffffu

/* --- Writing: examples are appended as they are made (one example's ids
 * at a time in memory; the offsets, 8 bytes an example, until the end). */
typedef struct examples_writer_s examples_writer_t;

/* Opens "<path>.tmp-<pid>" for writing. *out is the caller's, ended by
 * examples_commit or examples_abort. 0 or TY_EUNAVAILABLE with the reason. */
int examples_writer_open(examples_writer_t **out, const char *path, char *err, size_t errlen);
/* Appends one example of n tokens (ids < 2^31; counted[i] nonzero when
 * token i is a counted target; counted may be NULL: none). */
int examples_add(examples_writer_t *w, const uint32_t *ids, const uint8_t *counted, size_t n,
                 char *err, size_t errlen);
/* Writes the offsets and the header (key, source_bytes), syncs, renames the
 * file onto path and frees w. On failure the temporary file is removed. */
int examples_commit(examples_writer_t *w, uint64_t key, uint64_t source_bytes, char *err,
                    size_t errlen);
/* Removes the temporary file and frees w; accepts NULL. */
void examples_abort(examples_writer_t *w);
int64_t examples_written(const examples_writer_t *w);

/* --- Reading: the file mapped read-only. */
typedef struct examples_s examples_t;

/* Maps path. TY_ENOTFOUND when it does not exist, TY_EPRECONDITION when its
 * key is not `key` (stale), TY_EDATALOSS when it is not a whole examples
 * file (err says which part is wrong). */
int examples_open(examples_t **out, const char *path, uint64_t key, char *err, size_t errlen);
void examples_close(examples_t *x);
int64_t examples_count(const examples_t *x);
int64_t examples_tokens(const examples_t *x);
/* Example e's n tokens (ids with the counted bit), borrowed from the map. */
const uint32_t *examples_get(const examples_t *x, int64_t e, size_t *n);

/* A 64-bit FNV-1a hash step over bytes, to build keys. */
uint64_t examples_hash(uint64_t h, const void *bytes, size_t n);
#define EXAMPLES_HASH_INIT 0xcbf29ce484222325ull

#endif
