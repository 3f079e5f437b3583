/* fuzz_jobspec.c - libFuzzer target for the job spec: arbitrary bytes are
 * parsed as a JSON spec and validated; a spec that validates must serialize
 * and parse back to the identical struct. Input starting with the byte 0x01
 * is read instead as "path\nvalue\n" pairs for jobspec_set_flag. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"

static void check_round_trip(jobspec_t *s) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  if (jobspec_validate(s, false, &errs) == 0) {
    char *text = jobspec_dumps(s, false);
    jobspec_t back;
    jobspec_init(&back);
    if (!text || jobspec_parse_json(&back, text, strlen(text), &errs) != 0 ||
        jobspec_validate(&back, false, &errs) != 0 || memcmp(s, &back, sizeof back) != 0)
      abort(); /* a valid spec must survive its own serialization */
    free(text);
  }
  ty_errlist_clear(&errs);
}

static void run_flags(const uint8_t *data, size_t size) {
  char *buf = malloc(size + 1);
  memcpy(buf, data, size);
  buf[size] = '\0';
  jobspec_t s;
  jobspec_init(&s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  char *save = NULL, *path = strtok_r(buf, "\n", &save);
  while (path) {
    char *value = strtok_r(NULL, "\n", &save);
    if (!value) break;
    jobspec_set_flag(&s, path, value, &errs);
    path = strtok_r(NULL, "\n", &save);
  }
  ty_errlist_clear(&errs);
  check_round_trip(&s);
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 0 && data[0] == 1) {
    run_flags(data + 1, size - 1);
    return 0;
  }
  jobspec_t s;
  jobspec_init(&s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = jobspec_parse_json(&s, (const char *)data, size, &errs);
  ty_errlist_clear(&errs);
  if (rc == 0) check_round_trip(&s);
  return 0;
}
