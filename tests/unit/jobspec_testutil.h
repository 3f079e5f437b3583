/* jobspec_testutil.h - helpers the job-spec unit tests share: parse a JSON
 * text into a fresh spec and look for an error by field and message part. */
#ifndef TY_TESTS_JOBSPEC_TESTUTIL_H
#define TY_TESTS_JOBSPEC_TESTUTIL_H

#include <stdio.h>
#include <string.h>

#include "api/jobspec.h"

/* Prints the list (for a failing test's log). */
static inline void tu_dump(const ty_errlist_t *e) {
  for (size_t i = 0; i < e->len; i++)
    fprintf(stderr, "  [%s] %s\n", e->items[i].field, e->items[i].message);
}

/* True when some error has exactly this field and contains part. */
static inline bool tu_has(const ty_errlist_t *e, const char *field, const char *part) {
  for (size_t i = 0; i < e->len; i++)
    if (!strcmp(e->items[i].field, field) && strstr(e->items[i].message, part)) return true;
  fprintf(stderr, "no error [%s] containing '%s' among %zu:\n", field, part, e->len);
  tu_dump(e);
  return false;
}

/* Parses text over the defaults into s; returns the parse status. */
static inline int tu_parse(jobspec_t *s, const char *text, ty_errlist_t *e) {
  jobspec_init(s);
  return jobspec_parse_json(s, text, strlen(text), e);
}

/* Parses then validates (no filesystem checks); returns the number of
 * errors. */
static inline size_t tu_check(jobspec_t *s, const char *text, ty_errlist_t *e) {
  ty_errlist_clear(e);
  if (tu_parse(s, text, e) == 0) jobspec_validate(s, false, e);
  return e->len;
}

#endif
