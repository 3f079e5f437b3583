/* token.c - constant-time token comparison; see token.h. */
#include "server/token.h"

#include <stddef.h>
#include <string.h>

/* 0 when the la bytes of a and the lb of b are the same. */
static unsigned char token_diff(const char *a, size_t la, const char *b, size_t lb) {
  unsigned char diff = la != lb;
  for (size_t i = 0; i < la && i < lb; i++) diff |= (unsigned char)(a[i] ^ b[i]);
  return diff;
}

bool token_equal(const char *a, const char *b) {
  return token_diff(a, strlen(a), b, strlen(b)) == 0;
}

bool token_required(const char *tokens) {
  for (const char *p = tokens; *p; p++)
    if (*p != ',' && *p != ' ') return true;
  return false;
}

bool token_listed(const char *tokens, const char *token) {
  bool ok = false;
  size_t tl = strlen(token);
  for (const char *p = tokens; *p;) {
    while (*p == ',' || *p == ' ') p++;
    size_t len = strcspn(p, ", ");
    if (len) ok |= token_diff(p, len, token, tl) == 0;
    p += len;
  }
  return ok;
}
