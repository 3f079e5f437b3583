/* shm_name.h - the one rule for the names of the shared-memory segments
 * that CPU ranks meet in, for the worker that creates them
 * (worker/dist/comm_shm.c), and for the server and the launcher that remove
 * what dead ranks left: a "shm:<name>" rendezvous is the segment
 * /dev/shm/trainyard-<name>; trainyardd names attempt A of job J "ty-J-A". */
#ifndef TY_COMMON_SHM_NAME_H
#define TY_COMMON_SHM_NAME_H

#include <stddef.h>

#define TY_SHM_PREFIX "trainyard-" /* of every segment's name in /dev/shm */
#define TY_SHM_SERVER "ty-"        /* of the names trainyardd gives its attempts */

/* The shm_open name ("/trainyard-<name>") of a "shm:<name>" rendezvous into
 * out[outlen]. 0, or TY_EINVAL with a sentence in err (errlen bytes; may be
 * NULL) when it is not shm:, or the name is empty, over 200 characters or
 * holds anything but letters, digits, '.', '_' and '-'. */
int ty_shm_path(const char *rendezvous, char *out, size_t outlen, char *err, size_t errlen);

/* Removes the segment of a "shm:<name>" rendezvous if it exists: 0 when it
 * removed one, 1 when there was none, TY_EINVAL for a bad rendezvous, or
 * TY_EINTERNAL. */
int ty_shm_remove(const char *rendezvous);

/* The rendezvous ("shm:ty-<id>-<attempt>") of a trainyardd attempt. */
void ty_shm_server_rendezvous(const char *id, int attempt, char *out, size_t outlen);

/* Whether a /dev/shm entry's name is a trainyardd attempt's segment: then
 * its job id (idsz bytes) and attempt. */
int ty_shm_server_parse(const char *entry, char *id, size_t idsz, int *attempt);

/* The local launcher (`trainyard train`, `trainyard load`) names its
 * segments "local-<launcher pid>-<ms>-<attempt>". A launcher killed during
 * its ranks' rendezvous takes the ranks with it (PR_SET_PDEATHSIG) and
 * leaves the segment: this removes every such segment whose launcher is
 * gone (no process has its pid). Returns how many it removed. */
int ty_shm_sweep_local(void);

#endif
