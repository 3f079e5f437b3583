/* rendezvous.c - the store of the ranks' rendezvous keys; see
 * rendezvous.h. A list is enough: an attempt holds a few keys (an NCCL id,
 * a store's address), and the list holds the attempts now running. */
#include "server/rendezvous.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"

typedef struct entry {
  char *job;
  int attempt;
  char key[RDV_KEY_MAX + 1];
  void *value; /* owned */
  size_t len;
  struct entry *next;
} entry_t;

struct rdv_store {
  pthread_mutex_t lock;
  entry_t *head;
};

rdv_store_t *rdv_store_new(void) {
  rdv_store_t *st = xcalloc(1, sizeof *st);
  pthread_mutex_init(&st->lock, NULL);
  return st;
}

static void entry_free(entry_t *e) {
  free(e->job);
  free(e->value);
  free(e);
}

void rdv_store_free(rdv_store_t *st) {
  if (!st) return;
  while (st->head) {
    entry_t *e = st->head;
    st->head = e->next;
    entry_free(e);
  }
  pthread_mutex_destroy(&st->lock);
  free(st);
}

bool rdv_key_ok(const char *key, char *msg, size_t msgsz) {
  size_t n = strlen(key);
  if (n == 0 || n > RDV_KEY_MAX) {
    snprintf(msg, msgsz, "a rendezvous key has 1 to %d characters, this one %zu", RDV_KEY_MAX, n);
    return false;
  }
  for (const char *p = key; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '.' || *p == '_' || *p == '-')) {
      snprintf(msg, msgsz, "a rendezvous key holds only letters, digits, '.', '_' and '-'");
      return false;
    }
  return true;
}

/* Drops the keys of job's attempts other than attempt (under the lock). */
static void drop_others(rdv_store_t *st, const char *job, int attempt) {
  for (entry_t **pp = &st->head; *pp;) {
    entry_t *e = *pp;
    if (!strcmp(e->job, job) && e->attempt != attempt) {
      *pp = e->next;
      entry_free(e);
    } else {
      pp = &e->next;
    }
  }
}

int rdv_put(rdv_store_t *st, const char *job, int attempt, const char *key, const void *value,
            size_t len, char *msg, size_t msgsz) {
  if (!rdv_key_ok(key, msg, msgsz)) return TY_EINVAL;
  if (len > RDV_VALUE_MAX) {
    snprintf(msg, msgsz, "a rendezvous value has at most %d bytes, this one %zu", RDV_VALUE_MAX,
             len);
    return TY_EINVAL;
  }
  pthread_mutex_lock(&st->lock);
  drop_others(st, job, attempt);
  int n = 0, rc = 0;
  size_t bytes = 0;
  for (entry_t *e = st->head; e; e = e->next) {
    if (strcmp(e->job, job) || e->attempt != attempt) continue;
    n++;
    bytes += e->len;
    if (strcmp(e->key, key)) continue;
    if (e->len != len || (len && memcmp(e->value, value, len))) {
      snprintf(msg, msgsz,
               "rendezvous key %s of attempt %d is published already, with another value; a "
               "key is written once an attempt",
               key, attempt);
      rc = TY_EEXISTS;
    }
    pthread_mutex_unlock(&st->lock);
    return rc; /* the same value again: nothing changes */
  }
  if (n >= RDV_KEYS_MAX || bytes + len > (size_t)RDV_BYTES_MAX) {
    snprintf(msg, msgsz,
             "attempt %d of job %s holds %d rendezvous keys of %zu bytes; an attempt may hold "
             "%d keys of %d bytes in all",
             attempt, job, n, bytes, RDV_KEYS_MAX, RDV_BYTES_MAX);
    pthread_mutex_unlock(&st->lock);
    return TY_EEXHAUSTED;
  }
  entry_t *e = xcalloc(1, sizeof *e);
  e->job = xstrdup(job);
  e->attempt = attempt;
  snprintf(e->key, sizeof e->key, "%s", key);
  e->value = xmalloc(len ? len : 1);
  if (len) memcpy(e->value, value, len);
  e->len = len;
  e->next = st->head;
  st->head = e;
  pthread_mutex_unlock(&st->lock);
  return 0;
}

bool rdv_get(rdv_store_t *st, const char *job, int attempt, const char *key, void **out,
             size_t *len) {
  pthread_mutex_lock(&st->lock);
  bool found = false;
  for (entry_t *e = st->head; e && !found; e = e->next)
    if (!strcmp(e->job, job) && e->attempt == attempt && !strcmp(e->key, key)) {
      *out = xmalloc(e->len ? e->len : 1);
      if (e->len) memcpy(*out, e->value, e->len);
      *len = e->len;
      found = true;
    }
  pthread_mutex_unlock(&st->lock);
  return found;
}

void rdv_forget(rdv_store_t *st, const char *job) {
  pthread_mutex_lock(&st->lock);
  drop_others(st, job, -1);
  pthread_mutex_unlock(&st->lock);
}
