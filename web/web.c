/* web.c - lookup of the status page's embedded files (see web.h); the
 * table itself is generated at build time by embed.c into web_assets.c. */
#include "web/web.h"

#include <string.h>

/* Generated (web_assets.c): the files, in the order web/CMakeLists.txt
 * lists them. */
extern const web_asset_t web_asset_table[];
extern const size_t web_asset_count;

const web_asset_t *web_asset_find(const char *path) {
  if (!path) return NULL;
  if (!strcmp(path, "/index.html")) path = "/";
  for (size_t i = 0; i < web_asset_count; i++)
    if (!strcmp(web_asset_table[i].path, path)) return &web_asset_table[i];
  return NULL;
}

const web_asset_t *web_assets(size_t *n) {
  *n = web_asset_count;
  return web_asset_table;
}
