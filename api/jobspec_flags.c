/* jobspec_flags.c - the job spec from dotted command-line flags layered over
 * an optional spec file (--fsdp.memory_efficient_load true --model_path DIR);
 * see jobspec.h. Each flag's text becomes a JSON value and goes through the
 * same setter as the JSON parser, so both accept exactly the same values. */
#include "api/jobspec.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/jobspec_internal.h"
#include "common/xalloc.h"

static int parse_bool(const char *v, bool *out) {
  static const char *const yes[] = {"true", "1", "yes", "on"};
  static const char *const no[] = {"false", "0", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (!strcmp(v, yes[i])) return *out = true, 0;
    if (!strcmp(v, no[i])) return *out = false, 0;
  }
  return -1;
}

/* "q_proj,v_proj" -> ["q_proj", "v_proj"]; "all-linear" stays a string; a
 * value starting with '[' is read as a JSON array. NULL when it is not
 * valid JSON (the error is added). */
static json_t *targets_value(const char *v, const char *path, ty_errlist_t *errs) {
  if (!strcmp(v, "all-linear")) return json_string(v);
  if (v[0] == '[') {
    json_error_t je;
    json_t *a = json_loads(v, JSON_REJECT_DUPLICATES, &je);
    if (!a) ty_errlist_add(errs, path, "invalid JSON list at column %d: %s", je.column, je.text);
    return a;
  }
  json_t *a = json_array();
  const char *p = v;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n && *p == ' ') p++, n--;
    while (n && p[n - 1] == ' ') n--;
    json_t *item = n ? json_stringn(p, n) : NULL;
    if (n && !item) {
      ty_errlist_add(errs, path, "is not valid UTF-8");
      json_decref(a);
      return NULL;
    }
    if (item) json_array_append_new(a, item);
    if (!end) break;
    p = end + 1;
  }
  return a;
}

/* The JSON value a flag's text stands for, by the field's type; NULL with
 * an error added when the text does not parse. */
