/* env.h - whole numbers from the environment.
 *
 * Every number trainyard takes from its environment (ranks, timeouts,
 * thread counts, memory bounds, chunk sizes) is read by ty_env_long: a
 * value that is not a whole number in the variable's range is an error
 * naming the variable, its value and what it should be, never a silent
 * fall back to the default. */
#ifndef TY_COMMON_ENV_H
#define TY_COMMON_ENV_H

#include <stddef.h>

/* The variable name as a decimal whole number in [lo, hi], in *out.
 * Unset or empty: returns 0 and leaves *out as it is (the caller's
 * default). Anything else (letters, a sign where lo >= 0, blanks, a
 * fraction, a number out of range): TY_EINVAL, and in err
 *   NAME='value' is not a whole number in LO..HI (MEANING)
 * where meaning says what the number is and, if 0 or unset means
 * something special, what. */
int ty_env_long(const char *name, long lo, long hi, const char *meaning, long *out, char *err,
                size_t errlen);

#endif
