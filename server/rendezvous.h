/* rendezvous.h - the keys the ranks of one attempt publish for each other
 * through the control server (PUT/GET /v1/jobs/{id}/attempts/{n}/
 * rendezvous/{key}): an NCCL unique id, a TCP store's address. A small
 * store in memory, thread-safe, bounded: keys of [A-Za-z0-9._-] up to
 * RDV_KEY_MAX bytes, values up to RDV_VALUE_MAX bytes, RDV_KEYS_MAX keys and
 * RDV_BYTES_MAX bytes an attempt (Gloo's full mesh of N ranks takes
 * N + N(N-1) keys). A key is written once per attempt (the same value again is
 * fine; another is refused), so a rank never sees a value change under
 * it. Keys of a job's earlier attempts go when a later one publishes. */
#ifndef TY_SERVER_RENDEZVOUS_H
#define TY_SERVER_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>

#define RDV_KEY_MAX 64
#define RDV_VALUE_MAX 65536
#define RDV_KEYS_MAX 4096
#define RDV_BYTES_MAX (4 << 20) /* of all an attempt's values */

typedef struct rdv_store rdv_store_t;

rdv_store_t *rdv_store_new(void);
void rdv_store_free(rdv_store_t *st); /* NULL is fine */

/* Whether key is a key of this store's form; false with why in msg. */
bool rdv_key_ok(const char *key, char *msg, size_t msgsz);

/* Publishes value (len bytes) under job/attempt/key. 0, or with msg
 * saying why: TY_EINVAL (a bad key, a value too long), TY_EEXISTS (the key
 * holds another value), TY_EEXHAUSTED (the attempt holds RDV_KEYS_MAX keys
 * or RDV_BYTES_MAX bytes already). */
int rdv_put(rdv_store_t *st, const char *job, int attempt, const char *key, const void *value,
            size_t len, char *msg, size_t msgsz);

/* A copy of the value (*out, the caller frees; *len its bytes), or false
 * when the key is not published. */
bool rdv_get(rdv_store_t *st, const char *job, int attempt, const char *key, void **out,
             size_t *len);

/* Forgets every key of job (it ended, or was deleted). */
void rdv_forget(rdv_store_t *st, const char *job);

#endif
