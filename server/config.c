/* config.c - the options table of trainyardd and its three sources; see
 * config.h. */
#include "server/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/numbers.h"
#include "common/xalloc.h"

typedef enum { OPT_STR, OPT_INT, OPT_SEC } opt_type_t;

typedef struct {
  const char *name;
  opt_type_t type;
  const char *def;
  double min, max;
  const char *env;
  const char *help;
  size_t offset;
} opt_t;

static const opt_t g_opts[] = {
#define TY_X(field, type, def, min, max, env, help) \
  {#field, OPT_##type, def, min, max, env, help, offsetof(srv_config_t, field)},
    SRV_OPTIONS(TY_X)
#undef TY_X
};
#define N_OPTS (sizeof g_opts / sizeof g_opts[0])

/* The option for a name, with '-' read as '_'; NULL when unknown. */
static const opt_t *opt_find(const char *name, size_t len) {
  for (size_t i = 0; i < N_OPTS; i++) {
    const char *n = g_opts[i].name;
    if (strlen(n) != len) continue;
    size_t k = 0;
    while (k < len && (name[k] == n[k] || (name[k] == '-' && n[k] == '_'))) k++;
    if (k == len) return &g_opts[i];
  }
  return NULL;
}

void srv_config_init(srv_config_t *c) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < N_OPTS; i++) {
    char msg[64];
    int rc = srv_config_set(c, g_opts[i].name, g_opts[i].def, "default", msg, sizeof msg);
    (void)rc;
  }
}

void srv_config_free(srv_config_t *c) {
  for (size_t i = 0; i < N_OPTS; i++)
    if (g_opts[i].type == OPT_STR) {
      char **p = (char **)((char *)c + g_opts[i].offset);
      free(*p);
      *p = NULL;
    }
}

static int set_opt(srv_config_t *c, const opt_t *o, const char *value, const char *origin,
                   char *msg, size_t msgsz) {
  void *field = (char *)c + o->offset;
  if (o->type == OPT_STR) {
    free(*(char **)field);
    *(char **)field = xstrdup(value);
    return 0;
  }
  /* Whole numbers are read as every other number of trainyard's
   * (common/numbers.h: digits only, no sign, blank or exponent). */
  long whole = 0;
  char *end = NULL;
  errno = 0;
  double v = o->type == OPT_INT ? 0 : strtod(value, &end);
  bool ok = o->type == OPT_INT ? ty_parse_long(value, LONG_MIN, LONG_MAX, &whole)
                               : end != value && !*end && !errno && isfinite(v);
  if (!ok) {
    snprintf(msg, msgsz, "%s: %s must be %s, got '%s'", origin, o->name,
             o->type == OPT_INT ? "a whole number" : "a number of seconds", value);
    return TY_EINVAL;
  }
  if (o->type == OPT_INT) v = (double)whole;
  if (v < o->min || v > o->max) {
    snprintf(msg, msgsz, "%s: %s must be between %.15g and %.15g, got %s", origin, o->name, o->min,
             o->max, value);
    return TY_EINVAL;
  }
  if (o->type == OPT_INT)
    *(int64_t *)field = whole;
  else
    *(double *)field = v;
  return 0;
}

int srv_config_set(srv_config_t *c, const char *name, const char *value, const char *origin,
                   char *msg, size_t msgsz) {
  const opt_t *o = opt_find(name, strlen(name));
  if (!o) {
    snprintf(msg, msgsz, "%s: unknown option '%s' (trainyardd --help lists them)", origin, name);
    return TY_EINVAL;
  }
  return set_opt(c, o, value, origin, msg, msgsz);
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && strchr(" \t\r\n", s[n - 1])) s[--n] = '\0';
  return s;
}

static int load_file(srv_config_t *c, const char *path, char *msg, size_t msgsz) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(msg, msgsz, "cannot read config file %s: %s", path, strerror(errno));
    return TY_EINVAL;
  }
  char line[4096];
  int lineno = 0, rc = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    char *s = trim(line);
    if (!*s || *s == '#') continue;
    char origin[256];
    snprintf(origin, sizeof origin, "%s:%d", path, lineno);
    char *eq = strchr(s, '=');
    if (!eq) {
      snprintf(msg, msgsz, "%s: expected `name = value`, got '%s'", origin, s);
      rc = TY_EINVAL;
      break;
    }
    *eq = '\0';
    char *name = trim(s), *value = trim(eq + 1);
    if (!strcmp(name, "config")) {
      snprintf(msg, msgsz, "%s: a config file cannot name another config file", origin);
      rc = TY_EINVAL;
      break;
    }
    rc = srv_config_set(c, name, value, origin, msg, msgsz);
  }
  fclose(f);
  return rc;
}

