/* test_pb_strings_grpc.c - a NUL byte inside a string field of a gRPC
 * request is refused with the field's path (pbstr_find_nul, gwire_unpack),
 * as REST refuses one, instead of the string arriving cut short. Messages
 * are hand-encoded: protobuf-c cannot write such a string. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "api/trainyard.pb-c.h"
#include "server/grpc_wire.h"
#include "server/pb_strings.h"

static int unpack(const char *bytes, size_t len, const ProtobufCMessageDescriptor *d, char *msg,
                  size_t msgsz) {
  grpc_slice s = grpc_slice_from_copied_buffer(bytes, len);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  ProtobufCMessage *m = NULL;
  int rc = gwire_unpack(bb, d, 4096, &m, msg, msgsz);
  if (rc) assert_null(m);
  protobuf_c_message_free_unpacked(m, NULL);
  grpc_byte_buffer_destroy(bb);
  return rc;
}

static void test_job_id_with_nul(void **state) {
  (void)state;
  /* GetJobRequest{job_id: "j-1\0x"} */
  static const char b[] = "\x0a\x05j-1\0x";
  char path[64], msg[256];
  assert_true(pbstr_find_nul(&trainyard__v1__get_job_request__descriptor, (const uint8_t *)b,
                             sizeof b - 1, path, sizeof path));
  assert_string_equal(path, "job_id");
  assert_int_equal(
      unpack(b, sizeof b - 1, &trainyard__v1__get_job_request__descriptor, msg, sizeof msg),
      TY_EINVAL);
  assert_non_null(strstr(msg, "job_id holds a NUL byte"));
  /* The same without the NUL passes. */
  static const char ok[] = "\x0a\x05j-1yx";
  assert_false(pbstr_find_nul(&trainyard__v1__get_job_request__descriptor, (const uint8_t *)ok,
                              sizeof ok - 1, path, sizeof path));
  assert_int_equal(
      unpack(ok, sizeof ok - 1, &trainyard__v1__get_job_request__descriptor, msg, sizeof msg), 0);
}

static void test_nested_name_and_idempotency_key(void **state) {
  (void)state;
  char path[64], msg[256];
  /* SubmitJobRequest{spec: {name: "a\0b"}} */
  static const char name[] =
      "\x0a\x05\x0a\x03"
      "a\0b";
  assert_true(pbstr_find_nul(&trainyard__v1__submit_job_request__descriptor, (const uint8_t *)name,
                             sizeof name - 1, path, sizeof path));
  assert_string_equal(path, "spec.name");
  assert_int_equal(unpack(name, sizeof name - 1, &trainyard__v1__submit_job_request__descriptor,
                          msg, sizeof msg),
                   TY_EINVAL);
  /* SubmitJobRequest{spec: {name: "ab"}, idempotency_key: "k\0"}: the
   * path of the spec's field is not left behind in the key's. */
  static const char key[] =
      "\x0a\x04\x0a\x02"
      "ab"
      "\x12\x02k\0";
  assert_true(pbstr_find_nul(&trainyard__v1__submit_job_request__descriptor, (const uint8_t *)key,
                             sizeof key - 1, path, sizeof path));
  assert_string_equal(path, "idempotency_key");
  /* A varint field (after_seq) and an unknown field are skipped. */
  static const char watch[] = "\x10\x29\xfa\x01\x02\0\0\x0a\x01j";
  assert_false(pbstr_find_nul(&trainyard__v1__watch_job_request__descriptor, (const uint8_t *)watch,
                              sizeof watch - 1, path, sizeof path));
  /* Cut short: not reported here; the decoder refuses it. */
  static const char cut[] =
      "\x0a\x09"
      "a\0";
  assert_false(pbstr_find_nul(&trainyard__v1__get_job_request__descriptor, (const uint8_t *)cut,
                              sizeof cut - 1, path, sizeof path));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_job_id_with_nul),
      cmocka_unit_test(test_nested_name_and_idempotency_key),
  };
  grpc_init();
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  grpc_shutdown();
  return rc;
}
