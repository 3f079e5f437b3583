/* client.h - what the trainyard commands that talk to a server share: the
 * --server / --token options (also TRAINYARD_SERVER, TRAINYARD_TOKEN), one
 * HTTP request with libcurl, and printing the API's error model. Compiled
 * only in full builds (TRAINYARD_WITH_CLIENT). */
#ifndef TY_CLI_CLIENT_H
#define TY_CLI_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#define CLIENT_DEFAULT_SERVER "http://127.0.0.1:8080"

typedef struct {
  char server[1024]; /* base URL, no trailing '/' */
  char token[512];   /* "" when none */
  char grpc[256];    /* --grpc HOST:PORT: submit, get and watch use gRPC; "" for REST */
} client_t;

/* Fills c from the environment, then removes "--server URL", "--token T",
 * "--grpc HOST:PORT" (and their "=" forms) from argv, compacting it; *argc is updated.
 * Returns false (with a message on stderr) when a value is missing. */
bool client_init(client_t *c, int *argc, char **argv);

/* One request: method, path (starting with "/"), optional JSON body (NULL:
 * none) and extra header lines (NULL-terminated, may be NULL). *status
 * receives the HTTP status (0 when the server could not be reached, with a
 * message on stderr); *out the response body, NUL-terminated (the caller
 * frees it); *len (optional) its length in bytes, which counts NUL bytes
 * inside it too. */
int client_request(const client_t *c, const char *method, const char *path, const json_t *body,
                   const char *const *headers, long *status, char **out, size_t *len);

/* The same, with the body parsed as JSON (*out is NULL when it is not). */
int client_json(const client_t *c, const char *method, const char *path, const json_t *body,
                const char *const *headers, long *status, json_t **out);

/* Prints an API error ({"error": {code, message, details}}) or, for any
 * other body, the status and the text, on stderr. Returns 1 (the exit
 * status of a command whose request failed). */
int client_print_error(long status, const json_t *body, const char *raw);

/* Follows a job's events until it ends (cmd_watch.c); 0 when it
 * succeeded, 1 otherwise. */
int client_watch(const client_t *c, const char *id);

/* Whether a job state name is final: succeeded, failed or cancelled. */
bool client_state_final(const char *state);

/* Percent-encodes s for a URL path segment or query value into out. */
void client_escape(const char *s, char *out, size_t size);

/* Whether argv[i] is flag ("--name") or "--name=..." ; *value receives the
 * value (argv[i + 1] or the text after '='), and *i is advanced past it.
 * Returns false when argv[i] is not this flag; exits 2 when its value is
 * missing. */
bool client_flag(int argc, char **argv, int *i, const char *flag, const char **value);

#endif
