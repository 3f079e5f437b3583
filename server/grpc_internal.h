/* grpc_internal.h - what the gRPC core (server/grpc.c) needs to know of a
 * service: its methods, each either unary or server-streaming. The method
 * table of trainyard.v1.Trainyard is in server/grpc_service.c. */
#ifndef TY_SERVER_GRPC_INTERNAL_H
#define TY_SERVER_GRPC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "common/errors.h"
#include "server/service.h"

/* Most messages a stream's next() may hand over at once. */
#define GSRV_BATCH 32

typedef struct {
  const char *path;                          /* "/trainyard.v1.Trainyard/GetJob" */
  const ProtobufCMessageDescriptor *request; /* the request message type */
  /* Unary methods: on success *resp is a new byte buffer (the core sends
   * and destroys it). On failure a TY_E* code with msg and, for
   * INVALID_ARGUMENT, field details in errs. */
  int (*unary)(svc_t *svc, const ProtobufCMessage *req, grpc_byte_buffer **resp, ty_errlist_t *errs,
               char *msg, size_t msgsz);
  /* Server-streaming methods (unary is NULL). open checks the request and
   * makes the stream's state (the core frees it with close). next is
   * called whenever the stream has nothing left to send and the service
   * may have something new: it appends up to max new messages to out
   * (*n of them) and sets *done when nothing follows them. A failure ends
   * the stream with that status. */
  int (*open)(svc_t *svc, const ProtobufCMessage *req, void **state, ty_errlist_t *errs, char *msg,
              size_t msgsz);
  int (*next)(svc_t *svc, void *state, grpc_byte_buffer **out, size_t max, size_t *n, bool *done,
              char *msg, size_t msgsz);
  /* The message of an UNAVAILABLE status ending the stream at shutdown
   * (how to resume), into msg. */
  void (*resume_hint)(void *state, char *msg, size_t msgsz);
  void (*close)(void *state);
} gsrv_method_t;

extern const gsrv_method_t gsvc_methods[];
extern const size_t gsvc_method_count;

#endif
