/* json_util.h - small jansson helpers shared by the JSON parsers. */
#ifndef TY_COMMON_JSON_UTIL_H
#define TY_COMMON_JSON_UTIL_H

#include <jansson.h>

/* What kind of value v is, for messages such as "must be an integer, got a
 * string": "an object", "an array", "a string", "an integer", "a number",
 * "a boolean", "null", or "nothing" for NULL. A static string. */
const char *ty_json_kind(const json_t *v);

#endif
