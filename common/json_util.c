/* json_util.c - small jansson helpers; see json_util.h. */
#include "common/json_util.h"

#include "common/errors.h"
#include "common/beneath.h"
#include "common/fsfault.h"
#include "common/partial.h"
#include "common/xalloc.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *ty_json_kind(const json_t *v) {
  if (!v) return "nothing";
  switch (json_typeof(v)) {
    case JSON_OBJECT:
      return "an object";
    case JSON_ARRAY:
      return "an array";
    case JSON_STRING:
      return "a string";
    case JSON_INTEGER:
      return "an integer";
    case JSON_REAL:
      return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
      return "a boolean";
    default:
      return "null";
  }
}

/* x in 15 or 16 significant digits where that reads back to x, in
 * jansson's style: ".0" where it would read as an integer, and no '+' or
 * leading zeros in the exponent. false where x needs all 17, as jansson
 * wrote it. 15 digits come first: a double that some decimal of 15 digits
 * or fewer reads back to prints as that decimal at 15 (%g drops trailing
 * zeros), so no shorter form is missed. */
static bool shorter_real(double x, char *buf, size_t cap) {
  int digits = 15;
  for (; digits <= 16; digits++) {
    snprintf(buf, cap, "%.*g", digits, x);
    if (strtod(buf, NULL) == x) break;
  }
  if (digits > 16) return false;
  char *e = strpbrk(buf, "eE");
  if (!e && !strchr(buf, '.')) {
    strncat(buf, ".0", cap - strlen(buf) - 1);
  } else if (e) {
    char *from = e + 1, *to = e + 1;
    if (*from == '+')
      from++;
    else if (*from == '-')
      *to++ = *from++;
    while (*from == '0' && from[1]) from++;
    memmove(to, from, strlen(from) + 1);
  }
  return true;
}

typedef struct {
  char *text;
  size_t len, cap;
} textbuf_t;

static void textbuf_put(textbuf_t *b, const char *s, size_t n) {
  if (b->cap - b->len < n + 1) {
    b->cap = (b->cap + n + 1) * 2;
    b->text = xrealloc(b->text, b->cap);
  }
  memcpy(b->text + b->len, s, n);
  b->len += n;
  b->text[b->len] = '\0';
}

char *ty_json_dumps(const json_t *j, size_t flags) {
  flags &= ~(size_t)JSON_REAL_PRECISION(0x1F);
  char *text = json_dumps(j, flags | JSON_REAL_PRECISION(17));
  if (!text) return NULL;
  size_t n = strlen(text);
  textbuf_t out = {xmalloc(n + 64), 0, n + 64};
  out.text[0] = '\0';
  bool in_string = false;
  size_t i = 0;
  while (i < n) {
    char c = text[i];
    size_t k = i + 1; /* text[i, k) is copied as it is */
    if (in_string) {
      if (c == '\\')
        k++;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '-' || isdigit((unsigned char)c)) {
      k = i + strspn(text + i, "0123456789+-.eE");
      char num[64];
      size_t nl = k - i < sizeof num ? k - i : sizeof num - 1;
      memcpy(num, text + i, nl);
      num[nl] = '\0';
      /* An integer stays as jansson wrote it, and so does a real that
       * needs its 17 digits; another real is written shorter. */
      char piece[40];
      if (strpbrk(num, ".eE") && k - i < sizeof num &&
          shorter_real(strtod(num, NULL), piece, sizeof piece)) {
        textbuf_put(&out, piece, strlen(piece));
        i = k;
        continue;
      }
    }
    textbuf_put(&out, text + i, k - i);
    i = k;
  }
  free(text);
  return out.text;
}

int ty_json_dumpf(const json_t *j, FILE *f, size_t flags) {
  char *text = ty_json_dumps(j, flags);
  int rc = text && fputs(text, f) >= 0 ? 0 : -1;
  free(text);
  return rc;
}

int ty_json_dump_file(const json_t *j, const char *path, size_t flags) {
  return ty_json_write_file(j, path, flags, NULL, 0) ? -1 : 0;
}

int ty_json_write_file(const json_t *j, const char *path, size_t flags, char *err, size_t errlen) {
  char partial[PATH_MAX];
  if (snprintf(partial, sizeof partial, "%s.partial", path) >= (int)sizeof partial) {
    if (err) snprintf(err, errlen, "%.64s...: path too long", path);
    errno = ENAMETOOLONG;
    return TY_EINVAL;
  }
  const int slot = ty_partial_track(partial);
  FILE *f = ty_beneath_fopen(partial, "w", err, errlen);
  int rc = f ? 0 : TY_EPERM;
  if (f) {
    int wrote = ty_fsfault("write", partial) ? -1 : ty_json_dumpf(j, f, flags);
    if (fclose(f) != 0 || wrote != 0) {
      if (err) snprintf(err, errlen, "%s: cannot write: %s", partial, strerror(errno));
      rc = TY_EUNAVAILABLE;
    } else if ((rc = ty_beneath_rename(partial, path, err, errlen)) == 0) {
      ty_partial_untrack(slot);
      return 0;
    }
  }
  int e = errno;
  ty_beneath_remove(partial, false, NULL, 0);
  ty_partial_untrack(slot);
  errno = e;
  return rc;
}

json_t *ty_json_load_file(const char *path, size_t flags, char *err, size_t errlen) {
  int fd = ty_beneath_open(path, O_RDONLY, 0, err, errlen);
  if (fd < 0) return NULL;
  json_error_t je;
  json_t *j = json_loadfd(fd, flags, &je);
  close(fd);
  if (!j) {
    if (err) snprintf(err, errlen, "%s: not valid JSON (line %d: %s)", path, je.line, je.text);
    errno = EINVAL;
  }
  return j;
}
