/* pbjson_pb.c - protobuf-c messages to and from JSON trees through their
 * descriptors; see pbjson.h. */
#include "api/pbjson.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec_internal.h"
#include "common/json_util.h"
#include "common/xalloc.h"

/* "JOB_STATE_" for JobState: the prefix protoc-style names carry. */
static void enum_prefix(const ProtobufCEnumDescriptor *d, char *buf, size_t cap) {
  size_t o = 0;
  for (const char *p = d->short_name; *p && o + 3 < cap; p++) {
    if (p != d->short_name && isupper((unsigned char)*p)) buf[o++] = '_';
    buf[o++] = (char)toupper((unsigned char)*p);
  }
  buf[o++] = '_';
  buf[o] = '\0';
}

const char *pbjson_enum_name(const ProtobufCEnumDescriptor *d, int value, char *buf, size_t cap) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
  if (!v) return NULL;
  char pre[128];
  enum_prefix(d, pre, sizeof pre);
  const char *n = v->name;
  if (!strncmp(n, pre, strlen(pre))) n += strlen(pre);
  size_t i = 0;
  for (; n[i] && i + 1 < cap; i++) buf[i] = (char)tolower((unsigned char)n[i]);
  buf[i] = '\0';
  return buf;
}

int pbjson_enum_value(const ProtobufCEnumDescriptor *d, const char *name, int *out) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value_by_name(d, name);
  if (!v) {
    char full[256];
    size_t o;
    enum_prefix(d, full, sizeof full);
    o = strlen(full);
    for (const char *p = name; *p && o + 1 < sizeof full; p++)
      full[o++] = (char)toupper((unsigned char)*p);
    full[o] = '\0';
    v = protobuf_c_enum_descriptor_get_value_by_name(d, full);
  }
  if (!v) return -1;
  *out = v->value;
  return 0;
}

static size_t elem_size(ProtobufCType t) {
  switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
      return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
      return 8;
    case PROTOBUF_C_TYPE_FLOAT:
      return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
      return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
      return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
      return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
      return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
      return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
      return sizeof(ProtobufCMessage *);
  }
  return 0;
}

/* ---- message -> JSON ---- */

static json_t *value_to_json(const ProtobufCFieldDescriptor *f, const void *p, const char *path,
                             ty_errlist_t *errs) {
  char buf[128];
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
      return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
      return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
      return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
      uint64_t u = *(const uint64_t *)p;
      if (u > INT64_MAX) {
        ty_errlist_add(errs, path, "%llu is out of range: at most 9223372036854775807",
                       (unsigned long long)u);
        return NULL;
      }
      return json_integer((json_int_t)u);
    }
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
      double d = f->type == PROTOBUF_C_TYPE_FLOAT ? *(const float *)p : *(const double *)p;
      if (!isfinite(d)) {
        ty_errlist_add(errs, path, "must be a finite number");
        return NULL;
      }
      return json_real(d);
    }
    case PROTOBUF_C_TYPE_BOOL:
      return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
      int v = *(const int *)p;
      const char *n = pbjson_enum_name(f->descriptor, v, buf, sizeof buf);
      if (!n) {
        ty_errlist_add(errs, path, "unknown enum value %d", v);
        return NULL;
      }
      return json_string(n);
    }
    case PROTOBUF_C_TYPE_STRING: {
      const char *s = *(char *const *)p;
      json_t *j = json_string(s);
      if (!j) ty_errlist_add(errs, path, "is not valid UTF-8");
      return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE:
      return pbjson_from_message(*(ProtobufCMessage *const *)p, path, errs);
    case PROTOBUF_C_TYPE_BYTES:
      break;
  }
  ty_errlist_add(errs, path, "bytes fields are not supported");
  return NULL;
}

json_t *pbjson_from_message(const ProtobufCMessage *m, const char *path, ty_errlist_t *errs) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  json_t *o = json_object();
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m;
    char fp[256];
    snprintf(fp, sizeof fp, "%s%s%s", path, *path ? "." : "", f->name);
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(const void *)(base + f->quantifier_offset);
      if (!n) continue;
      const char *arr = *(char *const *)(const void *)(base + f->offset);
      json_t *a = json_array();
      for (size_t k = 0; k < n; k++) {
        char ep[280];
        snprintf(ep, sizeof ep, "%s[%zu]", fp, k);
        json_t *v = value_to_json(f, arr + k * elem_size(f->type), ep, errs);
        if (v) json_array_append_new(a, v);
      }
      json_object_set_new(o, f->name, a);
      continue;
    }
    const void *p = base + f->offset;
    bool present;
    if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)
      present = *(void *const *)p != NULL;
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
      present = *(const protobuf_c_boolean *)(const void *)(base + f->quantifier_offset);
    else
      present = true; /* required, or proto3 implicit presence */
    if (!present) continue;
    json_t *v = value_to_json(f, p, fp, errs);
    if (v) json_object_set_new(o, f->name, v);
  }
  return o;
}

/* ---- JSON -> message ---- */

