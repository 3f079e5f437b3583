/* test_wire_grpc.c - the gRPC front end's bytes: protobuf-c messages in and
 * out of grpc_byte_buffer, the google.rpc.Status details (checked against
 * hand-encoded protobuf, so the wire format is not only self-consistent),
 * metadata look-ups and bearer tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "api/trainyard.pb-c.h"
#include "server/grpc_wire.h"

static void test_pack_unpack_round_trip(void **state) {
  (void)state;
  Trainyard__V1__WatchJobRequest req = TRAINYARD__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = "j-0123";
  req.has_after_seq = true;
  req.after_seq = 41;
  grpc_byte_buffer *bb = gwire_pack(&req.base);
  ProtobufCMessage *m = NULL;
  char msg[256] = "";
  assert_int_equal(
      gwire_unpack(bb, &trainyard__v1__watch_job_request__descriptor, 1024, &m, msg, sizeof msg),
      0);
  Trainyard__V1__WatchJobRequest *got = (void *)m;
  assert_string_equal(got->job_id, "j-0123");
  assert_true(got->has_after_seq);
  assert_int_equal(got->after_seq, 41);
  protobuf_c_message_free_unpacked(m, NULL);

  /* A limit below the message's size is refused before decoding. */
  assert_int_equal(
      gwire_unpack(bb, &trainyard__v1__watch_job_request__descriptor, 3, &m, msg, sizeof msg),
      TY_EEXHAUSTED);
  assert_null(m);
  assert_non_null(strstr(msg, "limit"));
  grpc_byte_buffer_destroy(bb);
}

static void test_unpack_spans_slices_and_empty(void **state) {
  (void)state;
  /* GetJobRequest{job_id: "abc"} = 0a 03 61 62 63, split over two slices. */
  grpc_slice parts[2] = {grpc_slice_from_copied_buffer("\x0a\x03"
                                                       "a",
                                                       3),
                         grpc_slice_from_copied_buffer("bc", 2)};
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 2);
  grpc_slice_unref(parts[0]);
  grpc_slice_unref(parts[1]);
  ProtobufCMessage *m = NULL;
  assert_int_equal(gwire_unpack(bb, &trainyard__v1__get_job_request__descriptor, 64, &m, NULL, 0),
                   0);
  assert_string_equal(((Trainyard__V1__GetJobRequest *)m)->job_id, "abc");
  protobuf_c_message_free_unpacked(m, NULL);
  grpc_byte_buffer_destroy(bb);

  /* No payload is the empty message. */
  assert_int_equal(gwire_unpack(NULL, &trainyard__v1__get_job_request__descriptor, 64, &m, NULL, 0),
                   0);
  assert_null(((Trainyard__V1__GetJobRequest *)m)->job_id);
  protobuf_c_message_free_unpacked(m, NULL);
}

static void test_unpack_rejects_malformed_bytes(void **state) {
  (void)state;
  grpc_slice s = grpc_slice_from_copied_buffer(
      "\x0a\x09"
      "ab",
      4); /* length past the end */
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  ProtobufCMessage *m = NULL;
  char msg[256];
  assert_int_equal(
      gwire_unpack(bb, &trainyard__v1__get_job_request__descriptor, 64, &m, msg, sizeof msg),
      TY_EINVAL);
  assert_null(m);
  assert_non_null(strstr(msg, "trainyard.v1.GetJobRequest"));
  grpc_byte_buffer_destroy(bb);
}

/* google.rpc.Status{code: 5, message: "x"}, encoded by hand. */
static void test_status_without_details_matches_the_wire_format(void **state) {
  (void)state;
  grpc_slice s = gwire_status_details(TY_ENOTFOUND, "x", NULL);
  const unsigned char want[] = {0x08, 0x05, 0x12, 0x01, 'x'};
  assert_int_equal(GRPC_SLICE_LENGTH(s), sizeof want);
  assert_memory_equal(GRPC_SLICE_START_PTR(s), want, sizeof want);
  grpc_slice_unref(s);
}

/* google.rpc.Status{code: 3, message: "m", details: [Any{type_url:
 * ".../google.rpc.BadRequest", value: BadRequest{field_violations:
 * [{field: "a", description: "b"}]}}]}, encoded by hand. */
