/* fsutil.h - small filesystem helpers every binary uses. */
#ifndef TY_COMMON_FSUTIL_H
#define TY_COMMON_FSUTIL_H

#include <stddef.h>

/* Creates dir and every missing parent (mode 0755), like mkdir -p. An
 * existing directory is success. Returns 0, or TY_EINVAL (path too long) /
 * TY_EPERM (a component could not be created) with a message naming the
 * component and the system's reason in err (may be NULL). */
int ty_mkdirs(const char *dir, char *err, size_t errlen);

#endif
