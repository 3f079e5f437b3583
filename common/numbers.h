/* numbers.h - whole numbers from text: command-line flags and the
 * environment.
 *
 * A number trainyard reads is digits, after a '-' where negative values
 * are allowed: no blanks, no '+', no fraction, no exponent, no hex, nothing
 * after it. Every number taken from the environment (ranks, timeouts,
 * thread counts, memory bounds, chunk sizes) is read by ty_env_long: a
 * value that is not a whole number in the variable's range is an error
 * naming the variable, its value and what it should be, never a silent
 * fall back to the default. */
#ifndef TY_COMMON_NUMBERS_H
#define TY_COMMON_NUMBERS_H

#include <stdbool.h>
#include <stddef.h>

/* s as a whole number in [lo, hi], in *out; false (and *out untouched)
 * when s is not one or is out of range. */
bool ty_parse_long(const char *s, long lo, long hi, long *out);

/* The variable name as a whole number in [lo, hi], in *out.
 * Unset or empty: returns 0 and leaves *out as it is (the caller's
 * default). Anything else (letters, a sign where lo >= 0, blanks, a
 * fraction, a number out of range): TY_EINVAL, and in err
 *   NAME='value' is not a whole number in LO..HI (MEANING)
 * where meaning says what the number is and, if 0 or unset means
 * something special, what. */
int ty_env_long(const char *name, long lo, long hi, const char *meaning, long *out, char *err,
                size_t errlen);

#endif
