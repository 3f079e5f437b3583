/* jsonl.c - examples of a JSONL file, parsed line by line; see jsonl.h. */
#include "worker/data/jsonl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/errors.h"
#include "common/xalloc.h"

static const char *const g_kinds[] = {"auto", "text", "prompt_completion", "messages"};

/* The string member key of o, or NULL (TY_EINVAL in *rc and err) when it is
 * missing or not a string. */
static const char *str_member(json_t *o, const char *key, size_t *len, const char *path,
                              int64_t lineno, int *rc, char *err, size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) {
    *rc = ty_errf(err, errlen, TY_EINVAL, "%s line %lld: no \"%s\"; a %s example needs it", path,
                  (long long)lineno, key, !strcmp(key, "text") ? "text" : "prompt and completion");
    return NULL;
  }
  if (!json_is_string(v)) {
    *rc = ty_errf(err, errlen, TY_EINVAL, "%s line %lld: \"%s\" must be a string", path,
                  (long long)lineno, key);
    return NULL;
  }
  *len = json_string_length(v);
  return json_string_value(v);
}

/* Checks a messages array: objects with a known role and string content,
 * and at least one assistant turn to learn from. */
static int check_messages(json_t *m, const char *path, int64_t lineno, char *err, size_t errlen) {
  if (!json_is_array(m) || json_array_size(m) == 0)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: \"messages\" must be a non-empty list of {\"role\", "
                   "\"content\"} objects",
                   path, (long long)lineno);
  size_t i, assistants = 0;
  json_t *msg;
  json_array_foreach(m, i, msg) {
    if (!json_is_object(msg))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"messages\"[%zu] is not an object; give {\"role\", "
                     "\"content\"}",
                     path, (long long)lineno, i);
    const char *role = json_string_value(json_object_get(msg, "role"));
    if (!role)
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"messages\"[%zu] has no string \"role\"; roles are system, "
                     "user and assistant",
                     path, (long long)lineno, i);
    if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"messages\"[%zu] has role \"%s\"; roles are system, user "
                     "and assistant",
                     path, (long long)lineno, i, role);
    if (!json_is_string(json_object_get(msg, "content")))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"messages\"[%zu] (%s) has no string \"content\"", path,
                     (long long)lineno, i, role);
    assistants += !strcmp(role, "assistant");
  }
  if (!assistants)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: the conversation has no assistant turn, so nothing to learn; "
                   "add one or drop the line",
                   path, (long long)lineno);
  return 0;
}

int jsonl_parse(const char *line, size_t len, jobspec_data_kind_t want, const char *path,
                int64_t lineno, jsonl_example_t *ex, char *err, size_t errlen) {
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
  if (i == len) return 1;
  memset(ex, 0, sizeof *ex);
  json_error_t je;
  json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
  if (!root)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: not valid JSON at column %d: %s; each line must be one JSON "
                   "object",
                   path, (long long)lineno, je.column, je.text);
  if (!json_is_object(root)) {
    json_decref(root);
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: a JSON object is needed, with \"text\", \"prompt\" and "
                   "\"completion\", or \"messages\"",
                   path, (long long)lineno);
  }
  jobspec_data_kind_t kind = want;
  if (kind == JOBSPEC_KIND_AUTO) {
    if (json_object_get(root, "messages"))
      kind = JOBSPEC_KIND_MESSAGES;
    else if (json_object_get(root, "prompt") || json_object_get(root, "completion"))
      kind = JOBSPEC_KIND_PROMPT_COMPLETION;
    else if (json_object_get(root, "text"))
      kind = JOBSPEC_KIND_TEXT;
    else {
      json_decref(root);
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: no \"text\", \"prompt\"/\"completion\" or \"messages\" key; "
                     "give one of them (or set data.kind)",
                     path, (long long)lineno);
    }
  }
  int rc = 0;
  ex->kind = kind;
  if (kind == JOBSPEC_KIND_TEXT) {
    ex->text = str_member(root, "text", &ex->text_len, path, lineno, &rc, err, errlen);
  } else if (kind == JOBSPEC_KIND_PROMPT_COMPLETION) {
    ex->prompt = str_member(root, "prompt", &ex->prompt_len, path, lineno, &rc, err, errlen);
    if (!rc)
      ex->completion =
          str_member(root, "completion", &ex->completion_len, path, lineno, &rc, err, errlen);
  } else {
    ex->messages = json_object_get(root, "messages");
    if (!ex->messages)
      rc = ty_errf(err, errlen, TY_EINVAL, "%s line %lld: no \"messages\"; data.kind is %s", path,
                   (long long)lineno, g_kinds[want]);
    else
      rc = check_messages(ex->messages, path, lineno, err, errlen);
  }
  if (rc) {
    json_decref(root);
    memset(ex, 0, sizeof *ex);
    return rc;
  }
  ex->root = root;
  return 0;
}

struct jsonl_reader_s {
  FILE *f;
  char *line;
  size_t cap;
  int64_t lineno;
  uint64_t offset, size;
};

int jsonl_open(jsonl_reader_t **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "re");
  if (!f)
    return ty_errf(err, errlen, errno == ENOENT ? TY_ENOTFOUND : TY_EUNAVAILABLE,
                   "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
    fclose(f);
    return ty_errf(err, errlen, TY_EINVAL, "%s is not a regular file", path);
  }
  jsonl_reader_t *r = xcalloc(1, sizeof *r);
  r->f = f;
  r->size = (uint64_t)st.st_size;
  *out = r;
  return 0;
}

int jsonl_next(jsonl_reader_t *r, const char **line, size_t *len, int64_t *lineno, char *err,
               size_t errlen) {
  errno = 0;
  ssize_t n = getline(&r->line, &r->cap, r->f);
  if (n < 0) {
    if (ferror(r->f))
      return ty_errf(err, errlen, TY_EDATALOSS, "reading line %lld: %s", (long long)r->lineno + 1,
                     strerror(errno ? errno : EIO));
    return 1;
  }
  r->offset += (uint64_t)n;
  r->lineno++;
  if (n > 0 && r->line[n - 1] == '\n') r->line[--n] = '\0';
  *line = r->line;
  *len = (size_t)n;
  *lineno = r->lineno;
  return 0;
}

uint64_t jsonl_offset(const jsonl_reader_t *r) {
  return r->offset;
}
uint64_t jsonl_size(const jsonl_reader_t *r) {
  return r->size;
}

void jsonl_close(jsonl_reader_t *r) {
  if (!r) return;
  fclose(r->f);
  free(r->line);
  free(r);
}
