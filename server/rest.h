/* rest.h - the REST API of DESIGN.md on libmicrohttpd: one route table,
 * the shared error model, bearer-token auth, bounded bodies and headers,
 * Server-Sent Events, /metrics and /healthz. No logic of its own: every
 * handler calls server/service. */
#ifndef TY_SERVER_REST_H
#define TY_SERVER_REST_H

#include <stdint.h>

#include "server/config.h"

typedef struct svc svc_t;
typedef struct rest rest_t;

/* Starts serving cfg->listen (both borrowed). *port receives the port
 * bound (useful with port 0). 0, or a TY_E* code with msg. */
int rest_start(svc_t *svc, const srv_config_t *cfg, rest_t **out, int *port, char *msg,
               size_t msgsz);
/* Ends open event streams, stops accepting and waits for the handlers. */
void rest_stop(rest_t *r);

#endif
