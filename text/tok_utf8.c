/* tok_utf8.c - UTF-8 for the tokenizer: character lengths, the lossy
 * decoding that input and decoded bytes go through, White_Space. */
#include "text/tok_internal.h"

/* The valid range of the second byte after lead byte c (Unicode table 3-7);
 * the third and fourth are always 80..BF. */
static int utf8_lead(unsigned c, unsigned *need, unsigned *lo, unsigned *hi) {
  *lo = 0x80, *hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    *need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    *need = 2;
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    *need = 3;
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
  } else {
    return 0;
  }
  return 1;
}

/* The number of bytes at s that form a valid character (need + 1), or the
 * negated length of the maximal invalid subpart (at least 1). */
static long utf8_scan(const unsigned char *s, size_t n) {
  if (s[0] < 0x80) return 1;
  unsigned need, lo, hi;
  if (!utf8_lead(s[0], &need, &lo, &hi)) return -1;
  size_t i = 1;
  for (; i <= need; i++) {
    if (i >= n) return -(long)i;
    unsigned b = s[i];
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -(long)i;
  }
  return (long)i;
}

size_t tok_utf8_char_len(const unsigned char *s, size_t n) {
  if (n == 0) return 0;
  long r = utf8_scan(s, n);
  return r > 0 ? (size_t)r : 0;
}

void tok_utf8_sanitize(const char *s, size_t n, tok_buf_t *out) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, run = 0; /* run: start of the pending valid bytes */
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    long r = utf8_scan(u + i, n - i);
    if (r > 0) {
      i += (size_t)r;
      continue;
    }
    tok_buf_append(out, s + run, i - run);
    tok_buf_append(out, "\xEF\xBF\xBD", 3);
    i += (size_t)-r;
    run = i;
  }
  tok_buf_append(out, s + run, n - run);
}

uint32_t tok_utf8_decode(const unsigned char *s, size_t *len) {
  unsigned c = s[0];
  if (c < 0x80) return *len = 1, c;
  if (c < 0xE0) return *len = 2, ((c & 0x1F) << 6) | (s[1] & 0x3F);
  if (c < 0xF0) return *len = 3, ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  *len = 4;
  return ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

size_t tok_utf8_encode(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

int tok_is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}
