/* rest_deadline.h - a deadline for each request's head and body, so that
 * slow clients (a few bytes now and then, which keep libmicrohttpd's idle
 * timeout from ever firing) cannot hold the server's connections: from the
 * moment a connection opens, or its previous request is answered, the
 * client has --request_timeout seconds to send a whole request; a
 * connection past that is shut down. A request whose answer is being sent
 * (an event stream, a long log) has no deadline.
 *
 * One thread checks the open connections four times a second. A connection
 * is forgotten (rdl_closed) before libmicrohttpd closes its socket, and
 * shutdown() is called under the same lock, so a socket number reused by a
 * new connection is never cut. */
#ifndef TY_SERVER_REST_DEADLINE_H
#define TY_SERVER_REST_DEADLINE_H

#include <stdint.h>

typedef struct rdl rdl_t;
typedef struct rdl_conn rdl_conn_t;

/* NULL when the thread cannot be started. */
rdl_t *rdl_start(double limit_s);
void rdl_stop(rdl_t *d);
/* A connection opened on socket fd; the handle goes into its socket
 * context. */
rdl_conn_t *rdl_opened(rdl_t *d, int fd);
/* The request was read whole and is being answered: no deadline. */
void rdl_answering(rdl_t *d, rdl_conn_t *c);
/* The request's answer ended: the next request's deadline starts. */
void rdl_answered(rdl_t *d, rdl_conn_t *c);
/* The connection closes (its handle is freed). */
void rdl_closed(rdl_t *d, rdl_conn_t *c);
/* Connections shut down for missing their deadline, so far. */
int64_t rdl_cut(rdl_t *d);

#endif
