/* json_util.h - small jansson helpers shared by the JSON parsers. */
#ifndef TY_COMMON_JSON_UTIL_H
#define TY_COMMON_JSON_UTIL_H

#include <jansson.h>

/* What kind of value v is, for messages such as "must be an integer, got a
 * string": "an object", "an array", "a string", "an integer", "a number",
 * "a boolean", "null", or "nothing" for NULL. A static string. */
const char *ty_json_kind(const json_t *v);

/* json_dump_file(j, path, flags), but into "<path>.partial", renamed onto
 * path once written: path holds what it held, or the new file whole, never
 * a part (a reader or a crash sees one or the other). 0, or -1 with errno
 * set and path as it was. */
int ty_json_dump_file(const json_t *j, const char *path, size_t flags);

#endif
