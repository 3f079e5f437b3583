/* rest_web.c - GET /, /assets/{file}, /docs and /v1/openapi.json: the
 * status page, the API explorer and the OpenAPI document, served from the
 * files compiled into trainyardd (web/web.h). No token is needed to load
 * them; the pages send one with each API call. */
#include <stdio.h>

#include "server/rest_internal.h"
#include "web/web.h"

enum MHD_Result rest_h_web(rest_t *r, struct MHD_Connection *c, rest_req_t *q) {
  /* "/assets/{file}" has the file name in params[0]; a route without a
   * capture serves the asset named by its own path. */
  char path[160];
  if (q->params[0][0])
    snprintf(path, sizeof path, "/assets/%s", q->params[0]);
  else
    snprintf(path, sizeof path, "%s", q->route->pattern);
  const web_asset_t *a = web_asset_find(path);
  if (!a) {
    char msg[200];
    snprintf(msg, sizeof msg, "the web page has no file %s", path);
    return rest_send_error(c, q, TY_ENOTFOUND, msg, NULL);
  }
  /* The bytes are static: MHD sends them without a copy. */
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
  MHD_add_response_header(resp, "Content-Type", a->content_type);
  MHD_add_response_header(resp, "Content-Security-Policy", WEB_CSP);
  MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
  return rest_queue(c, q, MHD_HTTP_OK, resp);
}
