/* rankenv.h - the rank environment of the worker contract (DESIGN.md
 * "Worker contract"): every variable a launcher (trainyardd's dispatcher,
 * the CLI's local launcher) sets or passes on to a trainyard-worker rank,
 * and every tuning variable a rank reads, in one table. A launcher builds
 * a rank's environment with rankenv_set + rankenv_envp; a rank reads it
 * with rankenv_str / rankenv_long. No other file spells these names. */
#ifndef TY_COMMON_RANKENV_H
#define TY_COMMON_RANKENV_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* No default: a number read from an unset variable keeps the caller's. */
#define RANKENV_NO_DEFAULT LONG_MIN

/* X(id, name, type, lo, hi, default, meaning)
 *   id       RANKENV_<id>
 *   name     the variable
 *   type     STR or INT (a whole number in lo..hi; anything else is an error
 *            naming the variable, never a silent default)
 *   default  of an INT when unset, or RANKENV_NO_DEFAULT (the reader's own)
 *   meaning  for docs and error messages
 * Launcher-set entries come first: a local launcher replaces each of them
 * (RANKENV_LAUNCHER_SET_LAST) in the environment it passes on. */
#define RANKENV_FIELDS(X)                                                                          \
  X(SPEC, "TRAINYARD_SPEC", STR, 0, 0, RANKENV_NO_DEFAULT,                                         \
    "path of the job's normalized spec (JSON)")                                                    \
  X(MODE, "TRAINYARD_MODE", STR, 0, 0, RANKENV_NO_DEFAULT, "the work: train (unset) or load")      \
  X(JOB_ID, "TRAINYARD_JOB_ID", STR, 0, 0, RANKENV_NO_DEFAULT, "the job's id; unset: local")       \
  X(ATTEMPT, "TRAINYARD_ATTEMPT", INT, 1, 1L << 30, 1, "which attempt of the job this is, from 1") \
  X(RANK, "TRAINYARD_RANK", INT, 0, 65535, 0, "this process's rank")                               \
  X(WORLD_SIZE, "TRAINYARD_WORLD_SIZE", INT, 1, 65536, 1, "the job's ranks")                       \
  X(RENDEZVOUS, "TRAINYARD_RENDEZVOUS", STR, 0, 0, RANKENV_NO_DEFAULT,                             \
    "where the ranks meet: self, shm:<name>, nccl:file:<path>, gloo:file:<dir>, "                  \
    "gloo:http:<url>")                                                                             \
  X(REPORT_URL, "TRAINYARD_REPORT_URL", STR, 0, 0, RANKENV_NO_DEFAULT,                             \
    "where reports are POSTed; unset: one JSON line each on stdout")                               \
  X(TOKEN, "TRAINYARD_JOB_TOKEN", STR, 0, 0, RANKENV_NO_DEFAULT,                                   \
    "the job's token, sent as Authorization: Bearer with each report")                             \
  X(LOG_DIR, "TRAINYARD_RANK_LOG_DIR", STR, 0, 0, RANKENV_NO_DEFAULT,                              \
    "where a rank appends its own output to rank-<rank>.log, capped at TRAINYARD_RANK_LOG_MAX "    \
    "(ranks srun started); unset: its stdout and stderr as they are")                              \
  X(LOG_MAX, "TRAINYARD_RANK_LOG_MAX", INT, 4096, 1L << 40, 16777216,                              \
    "bytes of its output a rank keeps in rank-<rank>.log (with TRAINYARD_RANK_LOG_DIR)")           \
  X(READ_ROOTS, "TRAINYARD_READ_ROOTS", STR, 0, 0, RANKENV_NO_DEFAULT,                             \
    "folders (':'-separated) the rank may read beneath; with WRITE_ROOTS unset: anywhere")         \
  X(WRITE_ROOTS, "TRAINYARD_WRITE_ROOTS", STR, 0, 0, RANKENV_NO_DEFAULT,                           \
    "folders (':'-separated) the rank may write beneath")                                          \
  X(HEARTBEAT_MS, "TRAINYARD_HEARTBEAT_MS", INT, 0, 3600000, 15000,                                \
    "milliseconds without a report after which a rank sends its last one again; 0: never; "        \
    "unset: 15000")                                                                                \
  X(BENEATH_WALK, "TRAINYARD_BENEATH_WALK", INT, 0, 1, 0,                                          \
    "1 opens files inside the roots by the O_NOFOLLOW walk instead of openat2")                    \
  X(CUDA_MEM_LIMIT_MIB, "TRAINYARD_CUDA_MEM_LIMIT_MIB", INT, 0, 1L << 30, 0,                       \
    "MiB of device memory this process may take; 0 or unset: no cap")                              \
  X(THREADS, "TRAINYARD_THREADS", INT, 1, 256, RANKENV_NO_DEFAULT,                                 \
    "threads for the CPU kernels; unset: one per CPU this process may use")                        \
  X(COMM_TIMEOUT_MS, "TRAINYARD_COMM_TIMEOUT_MS", INT, 1, 24L * 3600 * 1000, RANKENV_NO_DEFAULT,   \
    "milliseconds a collective waits for a late peer")                                             \
  X(COMM_SHM_CHUNK_KB, "TRAINYARD_COMM_SHM_CHUNK_KB", INT, 4, 1L << 20, RANKENV_NO_DEFAULT,        \
    "KiB of shared memory per rank and chunk of a collective")                                     \
  X(GLOO_HOST, "TRAINYARD_GLOO_HOST", STR, 0, 0, RANKENV_NO_DEFAULT,                               \
    "the address a gloo rank listens on; unset: the machine's hostname")                           \
  X(HEAD_ROWS, "TRAINYARD_HEAD_ROWS", INT, 1, 1L << 30, RANKENV_NO_DEFAULT,                        \
    "tokens per chunk of the output head's logits; unset: what 256 MiB holds")                     \
  X(CUDA_ATTN_MIB, "TRAINYARD_CUDA_ATTN_MIB", INT, 0, 1L << 20, 128,                               \
    "MiB of scores for a bf16 model's tensor-core attention; 0: fp32 attention")                   \
  X(SLURM_RANK, "SLURM_PROCID", INT, 0, 65535, RANKENV_NO_DEFAULT,                                 \
    "the rank as Slurm's srun numbers its tasks; read where TRAINYARD_RANK is unset")              \
  X(SLURM_WORLD_SIZE, "SLURM_NTASKS", INT, 1, 65536, RANKENV_NO_DEFAULT,                           \
    "the tasks of Slurm's job step; read where TRAINYARD_WORLD_SIZE is unset")                     \
  X(SLURM_NODE, "SLURM_NODEID", INT, 0, 65535, RANKENV_NO_DEFAULT,                                 \
    "the node of this task within the Slurm allocation, from 0")                                   \
  X(SLURM_LOCAL_RANK, "SLURM_LOCALID", INT, 0, 65535, RANKENV_NO_DEFAULT,                          \
    "this task's index among those of its node, from 0")

