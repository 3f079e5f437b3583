/* worker_path.h - where the local commands (load, train) find trainyard-worker. */
#ifndef TY_CLI_WORKER_PATH_H
#define TY_CLI_WORKER_PATH_H

#include <stddef.h>

/* Writes the worker binary's path into out (n bytes): $TRAINYARD_WORKER when
 * set, else trainyard-worker beside this executable, else ../worker/ of it
 * (the build tree). Returns 0 when that file is executable, -1 otherwise
 * (out then holds the last path tried, if any). */
int worker_path_find(char *out, size_t n);

#endif
