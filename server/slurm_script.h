/* slurm_script.h - the batch script of one attempt under the Slurm
 * dispatcher (server/dispatch_slurm.c), and the argv that submits it.
 * Nothing here is ever read by a shell as code: numbers are written as
 * numbers, the job name keeps only [A-Za-z0-9._-], operator options must
 * be one `--name[=value]` token each, and the one line the shell runs
 * (`exec srun ... -- worker`) single-quotes every word. */
#ifndef TY_SERVER_SLURM_SCRIPT_H
#define TY_SERVER_SLURM_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *job_id;   /* the trainyard job's id */
  const char *job_name; /* the spec's name (kept: [A-Za-z0-9._-], others become '_') */
  int attempt;
  int nodes, ranks_per_node;
  int cpus_per_rank;
  int64_t mem_mib; /* --mem per node; 0: none asked */
  bool cuda;       /* --gpus-per-node ranks_per_node */
  int grace_s;     /* --signal=TERM@grace_s: Slurm warns the ranks before the time limit */
  const char *partition, *account, *qos, *time_limit; /* "" or NULL: not asked */
  const char *extra;   /* ';'-separated sbatch options, each one #SBATCH line; may be NULL */
  const char *worker;  /* the program srun starts on each task */
  const char *log_dir; /* rank-<i>.log and slurm-<jobid>.out go here */
} slurm_script_t;

/* The script's text into *out (the caller frees it): 0, or TY_EINVAL with
 * msg naming the option that cannot be written safely (an operator option
 * with a space or a newline, an extra option not starting with "--"). */
int slurm_script(const slurm_script_t *in, char **out, char *msg, size_t msgsz);

/* word in single quotes for sh, each ' written as '\'' (caller frees). */
char *slurm_sh_quote(const char *word);

/* A file name pattern for Slurm's --output: '%' doubled so that only the
 * pattern's own %t / %j are replaced (caller frees). NULL when path holds
 * a backslash, which turns off every replacement. */
char *slurm_output_pattern(const char *path, const char *suffix);

#endif
