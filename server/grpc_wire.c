/* grpc_wire.c - protobuf-c <-> grpc_byte_buffer, google.rpc.Status error
 * details and metadata look-ups for the gRPC front end. */
#include "server/grpc_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "api/google_rpc.pb-c.h"
#include "api/jobspec_pb.h"
#include "common/xalloc.h"
#include "server/pb_strings.h"

int gwire_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d, size_t max,
                 ProtobufCMessage **out, char *msg, size_t msgsz) {
  *out = NULL;
  grpc_slice all = grpc_empty_slice();
  if (bb) {
    if (grpc_byte_buffer_length(bb) > max) {
      if (msg)
        snprintf(msg, msgsz, "the %s message is %zu bytes; the limit is %zu", d->short_name,
                 grpc_byte_buffer_length(bb), max);
      return TY_EEXHAUSTED;
    }
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) {
      if (msg) snprintf(msg, msgsz, "the %s message cannot be decompressed", d->short_name);
      return TY_EINVAL;
    }
    all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
  }
  *out = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
  if (!*out) {
    grpc_slice_unref(all);
    if (msg)
      snprintf(msg, msgsz, "the request is not a valid %s message (protobuf decoding failed)",
               d->name);
    return TY_EINVAL;
  }
  char field[128];
  if (pbstr_find_nul(d, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all), field, sizeof field)) {
    if (msg)
      snprintf(msg, msgsz, "field %s holds a NUL byte; no string of this API may hold one", field);
    protobuf_c_message_free_unpacked(*out, NULL);
    *out = NULL;
    grpc_slice_unref(all);
    return TY_EINVAL;
  }
  grpc_slice_unref(all);
  return 0;
}

grpc_byte_buffer *gwire_pack(const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(len);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

grpc_slice gwire_status_details(int code, const char *message, const ty_errlist_t *errs) {
  Trainyard__Rpc__Status st = TRAINYARD__RPC__STATUS__INIT;
  st.code = ty_err_grpc_status(code);
  st.message = (char *)(message ? message : ty_err_name(code));

  /* One BadRequest with a FieldViolation per field error; the structs point
   * into errs (borrowed) and live on this frame until packed. */
  size_t n = errs ? errs->len : 0;
  Trainyard__Rpc__BadRequest__FieldViolation *fv = n ? xcalloc(n, sizeof *fv) : NULL;
  Trainyard__Rpc__BadRequest__FieldViolation **fvp = n ? xcalloc(n, sizeof *fvp) : NULL;
  for (size_t i = 0; i < n; i++) {
    trainyard__rpc__bad_request__field_violation__init(&fv[i]);
    fv[i].field = errs->items[i].field ? errs->items[i].field : "";
    fv[i].description = errs->items[i].message ? errs->items[i].message : "";
    fvp[i] = &fv[i];
  }
  Trainyard__Rpc__BadRequest br = TRAINYARD__RPC__BAD_REQUEST__INIT;
  br.n_field_violations = n;
  br.field_violations = fvp;
  uint8_t *brbuf = NULL;
  Trainyard__Rpc__AnyDetail any = TRAINYARD__RPC__ANY_DETAIL__INIT;
  Trainyard__Rpc__AnyDetail *anyp = &any;
  if (n) {
    brbuf = xmalloc(trainyard__rpc__bad_request__get_packed_size(&br) + 1);
    any.type_url = GWIRE_BAD_REQUEST_URL;
    any.value.len = trainyard__rpc__bad_request__pack(&br, brbuf);
    any.value.data = brbuf;
    st.n_details = 1;
    st.details = &anyp;
  }
  grpc_slice out = grpc_slice_malloc(trainyard__rpc__status__get_packed_size(&st));
  trainyard__rpc__status__pack(&st, GRPC_SLICE_START_PTR(out));
  free(brbuf);
  free(fvp);
  free(fv);
  return out;
}

grpc_slice gwire_error_details(int code, const char *message, const ty_errlist_t *errs) {
  Trainyard__V1__Error *e = ty_error_to_pb(code, message, errs);
  grpc_slice out = grpc_slice_malloc(trainyard__v1__error__get_packed_size(e));
  trainyard__v1__error__pack(e, GRPC_SLICE_START_PTR(out));
  trainyard__v1__error__free_unpacked(e, NULL);
  return out;
}

int gwire_status_decode(const void *data, size_t len, int *grpc_code, char *msg, size_t msgsz,
                        ty_errlist_t *errs) {
  Trainyard__Rpc__Status *st = trainyard__rpc__status__unpack(NULL, len, data);
  if (!st) return TY_EINVAL;
  int rc = 0;
  *grpc_code = st->code;
  if (msg) snprintf(msg, msgsz, "%s", st->message);
  for (size_t i = 0; i < st->n_details && !rc; i++) {
    if (strcmp(st->details[i]->type_url, GWIRE_BAD_REQUEST_URL)) {
      rc = TY_EINVAL;
      break;
    }
    Trainyard__Rpc__BadRequest *br = trainyard__rpc__bad_request__unpack(
        NULL, st->details[i]->value.len, st->details[i]->value.data);
    if (!br) {
      rc = TY_EINVAL;
      break;
    }
    for (size_t j = 0; j < br->n_field_violations; j++)
      ty_errlist_add(errs, br->field_violations[j]->field, "%s",
                     br->field_violations[j]->description);
    trainyard__rpc__bad_request__free_unpacked(br, NULL);
  }
  trainyard__rpc__status__free_unpacked(st, NULL);
  return rc;
}

bool gwire_metadata_get(const grpc_metadata_array *md, const char *key, char *out, size_t outsz) {
  for (size_t i = 0; i < md->count; i++) {
    if (grpc_slice_str_cmp(md->metadata[i].key, key)) continue;
    size_t len = GRPC_SLICE_LENGTH(md->metadata[i].value);
    if (len + 1 > outsz) return false;
    memcpy(out, GRPC_SLICE_START_PTR(md->metadata[i].value), len);
    out[len] = '\0';
    return true;
  }
  return false;
}

const char *gwire_bearer(const char *value) {
  if (strncasecmp(value, "Bearer ", 7)) return NULL;
  value += 7;
  while (*value == ' ') value++;
  return *value ? value : NULL;
}
