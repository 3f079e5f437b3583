/* pb_strings.c - NUL bytes in string fields of wire-format protobuf; see
 * pb_strings.h. */
#include "server/pb_strings.h"

#include <stdio.h>
#include <string.h>

#define DEPTH_MAX 32 /* deeper nesting than any trainyard message */

/* Reads a base-128 varint at *p (before end); false when cut short. */
static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

static bool walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                 char *path, size_t pathsz, size_t used, int depth) {
  if (depth > DEPTH_MAX) return false;
  while (p < end) {
    uint64_t key, n;
    if (!varint(&p, end, &key)) return false;
    unsigned wire = (unsigned)(key & 7);
    uint32_t number = (uint32_t)(key >> 3);
    switch (wire) {
      case 0:
        if (!varint(&p, end, &n)) return false;
        continue;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        continue;
      case 5:
        if (end - p < 4) return false;
        p += 4;
        continue;
      case 2:
        break;
      default:
        return false; /* groups are not in proto3; the decoder refuses them */
    }
    if (!varint(&p, end, &n) || n > (uint64_t)(end - p)) return false;
    const uint8_t *body = p;
    p += n;
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, number);
    if (!f) continue;
    size_t at = used;
    if (pathsz > used)
      at += (size_t)snprintf(path + used, pathsz - used, "%s%s", used ? "." : "", f->name);
    if (at >= pathsz) at = pathsz - 1;
    if (f->type == PROTOBUF_C_TYPE_STRING && memchr(body, 0, (size_t)n)) return true;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
        walk(f->descriptor, body, body + n, path, pathsz, at, depth + 1))
      return true;
    if (pathsz > used) path[used] = '\0';
  }
  return false;
}

bool pbstr_find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                    char *path, size_t pathsz) {
  if (pathsz) path[0] = '\0';
  if (!data || !len) return false;
  return walk(d, data, data + len, path, pathsz, 0, 0);
}
