/* json_util.h - small jansson helpers shared by the JSON parsers. */
#ifndef TY_COMMON_JSON_UTIL_H
#define TY_COMMON_JSON_UTIL_H

#include <stdio.h>

#include <jansson.h>

/* What kind of value v is, for messages such as "must be an integer, got a
 * string": "an object", "an array", "a string", "an integer", "a number",
 * "a boolean", "null", or "nothing" for NULL. A static string. */
const char *ty_json_kind(const json_t *v);

/* json_dumps(j, flags), but every real number is written in the shortest
 * form that reads back to the same double: 0.0003 and 1e-6, where jansson
 * writes 0.00029999999999999997 and 9.9999999999999995e-7, so a value a
 * person wrote reads as written and none loses a bit. A whole real stays a
 * real (16.0). A JSON_REAL_PRECISION in flags is ignored. The caller frees
 * the text (free); NULL where json_dumps gives NULL. */
char *ty_json_dumps(const json_t *j, size_t flags);

/* ty_json_dumps' text written to f. 0, or -1. */
int ty_json_dumpf(const json_t *j, FILE *f, size_t flags);

/* ty_json_dumps' text written to path, but into "<path>.partial", renamed onto
 * path once written: path holds what it held, or the new file whole, never
 * a part (a reader or a crash sees one or the other). 0, or -1 with errno
 * set and path as it was. */
int ty_json_dump_file(const json_t *j, const char *path, size_t flags);

/* ty_json_dump_file inside the process's roots (common/beneath.h): the
 * part is made, and renamed, only through folders inside a write root.
 * 0, or a negative TY_E* code with a message naming path (and, for one
 * that leads out, its root) in err (may be NULL). ty_json_dump_file is
 * this without the message. */
int ty_json_write_file(const json_t *j, const char *path, size_t flags, char *err, size_t errlen);

/* json_load_file inside the process's roots: NULL with a message naming
 * path in err (may be NULL) where it cannot be opened (errno: the reason;
 * ENOENT where it does not exist) or is not valid JSON ("not valid JSON
 * (line N: ...)", errno EINVAL). */
json_t *ty_json_load_file(const char *path, size_t flags, char *err, size_t errlen);

#endif
