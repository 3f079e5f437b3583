/* driver_util.h - what the numerics drivers share: failing with the
 * reason, and a case.json integer. The driver defines DRIVER (its name,
 * a string) before including it. */
#ifndef TY_TESTS_DRIVER_UTIL_H
#define TY_TESTS_DRIVER_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

static void die(const char *what, const char *why) {
  fprintf(stderr, "%s: %s: %s\n", DRIVER, what, why);
  exit(1);
}

/* The integer member k of case.json's object o; dies when it is missing. */
static int64_t jint(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  if (!json_is_number(v)) die("case.json", k);
  return (int64_t)json_number_value(v);
}

#endif
