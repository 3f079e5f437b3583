/* web.h - the files of the status page and of the API reference,
 * compiled into trainyardd (no files on disk, nothing fetched from
 * elsewhere): HTML, CSS, JavaScript, the chart library, the API explorer
 * (Swagger UI) and the OpenAPI document as JSON, each with its URL path and
 * content type. */
#ifndef TY_WEB_WEB_H
#define TY_WEB_WEB_H

#include <stddef.h>

typedef struct {
  const char *path;          /* URL path: "/", "/docs", "/v1/openapi.json" or "/assets/<file>" */
  const unsigned char *data; /* the file's bytes (static; also NUL-terminated) */
  size_t len;                /* bytes in data, without the NUL */
  const char *content_type;  /* e.g. "text/javascript; charset=utf-8" */
} web_asset_t;

/* The asset served at path (the URL path without its query), or NULL.
 * "/index.html" is the same file as "/". The result is static. */
const web_asset_t *web_asset_find(const char *path);

/* Every asset, for listings and tests: *n receives their number. */
const web_asset_t *web_assets(size_t *n);

/* The Content-Security-Policy the page is written to run under: only its
 * own scripts, styles and API. */
#define WEB_CSP                                                                    \
  "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; " \
  "form-action 'none'; frame-ancestors 'none'"

#endif
