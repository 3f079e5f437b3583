/* health.h - what keeps trainyardd from doing its work right now, for
 * /healthz and for refusing submissions: a few named conditions, each set
 * with a cause (a sentence) or cleared. Each change of a condition is
 * logged once (set, cause changed, cleared), never once per retry of
 * whatever keeps failing. Thread-safe. */
#ifndef TY_SERVER_HEALTH_H
#define TY_SERVER_HEALTH_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
  HEALTH_DB_WRITE, /* state changes could not be written; they are kept and retried */
  HEALTH_DB_START, /* queued jobs cannot be started: their start cannot be written */
  HEALTH_DB_FILE,  /* the database file was deleted or replaced under the server */
  HEALTH_DB_STORE, /* a write failed (disk full, I/O error) and none has committed since,
                      or progress reports are kept until one can (db_write_failing) */
  HEALTH_COUNT
} health_cond_t;

typedef struct health health_t;

health_t *health_new(void);
void health_free(health_t *h);
/* Sets condition c with cause (copied), or clears it (cause NULL). */
void health_set(health_t *h, health_cond_t c, const char *cause);
/* True when no condition holds; otherwise false, with every cause (joined
 * by "; ") in why (size bytes; may be NULL). */
bool health_ok(health_t *h, char *why, size_t size);
/* health_ok leaving condition except out. */
bool health_ok_except(health_t *h, health_cond_t except, char *why, size_t size);

#endif
