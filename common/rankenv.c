/* rankenv.c - the rank environment's table, its reader and its builder;
 * see rankenv.h. */
#include "common/rankenv.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/numbers.h"
#include "common/xalloc.h"

typedef enum { RANKENV_STR, RANKENV_INT } rankenv_type_t;

static const struct {
  const char *name;
  rankenv_type_t type;
  long lo, hi, dflt;
  const char *meaning;
} g_vars[RANKENV_COUNT] = {
#define RANKENV_ROW(id, nm, ty, l, h, d, m) \
  [RANKENV_##id] = {.name = nm, .type = RANKENV_##ty, .lo = l, .hi = h, .dflt = d, .meaning = m},
    RANKENV_FIELDS(RANKENV_ROW)
#undef RANKENV_ROW
};

/* Every variable of the contract starts with it. */
static const char g_prefix[] = "TRAINYARD_";

const char *rankenv_name(rankenv_id_t id) {
  return g_vars[id].name;
}

const char *rankenv_meaning(rankenv_id_t id) {
  return g_vars[id].meaning;
}

static const char *env_nonempty(rankenv_id_t id) {
  const char *s = getenv(g_vars[id].name);
  return s && *s ? s : NULL;
}

/* The variable read in id's place where id is unset: a rank that srun
 * started has Slurm's numbering of its tasks and no TRAINYARD_ rank of its
 * own. id itself where it has no stand-in or is set. */
static rankenv_id_t source(rankenv_id_t id) {
  rankenv_id_t alt = id == RANKENV_RANK         ? RANKENV_SLURM_RANK
                     : id == RANKENV_WORLD_SIZE ? RANKENV_SLURM_WORLD_SIZE
                                                : id;
  return alt != id && !env_nonempty(id) && env_nonempty(alt) ? alt : id;
}

const char *rankenv_str(rankenv_id_t id) {
  return env_nonempty(source(id));
}

int rankenv_long_in(rankenv_id_t id, long lo, long hi, long *out, char *err, size_t errlen) {
  assert(g_vars[id].type == RANKENV_INT); /* a caller's mistake, not the environment's */
  if (g_vars[id].dflt != RANKENV_NO_DEFAULT && !rankenv_str(id)) *out = g_vars[id].dflt;
  const rankenv_id_t from = source(id);
  return ty_env_long(g_vars[from].name, lo, hi, g_vars[from].meaning, out, err, errlen);
}

int rankenv_long(rankenv_id_t id, long *out, char *err, size_t errlen) {
  return rankenv_long_in(id, g_vars[id].lo, g_vars[id].hi, out, err, errlen);
}

int rankenv_gpu(int rank, int ndev, int *out, char *err, size_t errlen) {
  long local = rank;
  int rc = rankenv_long(RANKENV_SLURM_LOCAL_RANK, &local, err, errlen);
  *out = (int)(local % (ndev > 0 ? ndev : 1));
  return rc;
}

void rankenv_set(rankenv_t *e, rankenv_id_t id, const char *value) {
  free(e->val[id]);
  e->val[id] = value ? xstrdup(value) : NULL;
}

void rankenv_set_long(rankenv_t *e, rankenv_id_t id, long long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", v);
  rankenv_set(e, id, buf);
}

void rankenv_clear(rankenv_t *e) {
  for (int i = 0; i < RANKENV_COUNT; i++) {
    free(e->val[i]);
    e->val[i] = NULL;
  }
}

/* Whether kv ("NAME=value") sets the variable name. */
static bool names(const char *kv, const char *name) {
  size_t n = strlen(name);
  return !strncmp(kv, name, n) && kv[n] == '=';
}

/* Whether a rank inherits kv from its launcher. */
static bool inherited(const char *kv, const rankenv_t *e, rankenv_inherit_t inherit,
                      const char *const *drop) {
  if (inherit == RANKENV_INHERIT_NONE && !strncmp(kv, g_prefix, sizeof g_prefix - 1)) return false;
  for (int i = 0; i < RANKENV_COUNT; i++)
    if ((i <= RANKENV_LAUNCHER_SET_LAST || e->val[i]) && names(kv, g_vars[i].name)) return false;
  for (size_t i = 0; drop && drop[i]; i++)
    if (!strncmp(kv, drop[i], strlen(drop[i]))) return false;
  return true;
}

static char *kv_dup(const char *name, const char *value) {
  size_t n = strlen(name) + strlen(value) + 2;
  char *kv = xmalloc(n);
  snprintf(kv, n, "%s=%s", name, value);
  return kv;
}

char **rankenv_envp(const rankenv_t *e, char *const *base, rankenv_inherit_t inherit,
                    const char *const *drop, const char *const *extra) {
  size_t nbase = 0, nextra = 0;
  while (base && base[nbase]) nbase++;
  while (extra && extra[nextra]) nextra++;
  char **env = xcalloc(nbase + RANKENV_COUNT + nextra + 1, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < nbase; i++)
    if (inherited(base[i], e, inherit, drop)) env[k++] = xstrdup(base[i]);
  for (int i = 0; i < RANKENV_COUNT; i++)
    if (e->val[i]) env[k++] = kv_dup(g_vars[i].name, e->val[i]);
  for (size_t i = 0; i < nextra; i++) env[k++] = xstrdup(extra[i]);
  env[k] = NULL;
  return env;
}

void rankenv_envp_free(char **envp) {
  if (!envp) return;
  for (char **p = envp; *p; p++) free(*p);
  free(envp);
}
