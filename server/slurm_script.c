/* slurm_script.c - the batch script of one Slurm attempt; see
 * slurm_script.h. */
#include "server/slurm_script.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"

char *slurm_sh_quote(const char *word) {
  size_t n = 3;
  for (const char *p = word; *p; p++) n += *p == '\'' ? 4 : 1;
  char *out = xmalloc(n), *o = out;
  *o++ = '\'';
  for (const char *p = word; *p; p++) {
    if (*p == '\'') {
      memcpy(o, "'\\''", 4);
      o += 4;
    } else {
      *o++ = *p;
    }
  }
  *o++ = '\'';
  *o = '\0';
  return out;
}

char *slurm_output_pattern(const char *path, const char *suffix) {
  if (strchr(path, '\\')) return NULL;
  size_t n = strlen(suffix) + 1;
  for (const char *p = path; *p; p++) n += *p == '%' ? 2 : 1;
  char *out = xmalloc(n), *o = out;
  for (const char *p = path; *p; p++) {
    *o++ = *p;
    if (*p == '%') *o++ = '%';
  }
  strcpy(o, suffix);
  return out;
}

/* An operator's option value that sbatch reads from an #SBATCH line as one
 * token: printable, no space, no quote. */
static bool plain_value(const char *v) {
  for (const char *p = v; *p; p++)
    if (!isgraph((unsigned char)*p) || *p == '"' || *p == '\'' || *p == '\\') return false;
  return true;
}

typedef struct {
  char *buf;
  size_t len, cap;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    b->cap = b->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
    b->buf = xrealloc(b->buf, b->cap);
  }
}

int slurm_script(const slurm_script_t *in, char **out, char *msg, size_t msgsz) {
  *out = NULL;
  const struct {
    const char *opt, *flag, *val;
  } named[] = {{"partition", "--slurm_partition", in->partition},
               {"account", "--slurm_account", in->account},
               {"qos", "--slurm_qos", in->qos},
               {"time", "--slurm_time", in->time_limit}};
  for (size_t i = 0; i < sizeof named / sizeof *named; i++)
    if (named[i].val && *named[i].val && !plain_value(named[i].val)) {
      snprintf(msg, msgsz,
               "%s \"%s\" cannot be written as an #SBATCH line: it holds a space, a quote or a "
               "control character; give Slurm's name as it is",
               named[i].flag, named[i].val);
      return TY_EINVAL;
    }
  char name[96];
  size_t k = 0;
  for (const char *p = in->job_name ? in->job_name : ""; *p && k < 40; p++)
    name[k++] = isalnum((unsigned char)*p) || *p == '.' || *p == '_' || *p == '-' ? *p : '_';
  name[k] = '\0';
  char *pattern = slurm_output_pattern(in->log_dir, "/rank-%t.log");
  if (!pattern) {
    snprintf(msg, msgsz,
             "the attempt's folder %s holds a backslash, which turns off Slurm's %%t in a file "
             "name: give --state_dir a path without one",
             in->log_dir);
    return TY_EINVAL;
  }
  sbuf_t b = {xmalloc(1024), 0, 1024};
  sb_printf(&b,
            "#!/bin/sh\n"
            "# trainyard job %s, attempt %d: written by trainyardd --dispatcher slurm and\n"
            "# submitted with sbatch. Rank i writes rank-i.log beside this file.\n",
            in->job_id, in->attempt);
  sb_printf(&b, "#SBATCH --job-name=trainyard-%s-%s\n", name, in->job_id);
  sb_printf(&b, "#SBATCH --nodes=%d\n#SBATCH --ntasks-per-node=%d\n", in->nodes,
            in->ranks_per_node);
  sb_printf(&b, "#SBATCH --cpus-per-task=%d\n", in->cpus_per_rank);
  if (in->mem_mib > 0) sb_printf(&b, "#SBATCH --mem=%lldM\n", (long long)in->mem_mib);
  if (in->cuda) sb_printf(&b, "#SBATCH --gpus-per-node=%d\n", in->ranks_per_node);
  sb_printf(&b, "#SBATCH --no-requeue\n#SBATCH --signal=TERM@%d\n", in->grace_s);
  for (size_t i = 0; i < sizeof named / sizeof *named; i++)
    if (named[i].val && *named[i].val)
      sb_printf(&b, "#SBATCH --%s=%s\n", named[i].opt, named[i].val);
  /* Extra options: one token each, as the operator wrote them. */
  for (const char *p = in->extra ? in->extra : ""; *p;) {
    const char *end = strchr(p, ';');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n && isspace((unsigned char)*p)) p++, n--;
    while (n && isspace((unsigned char)p[n - 1])) n--;
    if (n) {
      char opt[512];
      snprintf(opt, sizeof opt, "%.*s", (int)n, p);
      if (n >= sizeof opt || strncmp(opt, "--", 2) || !plain_value(opt)) {
        snprintf(msg, msgsz,
                 "--slurm_extra option \"%s\" is not one sbatch option: write each as "
                 "--name=value (no spaces or quotes), separated by ';'",
                 opt);
        free(b.buf);
        free(pattern);
        return TY_EINVAL;
      }
      sb_printf(&b, "#SBATCH %s\n", opt);
    }
    p = end ? end + 1 : p + strlen(p);
  }
  char *q_pattern = slurm_sh_quote(pattern), *q_worker = slurm_sh_quote(in->worker);
  /* srun starts every rank; one that fails ends the others at once. */
  sb_printf(&b, "exec srun --kill-on-bad-exit=1 --output=%s -- %s\n", q_pattern, q_worker);
  free(q_pattern);
  free(q_worker);
  free(pattern);
  *out = b.buf;
  return 0;
}