static void test_status_with_bad_request_matches_the_wire_format(void **state) {
  (void)state;
  ty_errlist_t errs = TY_ERRLIST_INIT;
  ty_errlist_add(&errs, "a", "b");
  grpc_slice s = gwire_status_details(TY_EINVAL, "m", &errs);
  const char url[] = GWIRE_BAD_REQUEST_URL;
  const unsigned char br[] = {0x0a, 0x06, 0x0a, 0x01, 'a', 0x12, 0x01, 'b'};
  unsigned char want[128];
  size_t n = 0, any_len = 2 + (sizeof url - 1) + 2 + sizeof br;
  want[n++] = 0x08, want[n++] = 0x03; /* code = 3 */
  want[n++] = 0x12, want[n++] = 0x01, want[n++] = 'm';
  want[n++] = 0x1a, want[n++] = (unsigned char)any_len; /* details[0] */
  want[n++] = 0x0a, want[n++] = (unsigned char)(sizeof url - 1);
  memcpy(want + n, url, sizeof url - 1), n += sizeof url - 1;
  want[n++] = 0x12, want[n++] = (unsigned char)sizeof br;
  memcpy(want + n, br, sizeof br), n += sizeof br;
  assert_int_equal(GRPC_SLICE_LENGTH(s), n);
  assert_memory_equal(GRPC_SLICE_START_PTR(s), want, n);
  grpc_slice_unref(s);
  ty_errlist_clear(&errs);
}

static void test_status_round_trip(void **state) {
  (void)state;
  ty_errlist_t errs = TY_ERRLIST_INIT, got = TY_ERRLIST_INIT;
  ty_errlist_add(&errs, "world_size", "must be >= 1, got %d", 0);
  ty_errlist_add(&errs, "", "the spec as a whole");
  grpc_slice s = gwire_status_details(TY_EINVAL, "the job spec is invalid", &errs);
  int code = 0;
  char msg[128];
  assert_int_equal(gwire_status_decode(GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), &code, msg,
                                       sizeof msg, &got),
                   0);
  assert_int_equal(code, 3);
  assert_string_equal(msg, "the job spec is invalid");
  assert_int_equal(got.len, 2);
  assert_string_equal(got.items[0].field, "world_size");
  assert_string_equal(got.items[0].message, "must be >= 1, got 0");
  assert_string_equal(got.items[1].field, "");
  grpc_slice_unref(s);

  /* The trainyard.v1.Error form carries the same. */
  s = gwire_error_details(TY_EINVAL, "the job spec is invalid", &errs);
  Trainyard__V1__Error *e =
      trainyard__v1__error__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  assert_non_null(e);
  assert_string_equal(e->code, "INVALID_ARGUMENT");
  assert_int_equal(e->n_details, 2);
  assert_string_equal(e->details[0]->field, "world_size");
  trainyard__v1__error__free_unpacked(e, NULL);
  grpc_slice_unref(s);
  assert_int_equal(gwire_status_decode("\xff", 1, &code, msg, sizeof msg, &got), TY_EINVAL);
  ty_errlist_clear(&errs);
  ty_errlist_clear(&got);
}

static void test_metadata_and_bearer(void **state) {
  (void)state;
  grpc_metadata md[2];
  md[0].key = grpc_slice_from_static_string("user-agent");
  md[0].value = grpc_slice_from_static_string("grpc-python");
  md[1].key = grpc_slice_from_static_string("authorization");
  md[1].value = grpc_slice_from_static_string("Bearer  s3cret");
  grpc_metadata_array arr = {2, 2, md};
  char out[32];
  assert_true(gwire_metadata_get(&arr, "authorization", out, sizeof out));
  assert_string_equal(gwire_bearer(out), "s3cret");
  assert_false(gwire_metadata_get(&arr, "authorization", out, 8)); /* does not fit */
  assert_false(gwire_metadata_get(&arr, "x-missing", out, sizeof out));
  assert_null(gwire_bearer("Basic abc"));
  assert_null(gwire_bearer("Bearer "));
  assert_string_equal(gwire_bearer("bearer t"), "t");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pack_unpack_round_trip),
      cmocka_unit_test(test_unpack_spans_slices_and_empty),
      cmocka_unit_test(test_unpack_rejects_malformed_bytes),
      cmocka_unit_test(test_status_without_details_matches_the_wire_format),
      cmocka_unit_test(test_status_with_bad_request_matches_the_wire_format),
      cmocka_unit_test(test_status_round_trip),
      cmocka_unit_test(test_metadata_and_bearer),
  };
  grpc_init();
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  grpc_shutdown();
  return rc;
}
