/* log.c - leveled logging to stderr; see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_level = -1; /* -1: not yet read from the environment */

static int level_from_env(void) {
  const char *s = getenv("TRAINYARD_LOG");
  if (!s) return TY_LOG_INFO;
  if (!strcmp(s, "debug")) return TY_LOG_DEBUG;
  if (!strcmp(s, "warn")) return TY_LOG_WARN;
  if (!strcmp(s, "error")) return TY_LOG_ERROR;
  return TY_LOG_INFO;
}

void ty_log_set_level(ty_log_level_t level) { g_level = (int)level; }

static void vlog(const char *tag, const char *file, int line, const char *fmt, va_list ap) {
  char stamp[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  /* One fprintf per line keeps lines from concurrent threads whole. */
  char msg[2048];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (file)
    fprintf(stderr, "%s %s %s:%d: %s\n", stamp, tag, file, line, msg);
  else
    fprintf(stderr, "%s %s %s\n", stamp, tag, msg);
}

void ty_log_at(ty_log_level_t level, const char *file, int line, const char *fmt, ...) {
  if (g_level < 0) g_level = level_from_env();
  if ((int)level < g_level) return;
  static const char *tags[] = {"debug", "info", "warn", "error"};
  va_list ap;
  va_start(ap, fmt);
  /* file:line only where it helps a developer: warnings and errors. */
  vlog(tags[level], level >= TY_LOG_WARN ? file : NULL, line, fmt, ap);
  va_end(ap);
}

void ty_die_at(const char *file, int line, const char *hint, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog("fatal", file, line, fmt, ap);
  va_end(ap);
  if (hint) fprintf(stderr, "  hint: %s\n", hint);
  exit(1);
}
