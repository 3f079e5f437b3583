/* commands.h - the trainyard command table: name, handler, one-line help
 * and the page of docs/ that describes it. Each command lives in
 * cli/cmd_<name>.c and is added here once. */
#ifndef TY_CLI_COMMANDS_H
#define TY_CLI_COMMANDS_H

#include <stddef.h>
#include <stdio.h>

/* X(name, handler, help, page): page names docs/<page>.md. Commands that
 * talk to a server are compiled only in full builds (TRAINYARD_WITH_CLIENT);
 * `help` (cmd_help.c) closes the table. */
#define TY_COMMANDS_LOCAL(X)                                                                       \
  X("version", cmd_version, "print the version and build options", "getting-started")              \
  X("validate", cmd_validate,                                                                      \
    "check a job spec (file and/or --dotted.flags), print it normalized", "job-spec")              \
  X("mkmodel", cmd_mkmodel, "write a random Llama checkpoint (config.json + safetensors)",         \
    "checkpoints")                                                                                 \
  X("convert", cmd_convert, "rewrite a checkpoint (safetensors or PyTorch) as safetensors",        \
    "checkpoints")                                                                                 \
  X("merge", cmd_merge, "merge a LoRA adapter into its base checkpoint (a new HF checkpoint)",     \
    "training")                                                                                    \
  X("load", cmd_load, "start local ranks that only load their shards; print each rank's figures",  \
    "checkpoints")                                                                                 \
  X("train", cmd_train, "run a training job's ranks locally in the foreground", "training")        \
  X("eval", cmd_eval, "mean next-token loss of a model (and adapter) on a token file", "training") \
  X("tokenize", cmd_tokenize, "text to token ids (or back) with a model's tokenizer.json", "data") \
  X("generate", cmd_generate, "decode text from a model (and adapter) on the CPU, streamed",       \
    "training")                                                                                    \
  X("completion", cmd_completion, "print the shell completion script (bash or zsh)",               \
    "getting-started")

#ifdef TRAINYARD_WITH_CLIENT
#define TY_COMMANDS_CLIENT(X)                                                                  \
  X("submit", cmd_submit, "send a job spec to trainyardd; prints the job id", "server")        \
  X("list", cmd_list, "list the server's jobs (filter by state, page through)", "server")      \
  X("get", cmd_get, "print one job as JSON", "server")                                         \
  X("watch", cmd_watch, "follow a job live: per-rank progress until it ends", "server")        \
  X("cancel", cmd_cancel, "cancel a queued or running job", "server")                          \
  X("delete", cmd_delete, "delete jobs that have ended (their output folders stay)", "server") \
  X("logs", cmd_logs, "print a rank's log of a job", "server")
#else
#define TY_COMMANDS_CLIENT(X)
#endif

#define TY_X(name, fn, help, page) int fn(int argc, char **argv);
TY_COMMANDS_LOCAL(TY_X)
TY_COMMANDS_CLIENT(TY_X)
#undef TY_X
int cmd_help(int argc, char **argv);

/* The command list and how to get more, on f (trainyard with no command). */
void cli_usage(FILE *f);

typedef struct {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help; /* one line, for the command list */
  const char *page; /* the docs page: docs/<page>.md */
} cli_command_t;

/* The command table (main.c), in the order of the lists above: *n
 * receives the number of commands. */
const cli_command_t *cli_commands(size_t *n);
/* The command called name, or NULL. */
const cli_command_t *cli_command_find(const char *name);
/* The help topics (the pages of docs/), for completion: the i-th, or NULL
 * past the last. */
const char *cli_help_topic(size_t i);
/* Prints where cmd's docs page is, after its usage ("See docs/...md"). */
void cli_print_docs_line(FILE *f, const cli_command_t *cmd);

#endif
