/* test_web_assets.c - the embedded files of the status page and the API
 * reference: every file a page names (index.html's and docs.html's
 * src/href, each module's imports) is embedded with the right content type,
 * lookups of unknown paths fail, the bytes are NUL-terminated text, and the
 * OpenAPI document is JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "web/web.h"

static void test_index_and_aliases(void **state) {
  const web_asset_t *a = web_asset_find("/");
  assert_non_null(a);
  assert_ptr_equal(a, web_asset_find("/index.html"));
  assert_string_equal(a->content_type, "text/html; charset=utf-8");
  assert_non_null(strstr((const char *)a->data, "<!doctype html>"));
  assert_null(web_asset_find(NULL));
  assert_null(web_asset_find(""));
  assert_null(web_asset_find("/assets/"));
  assert_null(web_asset_find("/assets/../index.html"));
  assert_null(web_asset_find("/v1/jobs"));
  assert_null(web_asset_find("/assets/app.js/"));
}

static void test_types_and_bytes(void **state) {
  size_t n;
  const web_asset_t *all = web_assets(&n);
  assert_true(n >= 4);
  for (size_t i = 0; i < n; i++) {
    const web_asset_t *a = &all[i];
    assert_ptr_equal(web_asset_find(a->path), a);
    assert_true(a->len > 0);
    assert_int_equal(a->data[a->len], 0);
    assert_int_equal(strlen((const char *)a->data), a->len); /* text: no NUL inside */
    const char *dot = strrchr(a->path, '.');
    if (!strcmp(a->path, "/") || !strcmp(a->path, "/docs")) {
      assert_string_equal(a->content_type, "text/html; charset=utf-8");
      continue;
    }
    assert_non_null(dot);
    if (!strcmp(dot, ".js"))
      assert_string_equal(a->content_type, "text/javascript; charset=utf-8");
    else if (!strcmp(dot, ".css"))
      assert_string_equal(a->content_type, "text/css; charset=utf-8");
    else if (!strcmp(dot, ".json"))
      assert_string_equal(a->content_type, "application/json");
    else if (!strcmp(dot, ".txt"))
      assert_string_equal(a->content_type, "text/plain; charset=utf-8");
    else
      fail_msg("unexpected asset %s", a->path);
  }
  /* The chart library is compiled in, not fetched from elsewhere. */
  const web_asset_t *u = web_asset_find("/assets/uPlot.min.js");
  assert_non_null(u);
  assert_true(u->len > 10000);
  /* So is the API explorer, with the licence texts its bundle points to. */
  const web_asset_t *sw = web_asset_find("/assets/swagger-ui-bundle.js");
  assert_non_null(sw);
  assert_non_null(strstr((const char *)sw->data, "swagger-ui-bundle.js.LICENSE.txt"));
  assert_non_null(web_asset_find("/assets/swagger-ui-bundle.js.LICENSE.txt"));
  assert_non_null(strstr((const char *)web_asset_find("/assets/swagger-ui.LICENSE.txt")->data,
                         "Apache License"));
}

/* GET /v1/openapi.json: api/openapi.yaml as JSON, with its paths. */
static void test_openapi_document(void **state) {
  const web_asset_t *a = web_asset_find("/v1/openapi.json");
  assert_non_null(a);
  json_error_t je;
  json_t *doc = json_loadb((const char *)a->data, a->len, 0, &je);
  if (!doc) fail_msg("/v1/openapi.json: line %d: %s", je.line, je.text);
  assert_non_null(strstr(json_string_value(json_object_get(doc, "openapi")), "3."));
  json_t *paths = json_object_get(doc, "paths");
  assert_non_null(json_object_get(json_object_get(paths, "/v1/jobs"), "post"));
  assert_non_null(json_object_get(json_object_get(paths, "/v1/openapi.json"), "get"));
  assert_non_null(json_object_get(json_object_get(paths, "/docs"), "get"));
  json_decref(doc);
}

/* Each quoted value after key (e.g. `src="`) that starts with prefix must
 * name an embedded asset (relative names resolve under /assets/). */
static int check_refs(const web_asset_t *a, const char *key, const char *prefix) {
  int found = 0;
  const char *p = (const char *)a->data;
  size_t klen = strlen(key);
  while ((p = strstr(p, key))) {
    p += klen;
    const char *end = strpbrk(p, "\"'");
    if (!end || strncmp(p, prefix, strlen(prefix))) continue;
    char path[256];
    if (p[0] == '.')
      snprintf(path, sizeof path, "/assets/%.*s", (int)(end - p - 2), p + 2);
    else
      snprintf(path, sizeof path, "%.*s", (int)(end - p), p);
    if (!web_asset_find(path)) fail_msg("%s names %s, which is not embedded", a->path, path);
    found++;
  }
  return found;
}

/* Whether an asset is a library from npm (whose text is not ours to scan). */
static bool vendored(const char *path) {
  return !strncmp(path, "/assets/uPlot", 13) || !strncmp(path, "/assets/swagger-ui", 18);
}

static void test_references_resolve(void **state) {
  const web_asset_t *index = web_asset_find("/");
  assert_int_equal(
      check_refs(index, "src=\"", "/assets/") + check_refs(index, "href=\"", "/assets/"),
      4); /* uPlot js + css, app.css, app.js */
  const web_asset_t *docs = web_asset_find("/docs");
  assert_non_null(docs);
  assert_int_equal(check_refs(docs, "src=\"", "/assets/") + check_refs(docs, "href=\"", "/assets/"),
                   6); /* Swagger UI js + css, docs.css, docs.js, two licence texts */
  size_t n, imports = 0;
  const web_asset_t *all = web_assets(&n);
  for (size_t i = 0; i < n; i++)
    if (strstr(all[i].path, ".js") && !vendored(all[i].path))
      imports += (size_t)check_refs(&all[i], "from '", "./");
  assert_true(imports >= 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_index_and_aliases),
      cmocka_unit_test(test_types_and_bytes),
      cmocka_unit_test(test_references_resolve),
      cmocka_unit_test(test_openapi_document),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
