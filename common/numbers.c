/* numbers.c - whole numbers from text (numbers.h). ty_common sits below
 * ty_api: only errors.h's codes are used, not its functions. */
#include "common/numbers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

bool ty_parse_long(const char *s, long lo, long hi, long *out) {
  /* strtol would take leading blanks and a '+'; a number is its digits. */
  const char *d = *s == '-' ? s + 1 : s;
  if (*d < '0' || *d > '9') return false;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

int ty_env_long(const char *name, long lo, long hi, const char *meaning, long *out, char *err,
                size_t errlen) {
  const char *s = getenv(name);
  if (!s || !*s || ty_parse_long(s, lo, hi, out)) return 0;
  if (err && errlen)
    snprintf(err, errlen, "%s='%.40s%s' is not a whole number in %ld..%ld (%s)", name, s,
             strlen(s) > 40 ? "..." : "", lo, hi, meaning);
  return TY_EINVAL;
}