static json_t *flag_value(const jobspec_field_t *f, const char *v, const char *path,
                          ty_errlist_t *errs) {
  char *end;
  switch (f->type) {
    case JF_BOOL: {
      bool b;
      if (parse_bool(v, &b) == 0) return json_boolean(b);
      ty_errlist_add(errs, path, "must be true or false, got '%s'", v);
      return NULL;
    }
    case JF_INT:
    case JF_U64: {
      errno = 0;
      long long x = strtoll(v, &end, 10);
      if (end == v || *end) {
        ty_errlist_add(errs, path, "must be an integer, got '%s'", v);
        return NULL;
      }
      if (errno == ERANGE) {
        ty_errlist_add(errs, path, "%s is out of range", v);
        return NULL;
      }
      return json_integer((json_int_t)x);
    }
    case JF_DOUBLE: {
      errno = 0;
      double d = strtod(v, &end);
      if (end == v || *end) {
        ty_errlist_add(errs, path, "must be a number, got '%s'", v);
        return NULL;
      }
      if (!isfinite(d)) {
        ty_errlist_add(errs, path, "must be a finite number, got '%s'", v);
        return NULL;
      }
      return json_real(d);
    }
    case JF_TARGETS:
      return targets_value(v, path, errs);
    case JF_STRINGS: { /* a JSON list, or one string */
      if (v[0] != '[') {
        json_t *one = json_pack("[s]", v);
        if (!one) ty_errlist_add(errs, path, "is not valid UTF-8");
        return one;
      }
      json_error_t je;
      json_t *a = json_loads(v, JSON_REJECT_DUPLICATES, &je);
      if (!a)
        ty_errlist_add(errs, path,
                       "must be a JSON list of strings (invalid JSON at column %d: %s), or one "
                       "string not starting with '['",
                       je.column, je.text);
      return a;
    }
    case JF_MODEL: {
      json_error_t je;
      json_t *m = json_loads(v, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
      if (!m) {
        ty_errlist_add(errs, path,
                       "must be a JSON object of Llama config.json fields or null (invalid "
                       "JSON at column %d: %s); or give --model.<field> flags",
                       je.column, je.text);
      }
      return m;
    }
    default: { /* strings, enums, dtypes */
      json_t *str = json_string(v);
      if (!str) ty_errlist_add(errs, path, "is not valid UTF-8");
      return str;
    }
  }
}

/* --model.hidden_size 64: one field of the inline model config. */
static int set_model_field(jobspec_t *s, const char *key, const char *value, const char *path,
                           ty_errlist_t *errs) {
  json_t *v = NULL;
  bool b;
  char *end;
  errno = 0;
  long long i = strtoll(value, &end, 10);
  if (end != value && !*end && errno != ERANGE) {
    v = json_integer((json_int_t)i);
  } else {
    double d = strtod(value, &end);
    if (end != value && !*end)
      v = json_real(isfinite(d) ? d : NAN);
    else if (parse_bool(value, &b) == 0)
      v = json_boolean(b);
    else
      v = json_string(value);
  }
  if (!v) { /* json_real refuses NaN and infinities, json_string bad UTF-8 */
    ty_errlist_add(errs, path, "must be a finite number or valid UTF-8 text, got '%s'", value);
    return TY_EINVAL;
  }
  json_t *obj = json_object();
  if (json_object_set_new(obj, key, v) != 0) { /* the key is not valid UTF-8 */
    ty_errlist_add(errs, path, "is not a valid field name");
    json_decref(obj);
    return TY_EINVAL;
  }
  if (!s->has_model) llama_config_init(&s->model);
  llama_config_t c = s->model;
  int rc = llama_config_from_json(obj, &c, "model", true, errs);
  json_decref(obj);
  if (rc == 0) {
    s->model = c;
    s->has_model = true;
  }
  return rc;
}

int jobspec_set_flag(jobspec_t *s, const char *path, const char *value, ty_errlist_t *errs) {
  size_t before = errs->len;
  if (!strncmp(path, "model.", 6)) return set_model_field(s, path + 6, value, path, errs);
  const jobspec_field_t *f = jobspec_field_find(path);
  if (!f || f->type == JF_OBJECT) {
    const char *names[64];
    size_t n = 0;
    for (size_t i = 0; i < jobspec_nfields && n < 64; i++)
      if (jobspec_fields[i].type != JF_OBJECT) names[n++] = jobspec_fields[i].path;
    const char *near = jobspec_closest(path, names, n);
    char sug[256];
    if (!near) {
      const char *dot = strrchr(path, '.');
      near = jobspec_suggest_field("", dot ? dot + 1 : path, sug, sizeof sug);
    }
    const char *whose, *ours = jobspec_other_name(path, &whose);
    if (ours)
      ty_errlist_add(errs, path, "unknown flag --%s; trainyard calls it --%s (%s)", path, ours,
                     whose);
    else if (f)
      ty_errlist_add(errs, path, "is a group; set its fields, e.g. --%s.%s", path,
                     strchr(jobspec_fields[(f - jobspec_fields) + 1].path, '.') + 1);
    else if (near)
      ty_errlist_add(errs, path, "unknown flag --%s; did you mean --%s?", path, near);
    else
      ty_errlist_add(errs, path, "unknown flag --%s; 'trainyard validate --fields' lists them",
                     path);
    return TY_EINVAL;
  }
  json_t *v = flag_value(f, value, path, errs);
  if (v) jobspec_set_json(s, f, v, path, errs);
  json_decref(v);
  return errs->len > before ? TY_EINVAL : 0;
}

static bool is_passthrough(const char *name, size_t n, const char *const *passthrough) {
  for (size_t i = 0; passthrough && passthrough[i]; i++)
    if (strlen(passthrough[i]) == n && !strncmp(passthrough[i], name, n)) return true;
  return false;
}

/* Reads a whole spec file (at most JOBSPEC_JSON_MAX_BYTES + 1 bytes, so an
 * oversized file is still reported as too big). NULL with an error added. */
static char *read_file(const char *path, size_t *len, ty_errlist_t *errs) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    ty_errlist_add(errs, "", "cannot open spec file %s: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = JOBSPEC_JSON_MAX_BYTES + 2;
  char *buf = xmalloc(cap);
  *len = fread(buf, 1, cap - 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    ty_errlist_add(errs, "", "cannot read spec file %s", path);
    free(buf);
    return NULL;
  }
  buf[*len] = '\0';
  return buf;
}

int jobspec_parse_file(jobspec_t *s, const char *path, ty_errlist_t *errs) {
  size_t len;
  char *text = read_file(path, &len, errs);
  if (!text) return TY_ENOTFOUND;
  ty_errlist_t ferrs = TY_ERRLIST_INIT;
  int rc = jobspec_parse_json(s, text, len, &ferrs);
  /* Whole-document problems name the file they come from. */
  for (size_t i = 0; i < ferrs.len; i++) {
    if (ferrs.items[i].field[0])
      ty_errlist_add(errs, ferrs.items[i].field, "%s", ferrs.items[i].message);
    else
      ty_errlist_add(errs, "", "%s: %s", path, ferrs.items[i].message);
  }
  ty_errlist_clear(&ferrs);
  free(text);
  return rc;
}

/* After a boolean flag, the next argument is its value unless it is a
 * spec file: "--use_lora spec.json" is a bare --use_lora, while
 * "--use_lora maybe" is a bad value (not a file named "maybe"). */
static bool looks_like_file(const char *a) {
  bool b;
  if (parse_bool(a, &b) == 0) return false;
  size_t n = strlen(a);
  return (n > 5 && !strcmp(a + n - 5, ".json")) || access(a, F_OK) == 0;
}

typedef struct {
  const char *name; /* borrowed from argv; not NUL-terminated when from "--a=b" */
  size_t name_len;
  const char *value;
} flag_t;

int jobspec_from_args(jobspec_t *s, int argc, char **argv, const char *const *passthrough,
                      ty_errlist_t *errs) {
  size_t before = errs->len;
  const char *file = NULL;
  flag_t *flags = xcalloc((size_t)(argc > 0 ? argc : 1), sizeof *flags);
  int nflags = 0;
  bool only_files = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (only_files || strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      if (!only_files && !strcmp(a, "--")) {
        only_files = true;
        continue;
      }
      if (file)
        ty_errlist_add(errs, "",
                       "more than one spec file: '%s' and '%s'; give one, and flags "
                       "for the rest",
                       file, a);
      else
        file = a;
      continue;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    if (is_passthrough(name, n, passthrough)) continue;
    flag_t fl = {name, n, NULL};
    if (eq) {
      fl.value = eq + 1;
    } else {
      char tmp[256], *whole = strndup(name, n);
      jobspec_path_join(tmp, sizeof tmp, "", whole ? whole : "");
      free(whole);
      const jobspec_field_t *f = jobspec_field_find(tmp);
      bool next_is_value = i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0;
      if (f && f->type == JF_BOOL && (!next_is_value || looks_like_file(argv[i + 1]))) {
        fl.value = "true"; /* a bare boolean flag: --use_lora [spec.json] */
      } else if (i + 1 < argc) {
        fl.value = argv[++i];
      } else {
        ty_errlist_add(errs, tmp, "flag --%s needs a value", tmp);
        continue;
      }
    }
    flags[nflags++] = fl;
  }
  if (file) jobspec_parse_file(s, file, errs);
  /* Flags win over the file: applied after it, in the order given. */
  for (int i = 0; i < nflags; i++) {
    char path[256];
    if (flags[i].name_len >= sizeof path) {
      ty_errlist_add(errs, "", "a flag name is %zu bytes long; no spec field is",
                     flags[i].name_len);
      continue;
    }
    snprintf(path, sizeof path, "%.*s", (int)flags[i].name_len, flags[i].name);
    jobspec_set_flag(s, path, flags[i].value, errs);
  }
  free(flags);
  return errs->len > before ? TY_EINVAL : 0;
}
