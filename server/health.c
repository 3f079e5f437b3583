/* health.c - the server's standing conditions; see health.h. */
#include "server/health.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/xalloc.h"

#define CAUSE_MAX 768

static const char *const g_names[HEALTH_COUNT] = {"database writes", "job starts", "database file",
                                                        "database storage"};

struct health {
  pthread_mutex_t lock;
  char cause[HEALTH_COUNT][CAUSE_MAX]; /* "" while the condition does not hold */
};

health_t *health_new(void) {
  health_t *h = xcalloc(1, sizeof *h);
  pthread_mutex_init(&h->lock, NULL);
  return h;
}

void health_free(health_t *h) {
  if (!h) return;
  pthread_mutex_destroy(&h->lock);
  free(h);
}

void health_set(health_t *h, health_cond_t c, const char *cause) {
  if (c < 0 || c >= HEALTH_COUNT) return; /* cannot happen: the callers name one */
  pthread_mutex_lock(&h->lock);
  char *cur = h->cause[c];
  if (cause && strncmp(cur, cause, CAUSE_MAX - 1)) {
    snprintf(cur, CAUSE_MAX, "%s", cause);
    ty_warn("unhealthy (%s): %s", g_names[c], cur);
  } else if (!cause && *cur) {
    ty_info("healthy again (%s); it was: %s", g_names[c], cur);
    cur[0] = '\0';
  }
  pthread_mutex_unlock(&h->lock);
}

bool health_ok(health_t *h, char *why, size_t size) {
  return health_ok_except(h, HEALTH_COUNT, why, size);
}

bool health_ok_except(health_t *h, health_cond_t except, char *why, size_t size) {
  pthread_mutex_lock(&h->lock);
  size_t used = 0;
  bool ok = true;
  if (why && size) why[0] = '\0';
  for (int c = 0; c < HEALTH_COUNT; c++) {
    if (!h->cause[c][0] || c == (int)except) continue;
    ok = false;
    if (why && used < size)
      used += (size_t)snprintf(why + used, size - used, "%s%s", used ? "; " : "", h->cause[c]);
  }
  pthread_mutex_unlock(&h->lock);
  return ok;
}
