/* client.c - the shared part of the server commands; see client.h. */
#ifdef TRAINYARD_WITH_CLIENT
#include "cli/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/json_util.h"
#include "common/xalloc.h"

static void set_str(char *dst, size_t size, const char *v) { snprintf(dst, size, "%s", v); }

bool client_flag(int argc, char **argv, int *i, const char *flag, const char **value) {
  size_t n = strlen(flag);
  if (strncmp(argv[*i], flag, n)) return false;
  if (argv[*i][n] == '=') {
    *value = argv[*i] + n + 1;
    return true;
  }
  if (argv[*i][n]) return false;
  if (*i + 1 >= argc) {
    fprintf(stderr, "trainyard: %s needs a value\n", flag);
    exit(2);
  }
  *value = argv[++*i];
  return true;
}

bool client_init(client_t *c, int *argc, char **argv) {
  const char *s = getenv("TRAINYARD_SERVER"), *t = getenv("TRAINYARD_TOKEN");
  set_str(c->server, sizeof c->server, s && *s ? s : CLIENT_DEFAULT_SERVER);
  set_str(c->token, sizeof c->token, t ? t : "");
  const char *g = getenv("TRAINYARD_GRPC");
  set_str(c->grpc, sizeof c->grpc, g ? g : "");
  int out = 1;
  for (int i = 1; i < *argc; i++) {
    const char *v;
    if (client_flag(*argc, argv, &i, "--server", &v))
      set_str(c->server, sizeof c->server, v);
    else if (client_flag(*argc, argv, &i, "--token", &v))
      set_str(c->token, sizeof c->token, v);
    else if (client_flag(*argc, argv, &i, "--grpc", &v))
      set_str(c->grpc, sizeof c->grpc, v);
    else
      argv[out++] = argv[i];
  }
  argv[out] = NULL;
  *argc = out;
  size_t n = strlen(c->server);
  while (n && c->server[n - 1] == '/') c->server[--n] = '\0';
  if (strncmp(c->server, "http://", 7) && strncmp(c->server, "https://", 8)) {
    fprintf(stderr, "trainyard: --server must be an http:// or https:// URL, got '%s'\n",
            c->server);
    return false;
  }
  return true;
}

typedef struct {
  char *buf;
  size_t len;
} sink_t;

static size_t sink_write(char *p, size_t size, size_t n, void *ctx) {
  sink_t *s = ctx;
  s->buf = xrealloc(s->buf, s->len + size * n + 1);
  memcpy(s->buf + s->len, p, size * n);
  s->len += size * n;
  s->buf[s->len] = '\0';
  return size * n;
}

int client_request(const client_t *c, const char *method, const char *path, const json_t *body,
                   const char *const *headers, long *status, char **out, size_t *len) {
  *status = 0;
  *out = NULL;
  if (len) *len = 0;
  CURL *curl = curl_easy_init();
  if (!curl) return -1;
  char url[2048], auth[600];
  snprintf(url, sizeof url, "%s%s", c->server, path);
  struct curl_slist *hl = NULL;
  if (*c->token) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
    hl = curl_slist_append(hl, auth);
  }
  for (size_t i = 0; headers && headers[i]; i++) hl = curl_slist_append(hl, headers[i]);
  char *text = NULL;
  if (body) {
    text = ty_json_dumps(body, JSON_COMPACT);
    hl = curl_slist_append(hl, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
  } else if (!strcmp(method, "POST")) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
  }
  sink_t sink = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, sink_write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 60000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  CURLcode cc = curl_easy_perform(curl);
  int rc = 0;
  if (cc != CURLE_OK) {
    fprintf(stderr, "trainyard: cannot reach %s: %s (is trainyardd running? --server URL)\n",
            c->server, curl_easy_strerror(cc));
    rc = -1;
    free(sink.buf);
  } else {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, status);
    *out = sink.buf ? sink.buf : xstrdup("");
    if (len) *len = sink.len;
  }
  curl_slist_free_all(hl);
  curl_easy_cleanup(curl);
  free(text);
  return rc;
}

bool client_state_final(const char *state) {
  return !strcmp(state, "succeeded") || !strcmp(state, "failed") || !strcmp(state, "cancelled");
}

int client_json(const client_t *c, const char *method, const char *path, const json_t *body,
                const char *const *headers, long *status, json_t **out) {
  char *raw = NULL;
  *out = NULL;
  int rc = client_request(c, method, path, body, headers, status, &raw, NULL);
  if (rc) return rc;
  *out = json_loads(raw, 0, NULL);
  if (*status >= 400) {
    client_print_error(*status, *out, raw);
    rc = 1;
  } else if (!*out) {
    fprintf(stderr, "trainyard: the server answered %ld with a body that is not JSON\n", *status);
    rc = 1;
  }
  free(raw);
  return rc;
}

int client_print_error(long status, const json_t *body, const char *raw) {
  json_t *err = json_object_get(body, "error");
  if (!err) {
    fprintf(stderr, "trainyard: HTTP %ld: %.500s\n", status, raw ? raw : "");
    return 1;
  }
  fprintf(stderr, "trainyard: %s (HTTP %ld): %s\n",
          json_string_value(json_object_get(err, "code")), status,
          json_string_value(json_object_get(err, "message")));
  size_t i;
  json_t *d;
  json_array_foreach(json_object_get(err, "details"), i, d) {
    const char *f = json_string_value(json_object_get(d, "field"));
    fprintf(stderr, "  %s%s%s\n", f && *f ? f : "", f && *f ? ": " : "",
            json_string_value(json_object_get(d, "message")));
  }
  return 1;
}

void client_escape(const char *s, char *out, size_t size) {
  static const char hex[] = "0123456789ABCDEF";
  size_t k = 0;
  for (; *s && k + 4 < size; s++) {
    unsigned char ch = (unsigned char)*s;
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
        strchr("-_.~", ch)) {
      out[k++] = (char)ch;
    } else {
      out[k++] = '%';
      out[k++] = hex[ch >> 4];
      out[k++] = hex[ch & 15];
    }
  }
  out[k] = '\0';
}
#endif
