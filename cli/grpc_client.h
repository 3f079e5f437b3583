/* grpc_client.h - the trainyard commands' gRPC transport (--grpc
 * HOST:PORT): trainyard.v1.Trainyard calls on the gRPC C core. Answers come
 * back as the same JSON the REST API sends (api/pbjson over the message),
 * so each command prints one form whatever the transport. Errors are
 * printed as client_print_error prints REST errors, from the status and
 * the trainyard.v1.Error in the trailing metadata. Compiled only in full
 * builds (TRAINYARD_WITH_CLIENT). */
#ifndef TY_CLI_GRPC_CLIENT_H
#define TY_CLI_GRPC_CLIENT_H

#include <stdbool.h>

#include <jansson.h>

#include "api/jobspec.h"
#include "cli/client.h"

/* SubmitJob: *job (the caller's) is the job; *existing is true when the
 * idempotency key (NULL: none) matched an earlier submit. 0, or 1 after
 * printing the error. */
int gcli_submit(const client_t *c, const jobspec_t *spec, const char *key, json_t **job,
                bool *existing);

/* GetJob: *job is the caller's. 0, or 1 after printing the error. */
int gcli_get(const client_t *c, const char *id, json_t **job);

/* ListJobs: one page as the REST API's JSON ({"jobs": [...],
 * "next_page_token"}), *page the caller's. states: comma-separated state
 * names (NULL or "": every state); page_token: "" for the first page. 0; 1
 * after printing the server's error; 2 after printing an unknown state. */
int gcli_list(const client_t *c, const char *states, const char *page_token, json_t **page);

/* CancelJob with reason (NULL: none): *job is the caller's. 0, or 1 after
 * printing the error. */
int gcli_cancel(const client_t *c, const char *id, const char *reason, json_t **job);

/* DeleteJob: *job (the caller's) is the job as it was. 0, or 1 after
 * printing the error. */
int gcli_delete(const client_t *c, const char *id, json_t **job);

/* WatchJob from after_seq: fn gets each event ({"seq","job_id","t",
 * "type","data"}, borrowed) until the stream ends. 0 when it ended
 * normally; -1 when it broke off (server gone or shutting down: call again
 * from the last seq seen); 1 after printing any other error. */
int gcli_watch(const client_t *c, const char *id, long long after_seq,
               void (*fn)(void *ctx, const json_t *ev), void *ctx);

#endif
