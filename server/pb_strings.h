/* pb_strings.h - finds a NUL byte inside a string field of a serialized
 * protobuf message, before protobuf-c decodes it: protobuf-c hands string
 * fields over as C strings, so "j-1\0x" would arrive as "j-1", cut short
 * without a word, where REST refuses such a value. Both front ends refuse. */
#ifndef TY_SERVER_PB_STRINGS_H
#define TY_SERVER_PB_STRINGS_H

#include <stdbool.h>
#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

/* Walks the wire bytes data[0..len) of a message of type d, into nested
 * messages, and returns true when a string field holds a NUL byte; path
 * (pathsz bytes) then receives its field path ("spec.name"). Bytes that are
 * not a well-formed message return false: the decoder then refuses them. */
bool pbstr_find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                    char *path, size_t pathsz);

#endif