typedef enum {
#define RANKENV_ENUM(id, name, type, lo, hi, dflt, meaning) RANKENV_##id,
  RANKENV_FIELDS(RANKENV_ENUM)
#undef RANKENV_ENUM
      RANKENV_COUNT
} rankenv_id_t;

/* The last of the variables a launcher always sets or clears itself. */
#define RANKENV_LAUNCHER_SET_LAST RANKENV_WRITE_ROOTS

/* The variable's name ("TRAINYARD_RANK"), for messages. */
const char *rankenv_name(rankenv_id_t id);
/* What it means, as the table says. */
const char *rankenv_meaning(rankenv_id_t id);

/* ---- a rank reading its environment ---- */

/* The variable's value, or NULL when it is unset or empty. TRAINYARD_RANK
 * and TRAINYARD_WORLD_SIZE, where unset, are read from Slurm's
 * SLURM_PROCID and SLURM_NTASKS (ranks that srun started), and an error
 * then names the variable that was read. */
const char *rankenv_str(rankenv_id_t id);
/* An INT variable in the table's range into *out (its default, or *out as
 * it is when the table has none, when unset); 0, or TY_EINVAL with the
 * variable, its value and its range in err. */
int rankenv_long(rankenv_id_t id, long *out, char *err, size_t errlen);
/* The same in [lo, hi] (a range that depends on another variable, such as
 * RANK below WORLD_SIZE). */
int rankenv_long_in(rankenv_id_t id, long lo, long hi, long *out, char *err, size_t errlen);

/* The GPU (of ndev >= 1 visible) that rank uses: its index among its
 * node's ranks (SLURM_LOCALID, where srun started it) modulo ndev, else
 * rank modulo ndev (one host: the local launcher's ranks, or trainyardd's,
 * each of which sees only its own GPU). The NCCL comm and the rank's
 * placement pick the same one. 0, or TY_EINVAL naming SLURM_LOCALID when
 * it is set but not a task index. */
int rankenv_gpu(int rank, int ndev, int *out, char *err, size_t errlen);

/* ---- a launcher building a rank's environment ---- */

/* The values a launcher gives one rank; each is owned (rankenv_clear). */
typedef struct {
  char *val[RANKENV_COUNT];
} rankenv_t;

/* What of the launcher's own environment a rank inherits. */
typedef enum {
  /* everything but the variables a launcher always sets (SPEC ..
   * WRITE_ROOTS) and those set in the rankenv_t: the CLI's launcher, whose
   * user may tune ranks through the tuning variables */
  RANKENV_INHERIT_TUNING,
  /* nothing named TRAINYARD_*: trainyardd, whose own options share the
   * prefix; the rank gets only what the rankenv_t sets */
  RANKENV_INHERIT_NONE,
} rankenv_inherit_t;

/* Sets (a copy of) value, or unsets the variable when value is NULL. */
void rankenv_set(rankenv_t *e, rankenv_id_t id, const char *value);
/* Sets the decimal text of v. */
void rankenv_set_long(rankenv_t *e, rankenv_id_t id, long long v);
/* Frees every value; e may be used again. */
void rankenv_clear(rankenv_t *e);

/* A rank's environment: base (NULL-terminated; "NAME=value" strings) as
 * inherit says, less every variable named in drop (NULL-terminated
 * "NAME=" prefixes; may be NULL), then e's values, then extra
 * (NULL-terminated "NAME=value"; may be NULL). Returns a NULL-terminated
 * array that the caller frees with rankenv_envp_free (it is built before a
 * fork; the child only reads it). */
char **rankenv_envp(const rankenv_t *e, char *const *base, rankenv_inherit_t inherit,
                    const char *const *drop, const char *const *extra);
void rankenv_envp_free(char **envp);

#ifdef __cplusplus
}
#endif

#endif
