/* jsonl.c - examples of a JSONL file, parsed line by line; see jsonl.h. */
#include "worker/data/jsonl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/errors.h"
#include "common/xalloc.h"

static const char *const g_kinds[] = {"auto", "text", "prompt_completion", "messages",
                                      "preference"};

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

/* Roles in order around a pair's prompt: a system turn only first, the
 * prompt ending with the user's turn, the response starting with the
 * assistant's. */
static int check_pair_turns(json_t *conv, size_t prompt_turns, const char *side, const char *path,
                            int64_t lineno, char *err, size_t errlen) {
  const size_t n = json_array_size(conv);
  for (size_t i = 1; i < n; i++)
    if (!strcmp(json_string_value(json_object_get(json_array_get(conv, i), "role")), "system"))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"%s\" has a system turn after the first turn (turn %zu of "
                     "the conversation); roles are out of order: a system turn comes first",
                     path, (long long)lineno, side, i);
  const char *last = json_string_value(json_object_get(json_array_get(conv, prompt_turns - 1), "role"));
  if (strcmp(last, "user"))
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: the prompt's last turn is the %s's; roles are out of order: "
                   "the prompt ends with the user's turn that the responses answer",
                   path, (long long)lineno, last);
  const char *first = json_string_value(json_object_get(json_array_get(conv, prompt_turns), "role"));
  if (strcmp(first, "assistant"))
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: the \"%s\" response's first turn is the %s's; roles are out "
                   "of order: a response starts with the assistant's turn",
                   path, (long long)lineno, side, first);
  return 0;
}

/* Turns [0, n) of a, as a new array. */
static json_t *turns(json_t *a, size_t from, size_t n, json_t *out) {
  for (size_t i = from; i < n; i++) json_array_append(out, json_array_get(a, i));
  return out;
}

static bool same_turn(json_t *a, json_t *b) {
  return json_equal(json_object_get(a, "role"), json_object_get(b, "role")) &&
         json_equal(json_object_get(a, "content"), json_object_get(b, "content"));
}

/* A preference pair into ex (whose root is the holder of what is made). */
static int parse_pair(json_t *line, jsonl_example_t *ex, const char *path, int64_t lineno,
                      char *err, size_t errlen) {
  static const char *const names[2] = {"chosen", "rejected"};
  json_t *v[2], *prompt = json_object_get(line, "prompt");
  for (int k = 0; k < 2; k++)
    if (!(v[k] = json_object_get(line, names[k])))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: no \"%s\"; a preference pair needs \"chosen\" and "
                     "\"rejected\" (with train.objective dpo every line is a pair)",
                     path, (long long)lineno, names[k]);
  if (json_is_string(v[0]) || json_is_string(v[1])) {
    for (int k = 0; k < 2; k++)
      if (!json_is_string(v[k]))
        return ty_errf(err, errlen, TY_EINVAL,
                       "%s line %lld: \"%s\" must be a string like \"%s\" (or both lists of "
                       "messages)",
                       path, (long long)lineno, names[k], names[!k]);
    if (!json_is_string(prompt))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: %s; a pair of strings answers a \"prompt\" string: give it "
                     "(or give chosen and rejected as lists of messages whose shared first turns "
                     "are the prompt)",
                     path, (long long)lineno,
                     prompt ? "\"prompt\" is not a string" : "no \"prompt\"");
    ex->prompt = json_string_value(prompt);
    ex->prompt_len = json_string_length(prompt);
    for (int k = 0; k < 2; k++) {
      ex->side[k] = json_string_value(v[k]);
      ex->side_len[k] = json_string_length(v[k]);
    }
    return 0;
  }
  for (int k = 0; k < 2; k++)
    if (!json_is_array(v[k]) || json_array_size(v[k]) == 0)
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"%s\" must be a string or a non-empty list of {\"role\", "
                     "\"content\"} objects",
                     path, (long long)lineno, names[k]);
  ex->conv_form = true;
  size_t np = 0;
  if (prompt) {
    if (!json_is_array(prompt) || json_array_size(prompt) == 0)
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"prompt\" must be a non-empty list of messages when "
                     "\"chosen\" and \"rejected\" are",
                     path, (long long)lineno);
    np = json_array_size(prompt);
    for (int k = 0; k < 2; k++)
      ex->conv[k] = turns(v[k], 0, json_array_size(v[k]), turns(prompt, 0, np, json_array()));
  } else {
    const size_t n0 = json_array_size(v[0]), n1 = json_array_size(v[1]);
    while (np < n0 && np < n1 && same_turn(json_array_get(v[0], np), json_array_get(v[1], np))) np++;
    if (np == 0)
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"chosen\" and \"rejected\" share no first turn, and there "
                     "is no \"prompt\": the two responses must answer one prompt; give "
                     "\"prompt\", or start both conversations with the same turns",
                     path, (long long)lineno);
    if (np == n0 || np == n1)
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: \"%s\" is the other side's first turns with nothing after "
                     "them: a response is the turns after the shared prompt",
                     path, (long long)lineno, names[np == n0 ? 0 : 1]);
    for (int k = 0; k < 2; k++)
      ex->conv[k] = turns(v[k], 0, json_array_size(v[k]), json_array());
  }
  ex->prompt_turns = np;
  json_object_set_new(ex->root, "chosen_conv", ex->conv[0]);
  json_object_set_new(ex->root, "rejected_conv", ex->conv[1]);
  for (int k = 0; k < 2; k++) {
    char e2[512];
    int rc = check_messages(ex->conv[k], path, lineno, e2, sizeof e2);
    if (!rc) rc = check_pair_turns(ex->conv[k], np, names[k], path, lineno, e2, sizeof e2);
    if (rc) return ty_errf(err, errlen, rc, "%s (in \"%s\")", e2, names[k]);
  }
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
    if (json_object_get(root, "chosen") || json_object_get(root, "rejected"))
      kind = JOBSPEC_KIND_PREFERENCE;
    else if (json_object_get(root, "messages"))
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
  } else if (kind == JOBSPEC_KIND_PREFERENCE) {
    ex->root = json_pack("{s:O}", "line", root);
    rc = parse_pair(root, ex, path, lineno, err, errlen);
    json_decref(root);
    if (rc) {
      json_decref(ex->root);
      memset(ex, 0, sizeof *ex);
      return rc;
    }
    return 0;
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
