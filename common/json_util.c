/* json_util.c - small jansson helpers; see json_util.h. */
#include "common/json_util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

const char *ty_json_kind(const json_t *v) {
  if (!v) return "nothing";
  switch (json_typeof(v)) {
    case JSON_OBJECT:
      return "an object";
    case JSON_ARRAY:
      return "an array";
    case JSON_STRING:
      return "a string";
    case JSON_INTEGER:
      return "an integer";
    case JSON_REAL:
      return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
      return "a boolean";
    default:
      return "null";
  }
}

int ty_json_dump_file(const json_t *j, const char *path, size_t flags) {
  char partial[PATH_MAX];
  if (snprintf(partial, sizeof partial, "%s.partial", path) >= (int)sizeof partial) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (json_dump_file(j, partial, flags) == 0 && rename(partial, path) == 0) return 0;
  int e = errno;
  unlink(partial);
  errno = e;
  return -1;
}
