/* pbjson.h - protobuf-c messages to and from JSON trees, driven by the
 * generated descriptors, so the gRPC front end and the REST front end share
 * one JSON form of every message (the job spec's included).
 *
 * JSON names are the .proto field names. Only present fields are written
 * (proto2 presence: has_ flags, non-NULL strings and messages, non-empty
 * repeated fields). Enum values are written as their names in lower case
 * without the enum's prefix (JobState JOB_STATE_QUEUED -> "queued"). bytes
 * fields are not used by trainyard and are rejected. */
#ifndef TY_API_PBJSON_H
#define TY_API_PBJSON_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "common/errors.h"

/* A new JSON object for m (the caller owns it). Values JSON cannot hold
 * (NaN, infinities, uint64 above INT64_MAX) are left out and reported in
 * errs under path (the field path prefix, "" at the top). */
json_t *pbjson_from_message(const ProtobufCMessage *m, const char *path, ty_errlist_t *errs);

/* A new message of type d from a JSON object, or NULL with errors in errs
 * (unknown fields, wrong types, out-of-range numbers, unknown enum names).
 * null values leave a field unset. Free the result with
 * protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *pbjson_to_message(const json_t *j, const ProtobufCMessageDescriptor *d,
                                    const char *path, ty_errlist_t *errs);

/* "queued" for JOB_STATE_QUEUED of JobState; NULL for an unknown value. */
const char *pbjson_enum_name(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t cap);
/* The value of "queued" (or "JOB_STATE_QUEUED") in *out: 0, or -1 when
 * the name is unknown. */
int pbjson_enum_value(const ProtobufCEnumDescriptor *d, const char *name, int *out);

#endif