/* Finds --config in argv (flags win over the environment for it too). */
static const char *config_path(int argc, char **argv) {
  const char *path = getenv("TRAINYARD_CONFIG");
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) path = argv[i + 1];
    if (!strncmp(argv[i], "--config=", 9)) path = argv[i] + 9;
  }
  return path && *path ? path : NULL;
}

int srv_config_load(srv_config_t *c, int argc, char **argv, bool *help, char *msg, size_t msgsz) {
  *help = false;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      *help = true;
      return 0;
    }
  const char *file = config_path(argc, argv);
  int rc;
  if (file && (rc = load_file(c, file, msg, msgsz))) return rc;
  for (size_t i = 0; i < N_OPTS; i++) {
    const char *v = getenv(g_opts[i].env);
    if (v && (rc = set_opt(c, &g_opts[i], v, g_opts[i].env, msg, msgsz))) return rc;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2)) {
      snprintf(msg, msgsz, "unexpected argument '%s' (options are --name value)", a);
      return TY_EINVAL;
    }
    a += 2;
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    const opt_t *o = opt_find(a, len);
    if (!o) {
      snprintf(msg, msgsz, "unknown option '%s' (trainyardd --help lists them)", argv[i]);
      return TY_EINVAL;
    }
    const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!value) {
      snprintf(msg, msgsz, "option --%s needs a value", o->name);
      return TY_EINVAL;
    }
    char origin[80];
    snprintf(origin, sizeof origin, "--%s", o->name);
    if ((rc = set_opt(c, o, value, origin, msg, msgsz))) return rc;
  }
  return 0;
}

static bool addr_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family != AF_INET6) return false;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  if (IN6_IS_ADDR_LOOPBACK(a)) return true;
  return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

bool srv_listen_is_loopback(const char *listen, srv_resolver_t resolve) {
  char host[256];
  if (listen[0] == '[') {
    const char *end = strchr(listen, ']');
    if (!end) return false;
    snprintf(host, sizeof host, "%.*s", (int)(end - listen - 1), listen + 1);
  } else {
    const char *colon = strrchr(listen, ':');
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - listen) : (int)strlen(listen),
             listen);
  }
  if (!*host) return false; /* every address */
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (resolve(host, NULL, &hints, &res) || !res) return false;
  bool all = true;
  for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) all &= addr_loopback(ai->ai_addr);
  freeaddrinfo(res);
  return all;
}

bool srv_config_is_loopback(const char *listen) {
  return srv_listen_is_loopback(listen, getaddrinfo);
}

/* What an option's 0 means where it counts CPUs. */
static int64_t online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

int srv_config_check(srv_config_t *c, char *msg, size_t msgsz) {
  bool has_token = false;
  for (const char *p = c->tokens; *p; p++)
    if (*p != ',' && *p != ' ') has_token = true;
  if (!srv_config_is_loopback(c->listen) && !has_token) {
    snprintf(msg, msgsz,
             "refusing to listen on %s without an API token: not every address it resolves "
             "to is a loopback one; set --tokens (or TRAINYARD_TOKENS), or listen on a "
             "loopback address such as 127.0.0.1:8080",
             c->listen);
    return TY_EINVAL;
  }
  if (strcmp(c->dispatcher, "local") && strcmp(c->dispatcher, "slurm")) {
    snprintf(msg, msgsz, "dispatcher \"%s\" is not known; use local (ranks on this host) or slurm",
             c->dispatcher);
    return TY_EINVAL;
  }
  if (c->cpu_slots == 0) c->cpu_slots = online_cpus();
  if (c->http_threads == 0) c->http_threads = online_cpus();
  if (!*c->roots) {
    snprintf(msg, msgsz, "roots is empty: name at least one directory (--roots DIR[:DIR...])");
    return TY_EINVAL;
  }
  return 0;
}

void srv_config_usage(FILE *f) {
  fprintf(f,
          "usage: trainyardd [--name value ...]\n\n"
          "The trainyard control server. Each option is read, in increasing priority, from its\n"
          "default, the config file, its environment variable and the command line.\n\n");
  for (size_t i = 0; i < N_OPTS; i++) {
    const opt_t *o = &g_opts[i];
    fprintf(f, "  --%-18s %s\n", o->name, o->help);
    fprintf(f, "  %-20s default: %s%s", "", *o->def ? o->def : "(none)",
            o->type == OPT_SEC ? " s" : "");
    if (o->type != OPT_STR) fprintf(f, "; range %.15g..%.15g", o->min, o->max);
    fprintf(f, "; env %s\n", o->env);
  }
}
