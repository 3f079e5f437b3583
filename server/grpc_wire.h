/* grpc_wire.h - the bytes of trainyard's gRPC API: protobuf-c messages in
 * and out of grpc_byte_buffer, the google.rpc.Status error details carried
 * in `grpc-status-details-bin`, and request metadata look-ups.
 *
 * Nothing here touches a call or a completion queue, so it is tested on its
 * own (tests/unit/test_wire_grpc.c). */
#ifndef TY_SERVER_GRPC_WIRE_H
#define TY_SERVER_GRPC_WIRE_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "common/errors.h"

/* The trailing metadata key of the error details (a binary header: the
 * transport base64-encodes it). */
#define GWIRE_DETAILS_KEY "grpc-status-details-bin"
/* type_url of the one detail sent: a google.rpc.BadRequest. */
#define GWIRE_BAD_REQUEST_URL "type.googleapis.com/google.rpc.BadRequest"

/* Decodes a request message of type d from bb (which stays the caller's).
 * A NULL bb is an empty message. max bounds the payload in bytes (the
 * transport already enforces its own limit; this keeps the decoder honest
 * when called elsewhere). On success *out is the caller's, freed with
 * protobuf_c_message_free_unpacked(*out, NULL). Returns 0, or TY_EINVAL
 * (malformed bytes) / TY_EEXHAUSTED (too large) with msg set. */
int gwire_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d, size_t max,
                 ProtobufCMessage **out, char *msg, size_t msgsz);

/* Encodes m into a new byte buffer (the caller's: grpc_byte_buffer_destroy). */
grpc_byte_buffer *gwire_pack(const ProtobufCMessage *m);

/* The serialized google.rpc.Status for an error: code is a TY_E* code
 * (mapped through ty_err_grpc_status), message the status message, errs
 * (may be NULL or empty) become one BadRequest detail. The returned slice
 * is the caller's (grpc_slice_unref). */
grpc_slice gwire_status_details(int code, const char *message, const ty_errlist_t *errs);

/* The key and bytes of the trainyard.v1.Error form of the same error
 * (api/trainyard.proto), sent beside the google.rpc.Status. */
#define GWIRE_ERROR_KEY "trainyard-error-bin"
grpc_slice gwire_error_details(int code, const char *message, const ty_errlist_t *errs);

/* The inverse, for tests and clients: decodes a Status, giving its gRPC
 * code, its message (copied into msg) and its field violations appended to
 * errs. Returns 0 or TY_EINVAL when the bytes are not a Status with only
 * BadRequest details. */
int gwire_status_decode(const void *data, size_t len, int *grpc_code, char *msg, size_t msgsz,
                        ty_errlist_t *errs);

/* Copies the value of the first metadata entry named key (lower case) into
 * out (outsz bytes, NUL-terminated). Returns false when there is none or it
 * does not fit. */
bool gwire_metadata_get(const grpc_metadata_array *md, const char *key, char *out, size_t outsz);

/* The token of an `authorization: Bearer <token>` value, or NULL when the
 * value has another form. Points into value. */
const char *gwire_bearer(const char *value);

#endif
