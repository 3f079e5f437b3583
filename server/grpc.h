/* grpc.h - trainyardd's gRPC front end: the trainyard.v1.Trainyard service
 * of api/trainyard.proto on the gRPC C core, served by one thread that owns
 * a completion queue. Like REST it calls the service functions
 * (server/service.h) and holds no logic of its own. */
#ifndef TY_SERVER_GRPC_H
#define TY_SERVER_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "server/config.h"
#include "server/service.h"

typedef struct gsrv gsrv_t;

/* Binds listen ("host:port"; port 0 picks a free one) and starts the
 * serving thread. svc and cfg are borrowed and must outlive the server.
 * Off loopback, cfg->tokens must name at least one token. *port receives
 * the bound port. 0, or a TY_E* code with msg set. */
int gsrv_start(svc_t *svc, const srv_config_t *cfg, const char *listen, gsrv_t **out, int *port,
               char *msg, size_t msgsz);

/* Stops serving: refuses new calls, ends every open WatchJob stream with
 * UNAVAILABLE (its message says which sequence number to resume from),
 * lets unary calls finish (cancelling what is left after a grace of two
 * seconds), joins the thread and frees everything. Accepts NULL. */
void gsrv_stop(gsrv_t *g);

/* Counters, for /metrics and tests; safe from any thread. */
typedef struct {
  int64_t calls;        /* calls answered (any status) */
  int64_t streams_open; /* WatchJob streams open now */
  int64_t streams;      /* WatchJob streams opened in total */
} gsrv_stats_t;
void gsrv_stats(gsrv_t *g, gsrv_stats_t *out);

#endif
