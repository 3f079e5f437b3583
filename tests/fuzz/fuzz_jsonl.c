/* fuzz_jsonl.c - libFuzzer target for the JSONL example reader
 * (worker/data/jsonl.c): arbitrary bytes are a JSONL file, read line by line
 * through jsonl_open/jsonl_next (from a memory file) and parsed with every
 * data.kind. Each line is a blank (1), an example whose kind and fields
 * agree, or a refusal naming the file and the line; the reader counts
 * every byte and line. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/errors.h"
#include "worker/data/jsonl.h"

static void check_example(const jsonl_example_t *ex, jobspec_data_kind_t want) {
  if (ex->kind == JOBSPEC_KIND_AUTO || (want != JOBSPEC_KIND_AUTO && ex->kind != want)) abort();
  if (ex->kind == JOBSPEC_KIND_TEXT && !ex->text) abort();
  if (ex->kind == JOBSPEC_KIND_PROMPT_COMPLETION && (!ex->prompt || !ex->completion)) abort();
  if (ex->kind == JOBSPEC_KIND_MESSAGES) {
    if (!json_is_array(ex->messages) || json_array_size(ex->messages) == 0) abort();
    size_t i, assistants = 0;
    json_t *m;
    json_array_foreach(ex->messages, i, m) {
      const char *role = json_string_value(json_object_get(m, "role"));
      if (!role || !json_is_string(json_object_get(m, "content"))) abort();
      assistants += !strcmp(role, "assistant");
    }
    if (!assistants) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz-jsonl", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size && write(fd, data, size) != (ssize_t)size) {
    close(fd);
    return 0;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  jsonl_reader_t *r;
  char err[1024];
  if (jsonl_open(&r, path, err, sizeof err)) abort();
  const char *line;
  size_t len;
  int64_t lineno, lines = 0;
  int rc;
  while ((rc = jsonl_next(r, &line, &len, &lineno, err, sizeof err)) == 0) {
    if (lineno != ++lines || memchr(line, '\n', len)) abort();
    for (int k = JOBSPEC_KIND_AUTO; k <= JOBSPEC_KIND_MESSAGES; k++) {
      jsonl_example_t ex;
      int prc =
          jsonl_parse(line, len, (jobspec_data_kind_t)k, "f.jsonl", lineno, &ex, err, sizeof err);
      if (prc == 0) {
        check_example(&ex, (jobspec_data_kind_t)k);
        json_decref(ex.root);
      } else if (prc == TY_EINVAL) {
        char want[64];
        snprintf(want, sizeof want, "f.jsonl line %lld: ", (long long)lineno);
        if (strncmp(err, want, strlen(want))) abort();
      } else if (prc != 1) {
        abort();
      }
    }
  }
  if (rc != 1 || jsonl_offset(r) != size || jsonl_size(r) != size) abort();
  jsonl_close(r);
  close(fd);
  return 0;
}
