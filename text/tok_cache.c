/* tok_cache.c - the word cache of the BPE model: pre-token -> ids.
 *
 * Shared by every thread that encodes with one tokenizer: 64 shards, each a
 * mutex and an open-addressing table of up to SHARD_MAX entries; a full
 * shard is emptied and starts again (no eviction order to keep). */
#include <string.h>

#include "common/xalloc.h"
#include "text/tok_internal.h"

#define SHARDS 64
#define SHARD_SLOTS 2048 /* a power of two */
#define SHARD_MAX 1536   /* entries before the shard is emptied */

typedef struct {
  uint64_t hash;
  uint32_t klen, nids;
  char *data; /* klen key bytes, then nids uint32_t ids (aligned); NULL: empty */
} entry_t;

typedef struct {
  pthread_mutex_t mu;
  entry_t *slots; /* (SHARD_SLOTS) */
  size_t used;
} shard_t;

struct tok_cache_s {
  shard_t shard[SHARDS];
};

static size_t ids_offset(uint32_t klen) {
  return (klen + 3u) & ~3u;
}

tok_cache_t *tok_cache_new(void) {
  tok_cache_t *c = xcalloc(1, sizeof *c);
  for (int i = 0; i < SHARDS; i++) {
    pthread_mutex_init(&c->shard[i].mu, NULL);
    c->shard[i].slots = xcalloc(SHARD_SLOTS, sizeof(entry_t));
  }
  return c;
}

static void shard_clear(shard_t *s) {
  for (size_t i = 0; i < SHARD_SLOTS; i++) free(s->slots[i].data);
  memset(s->slots, 0, SHARD_SLOTS * sizeof(entry_t));
  s->used = 0;
}

void tok_cache_free(tok_cache_t *c) {
  if (!c) return;
  for (int i = 0; i < SHARDS; i++) {
    shard_clear(&c->shard[i]);
    free(c->shard[i].slots);
    pthread_mutex_destroy(&c->shard[i].mu);
  }
  free(c);
}

int tok_cache_get(tok_cache_t *c, const char *s, size_t n, tok_ids_t *ids) {
  uint64_t h = tok_hash(s, n);
  shard_t *sh = &c->shard[h % SHARDS];
  int found = 0;
  pthread_mutex_lock(&sh->mu);
  for (size_t i = (h >> 6) & (SHARD_SLOTS - 1);; i = (i + 1) & (SHARD_SLOTS - 1)) {
    entry_t *e = &sh->slots[i];
    if (!e->data) break;
    if (e->hash == h && e->klen == n && !memcmp(e->data, s, n)) {
      const uint32_t *v = (const uint32_t *)(e->data + ids_offset(e->klen));
      for (uint32_t k = 0; k < e->nids; k++) tok_ids_push(ids, v[k]);
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&sh->mu);
  return found;
}

void tok_cache_put(tok_cache_t *c, const char *s, size_t n, const uint32_t *ids, size_t nids) {
  uint64_t h = tok_hash(s, n);
  shard_t *sh = &c->shard[h % SHARDS];
  size_t off = ids_offset((uint32_t)n);
  char *data = xmalloc(off + nids * sizeof(uint32_t) + 1);
  memcpy(data, s, n);
  if (nids) memcpy(data + off, ids, nids * sizeof(uint32_t));
  pthread_mutex_lock(&sh->mu);
  if (sh->used >= SHARD_MAX) shard_clear(sh);
  size_t i = (h >> 6) & (SHARD_SLOTS - 1);
  for (;; i = (i + 1) & (SHARD_SLOTS - 1)) {
    entry_t *e = &sh->slots[i];
    if (!e->data) break;
    if (e->hash == h && e->klen == n && !memcmp(e->data, s, n)) { /* another thread put it */
      pthread_mutex_unlock(&sh->mu);
      free(data);
      return;
    }
  }
  sh->slots[i] = (entry_t){h, (uint32_t)n, (uint32_t)nids, data};
  sh->used++;
  pthread_mutex_unlock(&sh->mu);
}
