/* errors.h - trainyard's one error model.
 *
 * Each code sits next to its gRPC status and HTTP status, so REST and gRPC
 * can never disagree. Functions that can fail return int: 0 for success or
 * a negative TY_E* code (the negated gRPC status). Field-level problems are
 * collected in a ty_errlist_t, which becomes the "details" array of
 *   { "error": { "code", "message", "details": [{"field", "message"}] } }. */
#ifndef TY_COMMON_ERRORS_H
#define TY_COMMON_ERRORS_H

#include <stdarg.h>
#include <stddef.h>

#include <jansson.h>

/* X(enum name, gRPC status number, gRPC status name, HTTP status) */
#define TY_ERROR_CODES(X)                                  \
  X(TY_OK, 0, "OK", 200)                                   \
  X(TY_ECANCELLED, 1, "CANCELLED", 499)                    \
  X(TY_EUNKNOWN, 2, "UNKNOWN", 500)                        \
  X(TY_EINVAL, 3, "INVALID_ARGUMENT", 400)                 \
  X(TY_EDEADLINE, 4, "DEADLINE_EXCEEDED", 504)             \
  X(TY_ENOTFOUND, 5, "NOT_FOUND", 404)                     \
  X(TY_EEXISTS, 6, "ALREADY_EXISTS", 409)                  \
  X(TY_EPERM, 7, "PERMISSION_DENIED", 403)                 \
  X(TY_EEXHAUSTED, 8, "RESOURCE_EXHAUSTED", 429)           \
  X(TY_EPRECONDITION, 9, "FAILED_PRECONDITION", 412)       \
  X(TY_EABORTED, 10, "ABORTED", 409)                       \
  X(TY_ERANGE, 11, "OUT_OF_RANGE", 400)                    \
  X(TY_EUNIMPLEMENTED, 12, "UNIMPLEMENTED", 501)           \
  X(TY_EINTERNAL, 13, "INTERNAL", 500)                     \
  X(TY_EUNAVAILABLE, 14, "UNAVAILABLE", 503)               \
  X(TY_EDATALOSS, 15, "DATA_LOSS", 500)                    \
  X(TY_EUNAUTHENTICATED, 16, "UNAUTHENTICATED", 401)

typedef enum {
#define TY_X(name, grpc, str, http) name = -(grpc),
  TY_ERROR_CODES(TY_X)
#undef TY_X
} ty_err_t;

/* "INVALID_ARGUMENT" for TY_EINVAL; "UNKNOWN" for a value not in the table. */
const char *ty_err_name(int code);
int ty_err_http_status(int code);
int ty_err_grpc_status(int code);
/* The code for a gRPC status name ("NOT_FOUND"), or TY_EUNKNOWN. */
int ty_err_from_name(const char *name);

/* Formats a message into the caller's buffer err (errlen bytes; err may be
 * NULL or errlen 0, and then nothing is written) and returns code, so a
 * failing function can end with `return ty_errf(err, errlen, TY_EINVAL, ...)`. */
int ty_errf(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* One field problem: the dotted path of the field ("fsdp.bucket_mb", or ""
 * for the spec as a whole) and what is wrong with it plus how to fix it. */
typedef struct {
  char *field;
  char *message;
} ty_field_error_t;

typedef struct {
  ty_field_error_t *items;
  size_t len, cap;
} ty_errlist_t;

#define TY_ERRLIST_INIT {NULL, 0, 0}

/* Appends a copy of field and the formatted message. */
void ty_errlist_add(ty_errlist_t *l, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ty_errlist_vadd(ty_errlist_t *l, const char *field, const char *fmt, va_list ap);
/* Frees the items and leaves l empty (reusable). Accepts an empty list. */
void ty_errlist_clear(ty_errlist_t *l);

/* The API error model as a new JSON object (the caller owns it):
 * {"error": {"code": "INVALID_ARGUMENT", "message": ..., "details": [...]}}.
 * details may be NULL (an empty array is then written). */
json_t *ty_error_json(int code, const char *message, const ty_errlist_t *details);

#endif
