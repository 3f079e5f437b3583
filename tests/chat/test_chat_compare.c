/* test_chat_compare.c - chat templates rendered by text/chat_template
 * against @huggingface/jinja, the renderer of Hugging Face's JavaScript
 * libraries (tests/chat/render.cjs, installed by npm ci from
 * tests/chat/package-lock.json).
 *
 * Cases: every template (the built-ins and the .jinja files of
 * tests/chat/templates)
 * over every conversation of conversations.json, with
 * add_generation_prompt true and false; then the small templates of
 * snippets.json, one construct each. A case passes when both render the
 * same text, or both fail; a raise_exception() failure must carry the same
 * message. Usage: test_chat_compare (TRAINYARD_SRC_DIR, TY_NODE set by
 * ctest); exit 0 when every case passes. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "text/chat_template.h"

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Appends {"name", "source", "context"} to cases. */
static void add_case(json_t *cases, const char *name, const char *source, json_t *context) {
  json_array_append_new(
      cases, json_pack("{s:s, s:s, s:O}", "name", name, "source", source, "context", context));
}

int main(void) {
  const char *src = getenv("TRAINYARD_SRC_DIR"), *node = getenv("TY_NODE");
  if (!src || !node) {
    fprintf(stderr,
            "test_chat_compare: TRAINYARD_SRC_DIR and TY_NODE must be set (ctest sets them)\n");
    return 1;
  }
  char path[8192], dir[4096];
  snprintf(dir, sizeof dir, "%s/tests/chat", src);
  json_error_t je;
  snprintf(path, sizeof path, "%s/conversations.json", dir);
  json_t *convs = json_load_file(path, 0, &je);
  snprintf(path, sizeof path, "%s/snippets.json", dir);
  json_t *snippets = json_load_file(path, 0, &je);
  if (!json_is_array(convs) || !json_is_array(snippets)) {
    fprintf(stderr, "test_chat_compare: cannot read %s: %s\n", path, je.text);
    return 1;
  }

  /* the templates: built-ins, then the files in name order */
  const char *names[64];
  char *sources[64];
  size_t nt = 0;
  static const char *const builtins[] = {"llama3", "llama2", "chatml", "mistral"};
  for (size_t i = 0; i < 4; i++) {
    names[nt] = builtins[i];
    sources[nt++] = strdup(tmpl_builtin(builtins[i]));
  }
  snprintf(path, sizeof path, "%s/templates", dir);
  DIR *d = opendir(path);
  char *files[32];
  size_t nf = 0;
  for (struct dirent *e; d && (e = readdir(d)) && nf < 32;)
    if (strstr(e->d_name, ".jinja")) files[nf++] = strdup(e->d_name);
  if (d) closedir(d);
  qsort(files, nf, sizeof *files, by_name);
  for (size_t i = 0; i < nf && nt < 64; i++) {
    snprintf(path, sizeof path, "%s/templates/%s", dir, files[i]);
    names[nt] = files[i];
    sources[nt++] = read_file(path);
  }

  json_t *cases = json_array();
  char name[512];
  for (size_t t = 0; t < nt; t++) {
    size_t c;
    json_t *conv;
    json_array_foreach(convs, c, conv) {
      for (int gen = 0; gen < 2; gen++) {
        json_t *ctx = json_deep_copy(json_object_get(conv, "context"));
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(gen));
        snprintf(name, sizeof name, "%s / %s / add_generation_prompt=%s", names[t],
                 json_string_value(json_object_get(conv, "name")), gen ? "true" : "false");
        add_case(cases, name, sources[t], ctx);
        json_decref(ctx);
      }
    }
  }
  size_t s;
  json_t *snip;
  json_array_foreach(snippets, s, snip) {
    snprintf(name, sizeof name, "snippet %zu: %s", s,
             json_string_value(json_object_get(snip, "source")));
    json_t *ctx = json_object_get(snip, "context");
    json_t *empty = json_object();
    add_case(cases, name, json_string_value(json_object_get(snip, "source")), ctx ? ctx : empty);
    json_decref(empty);
  }

  /* the reference: one node run for every case */
  char in[] = "/tmp/ty_chat_in_XXXXXX", out[] = "/tmp/ty_chat_out_XXXXXX";
  int fd_in = mkstemp(in), fd_out = mkstemp(out);
  if (fd_in < 0 || fd_out < 0) return perror("mkstemp"), 1;
  close(fd_out);
  FILE *f = fdopen(fd_in, "w");
  json_dumpf(cases, f, JSON_COMPACT);
  fclose(f);
  char cmd[9000];
  snprintf(cmd, sizeof cmd, "'%s' '%s/render.cjs' '%s' '%s'", node, dir, in, out);
  if (system(cmd) != 0) {
    fprintf(stderr, "test_chat_compare: the reference renderer failed: %s\n", cmd);
    return 1;
  }
  json_t *want = json_load_file(out, 0, &je);
  unlink(in);
  unlink(out);
  if (json_array_size(want) != json_array_size(cases)) {
    fprintf(stderr, "test_chat_compare: the reference gave %zu results for %zu cases\n",
            json_array_size(want), json_array_size(cases));
    return 1;
  }

  int failed = 0, errors = 0;
  size_t i;
  json_t *cs;
  json_array_foreach(cases, i, cs) {
    const char *cname = json_string_value(json_object_get(cs, "name"));
    json_t *w = json_array_get(want, i);
    int want_ok = json_is_true(json_object_get(w, "ok"));
    const char *wtext = json_string_value(json_object_get(w, want_ok ? "text" : "error"));
    tmpl_t *t = NULL;
    char err[1024] = "", *got = NULL;
    int rc = tmpl_parse(json_string_value(json_object_get(cs, "source")), &t, err, sizeof err);
    if (!rc) rc = tmpl_render(t, json_object_get(cs, "context"), &got, err, sizeof err);
    tmpl_free(t);
    const char *msg = strstr(err, ": ") ? strstr(err, ": ") + 2 : err;
    if (want_ok && rc) {
      printf("FAIL %s\n  reference rendered %s\n  ours failed: %s\n", cname, wtext, err);
      failed++;
    } else if (want_ok && strcmp(got, wtext)) {
      printf("FAIL %s\n  reference: [%s]\n  ours:      [%s]\n", cname, wtext, got);
      failed++;
    } else if (!want_ok && !rc) {
      printf("FAIL %s\n  reference failed: %s\n  ours rendered [%s]\n", cname, wtext, got);
      failed++;
    } else if (!want_ok &&
               strstr(json_string_value(json_object_get(cs, "source")), "raise_exception") &&
               strcmp(msg, wtext)) {
      /* a template's own failure must say what the template says */
      printf("FAIL %s\n  reference failed: %s\n  ours failed:      %s\n", cname, wtext, err);
      failed++;
    } else if (!want_ok) {
      printf("ok   %s\n  both failed; ours: %s\n", cname, err);
      errors++;
    }
    free(got);
  }
  printf(
      "%zu cases (%zu templates x %zu conversations x 2, %zu snippets): %d failed, %d "
      "failing alike\n",
      json_array_size(cases), nt, json_array_size(convs), json_array_size(snippets), failed,
      errors);
  for (size_t k = 0; k < nt; k++) free(sources[k]);
  for (size_t k = 0; k < nf; k++) free(files[k]);
  json_decref(cases);
  json_decref(want);
  json_decref(convs);
  json_decref(snippets);
  return failed ? 1 : 0;
}
