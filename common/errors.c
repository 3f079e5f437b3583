/* errors.c - the error table and field-error lists; see errors.h. */
#include "common/errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"

typedef struct {
  int code;
  int grpc;
  const char *name;
  int http;
} err_row_t;

static const err_row_t g_rows[] = {
#define TY_X(name, grpc, str, http) {name, grpc, str, http},
    TY_ERROR_CODES(TY_X)
#undef TY_X
};

static const err_row_t *row_of(int code) {
  for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++)
    if (g_rows[i].code == code) return &g_rows[i];
  return &g_rows[2]; /* UNKNOWN */
}

const char *ty_err_name(int code) { return row_of(code)->name; }
int ty_err_http_status(int code) { return row_of(code)->http; }
int ty_err_grpc_status(int code) { return row_of(code)->grpc; }

int ty_err_from_name(const char *name) {
  for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++)
    if (!strcmp(g_rows[i].name, name)) return g_rows[i].code;
  return TY_EUNKNOWN;
}

int ty_errf(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

void ty_errlist_vadd(ty_errlist_t *l, const char *field, const char *fmt, va_list ap) {
  if (l->len == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 8;
    l->items = xrealloc(l->items, l->cap * sizeof *l->items);
  }
  char buf[1024];
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  if (n >= (int)sizeof buf) {
    /* Cut at a character boundary: a split UTF-8 sequence would make the
     * message unencodable as JSON. */
    size_t end = sizeof buf - 1;
    while (end > 0 && ((unsigned char)buf[end - 1] & 0xC0) == 0x80) end--;
    if (end > 0 && ((unsigned char)buf[end - 1] & 0x80)) end--;
    buf[end] = '\0';
  }
  l->items[l->len].field = xstrdup(field ? field : "");
  l->items[l->len].message = xstrdup(buf);
  l->len++;
}

void ty_errlist_add(ty_errlist_t *l, const char *field, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ty_errlist_vadd(l, field, fmt, ap);
  va_end(ap);
}

void ty_errlist_clear(ty_errlist_t *l) {
  for (size_t i = 0; i < l->len; i++) {
    free(l->items[i].field);
    free(l->items[i].message);
  }
  free(l->items);
  l->items = NULL;
  l->len = l->cap = 0;
}

json_t *ty_error_json(int code, const char *message, const ty_errlist_t *details) {
  json_t *arr = json_array();
  for (size_t i = 0; details && i < details->len; i++)
    json_array_append_new(arr, json_pack("{s:s, s:s}", "field", details->items[i].field,
                                         "message", details->items[i].message));
  return json_pack("{s:{s:s, s:s, s:o}}", "error", "code", ty_err_name(code), "message",
                   message ? message : ty_err_name(code), "details", arr);
}
