/* env.c - whole numbers from the environment (env.h). ty_common sits
 * below ty_api: only errors.h's codes are used, not its functions. */
#include "common/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"

int ty_env_long(const char *name, long lo, long hi, const char *meaning, long *out, char *err,
                size_t errlen) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  /* strtol would take leading blanks and a '+'; a value is its digits. */
  const char *d = *s == '-' ? s + 1 : s;
  if (*d >= '0' && *d <= '9') {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!errno && !*end && v >= lo && v <= hi) {
      *out = v;
      return 0;
    }
  }
  if (err && errlen)
    snprintf(err, errlen, "%s='%.40s%s' is not a whole number in %ld..%ld (%s)", name, s,
             strlen(s) > 40 ? "..." : "", lo, hi, meaning);
  return TY_EINVAL;
}