/* Stores v at p (an element of f's type). 0, or -1 with an error added. */
static int value_from_json(const ProtobufCFieldDescriptor *f, const json_t *v, void *p,
                           const char *path, ty_errlist_t *errs) {
  json_int_t i = 0;
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
      /* An integral real (SQLite REAL columns, 1e3) counts as an integer. */
      double d = json_is_real(v) ? json_real_value(v) : 0.5;
      if (!json_is_integer(v) && !(d == floor(d) && fabs(d) < 9e18)) {
        ty_errlist_add(errs, path, "must be an integer, got %s", ty_json_kind(v));
        return -1;
      }
      i = json_is_integer(v) ? json_integer_value(v) : (json_int_t)d;
      bool u = f->type == PROTOBUF_C_TYPE_UINT32 || f->type == PROTOBUF_C_TYPE_FIXED32 ||
               f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_FIXED64;
      bool w64 = elem_size(f->type) == 8;
      json_int_t lo = u ? 0 : (w64 ? INT64_MIN : INT32_MIN);
      json_int_t hi = w64 ? INT64_MAX : (u ? (json_int_t)UINT32_MAX : INT32_MAX);
      if (i < lo || i > hi) {
        ty_errlist_add(errs, path, "%lld is out of range", (long long)i);
        return -1;
      }
      if (w64)
        *(int64_t *)p = (int64_t)i;
      else if (u)
        *(uint32_t *)p = (uint32_t)i;
      else
        *(int32_t *)p = (int32_t)i;
      return 0;
    }
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE:
      if (!json_is_number(v)) {
        ty_errlist_add(errs, path, "must be a number, got %s", ty_json_kind(v));
        return -1;
      }
      if (f->type == PROTOBUF_C_TYPE_FLOAT)
        *(float *)p = (float)json_number_value(v);
      else
        *(double *)p = json_number_value(v);
      return 0;
    case PROTOBUF_C_TYPE_BOOL:
      if (!json_is_boolean(v)) {
        ty_errlist_add(errs, path, "must be true or false, got %s", ty_json_kind(v));
        return -1;
      }
      *(protobuf_c_boolean *)p = json_is_true(v);
      return 0;
    case PROTOBUF_C_TYPE_ENUM: {
      int e;
      if (!json_is_string(v) || pbjson_enum_value(f->descriptor, json_string_value(v), &e) != 0) {
        ty_errlist_add(errs, path, "unknown value %s",
                       json_is_string(v) ? json_string_value(v) : ty_json_kind(v));
        return -1;
      }
      *(int *)p = e;
      return 0;
    }
    case PROTOBUF_C_TYPE_STRING:
      if (!json_is_string(v)) {
        ty_errlist_add(errs, path, "must be a string, got %s", ty_json_kind(v));
        return -1;
      }
      *(char **)p = xstrdup(json_string_value(v));
      return 0;
    case PROTOBUF_C_TYPE_MESSAGE: {
      ProtobufCMessage *sub = pbjson_to_message(v, f->descriptor, path, errs);
      if (!sub) return -1;
      *(ProtobufCMessage **)p = sub;
      return 0;
    }
    case PROTOBUF_C_TYPE_BYTES:
      break;
  }
  ty_errlist_add(errs, path, "bytes fields are not supported");
  return -1;
}

ProtobufCMessage *pbjson_to_message(const json_t *j, const ProtobufCMessageDescriptor *d,
                                    const char *path, ty_errlist_t *errs) {
  if (!json_is_object(j)) {
    ty_errlist_add(errs, path, "must be an object, got %s", ty_json_kind(j));
    return NULL;
  }
  size_t before = errs->len;
  ProtobufCMessage *m = xcalloc(1, d->sizeof_message);
  protobuf_c_message_init(d, m);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)j, key, v) {
    char fp[256];
    jobspec_path_join(fp, sizeof fp, path, key);
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, key);
    if (!f) {
      ty_errlist_add(errs, fp, "unknown field");
      continue;
    }
    if (json_is_null(v)) continue;
    char *base = (char *)m;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      if (!json_is_array(v)) {
        ty_errlist_add(errs, fp, "must be a list, got %s", ty_json_kind(v));
        continue;
      }
      size_t n = json_array_size(v), es = elem_size(f->type), k;
      char *arr = xcalloc(n ? n : 1, es);
      /* Set the count as elements are filled, so a failure frees cleanly. */
      size_t *count = (size_t *)(void *)(base + f->quantifier_offset);
      *(char **)(void *)(base + f->offset) = arr;
      *count = 0;
      json_t *e;
      json_array_foreach(v, k, e) {
        char ep[280];
        snprintf(ep, sizeof ep, "%s[%zu]", fp, k);
        if (value_from_json(f, e, arr + *count * es, ep, errs) == 0) (*count)++;
      }
      continue;
    }
    if (value_from_json(f, v, base + f->offset, fp, errs) == 0 &&
        f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
        f->type != PROTOBUF_C_TYPE_MESSAGE)
      *(protobuf_c_boolean *)(void *)(base + f->quantifier_offset) = 1;
  }
  if (errs->len > before) {
    protobuf_c_message_free_unpacked(m, NULL);
    return NULL;
  }
  return m;
}
