/* jobspec_internal.h - what the job-spec files (jobspec*.c, llama_config.c,
 * pbjson_pb.c) share and nobody else needs: the table of
 * spec fields and name matching for "did you mean". */
#ifndef TY_API_JOBSPEC_INTERNAL_H
#define TY_API_JOBSPEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "api/jobspec.h"

typedef enum {
  JF_OBJECT,  /* a group ("fsdp", "data", "train"): fields below it */
  JF_STRING,  /* char[size], NUL-terminated */
  JF_BOOL,    /* bool */
  JF_INT,     /* int */
  JF_U64,     /* uint64_t, 0 .. INT64_MAX (what a JSON integer holds) */
  JF_DOUBLE,  /* double, finite */
  JF_ENUM,    /* an int-sized enum; names[value] is its spelling */
  JF_DTYPE,   /* ty_dtype_t, spelled as ty_dtype_name (aliases accepted) */
  JF_TARGETS, /* unsigned bitmask of JOBSPEC_TARGETS, or "all-linear" */
  JF_MODEL,   /* llama_config_t + has_model; null allowed */
  JF_STRINGS  /* char[hi][size]: a list of at most hi non-empty strings, "" ending it */
} jf_type_t;

/* One row of the spec's field table. Every entry point (JSON, flags,
 * protobuf through JSON, serialization, equality, the range rule) walks
 * this table, so a field is declared exactly once. */
typedef struct {
  const char *path; /* dotted path: "fsdp.bucket_mb" */
  jf_type_t type;
  size_t off;               /* offsetof(jobspec_t, ...) */
  size_t size;              /* JF_STRING, JF_STRINGS (each): capacity in bytes incl. NUL */
  const char *const *names; /* JF_ENUM: NULL-terminated spellings */
  bool has_range;           /* the "ranges" rule checks [lo, hi] */
  double lo, hi;            /* inclusive bounds, unless lo_open: (lo, hi]; JF_STRINGS: hi
                             * is the most strings (has_range false) */
  bool lo_open;
  const char *help; /* one line for docs */
} jobspec_field_t;

extern const jobspec_field_t jobspec_fields[];
extern const size_t jobspec_nfields;

/* The row for a dotted path, or NULL. */
const jobspec_field_t *jobspec_field_find(const char *path);

/* Levenshtein distance between a and b (bytes), capped at 64. */
int jobspec_edit_distance(const char *a, const char *b);
/* The closest of the candidates to name (distance <= max(2, len/3)), or
 * NULL. candidates is an array of n strings. */
const char *jobspec_closest(const char *name, const char *const *candidates, size_t n);
/* The closest field name among the children of the group prefix ("" for
 * the top level, "fsdp", ...) to key, or NULL. Writes into buf. */
const char *jobspec_suggest_field(const char *prefix, const char *key, char *buf, size_t cap);

/* Our field for a name other training stacks give it (path as written,
 * dotted: "train.activation_checkpointing", "learning_rate", ...), with
 * whose name ours is in *whose; NULL for any other path. */
const char *jobspec_other_name(const char *path, const char **whose);

/* "prefix.key" (or "key" when prefix is "") into buf, cut at a UTF-8
 * character boundary when it does not fit. */
void jobspec_path_join(char *buf, size_t cap, const char *prefix, const char *key);

/* Copies src into a fixed buffer, zero-filling the rest (so structs compare
 * with memcmp); returns -1 when src does not fit. */
int jobspec_copy_str(char *dst, size_t cap, const char *src);

/* Sets one leaf field from a JSON value (path names it in errors). */
void jobspec_set_json(jobspec_t *s, const jobspec_field_t *f, const json_t *v, const char *path,
                      ty_errlist_t *errs);
/* One field's value as a new JSON value (an empty object for a group). */
json_t *jobspec_field_to_json(const jobspec_t *s, const jobspec_field_t *f);
/* Adds "must be one of ..." (with a suggestion close to got) for an enum. */
void jobspec_set_enum_error(const jobspec_field_t *f, const char *got, const char *path,
                            ty_errlist_t *errs);

/* Depth bound for JSON documents (jansson's own limit is 2048). */
#define JOBSPEC_JSON_MAX_DEPTH 64
/* Size bound for a JSON spec document, in bytes. */
#define JOBSPEC_JSON_MAX_BYTES (1u << 20)

#endif
