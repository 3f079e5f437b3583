/* commands.h - the trainyard command table: name, handler, one-line help.
 * Each command lives in cli/cmd_<name>.c and is added here once. */
#ifndef TY_CLI_COMMANDS_H
#define TY_CLI_COMMANDS_H

/* X(name, handler, help). Commands that talk to a server are compiled only
 * in full builds (TRAINYARD_WITH_CLIENT). */
#define TY_COMMANDS_LOCAL(X) \
  X("version", cmd_version, "print the version and build options") \
  X("validate", cmd_validate, "check a job spec (file and/or --dotted.flags), print it normalized") \
  X("mkmodel", cmd_mkmodel, "write a random Llama checkpoint (config.json + safetensors)") \
  X("convert", cmd_convert, "rewrite a checkpoint (safetensors or PyTorch) as safetensors") \
  X("merge", cmd_merge, "merge a LoRA adapter into its base checkpoint (a new HF checkpoint)") \
  X("load", cmd_load, "start local ranks that only load their shards; print each rank's figures") \
  X("train", cmd_train, "run a training job's ranks locally in the foreground") \
  X("eval", cmd_eval, "mean next-token loss of a model (and adapter) on a token file") \
  X("tokenize", cmd_tokenize, "text to token ids (or back) with a model's tokenizer.json") \
  X("generate", cmd_generate, "decode text from a model (and adapter) on the CPU, streamed")

#ifdef TRAINYARD_WITH_CLIENT
#define TY_COMMANDS_CLIENT(X)                                                        \
  X("submit", cmd_submit, "send a job spec to trainyardd; prints the job id")        \
  X("list", cmd_list, "list the server's jobs (filter by state, page through)")      \
  X("get", cmd_get, "print one job as JSON")                                         \
  X("watch", cmd_watch, "follow a job live: per-rank progress until it ends")        \
  X("cancel", cmd_cancel, "cancel a queued or running job")                          \
  X("delete", cmd_delete, "delete jobs that have ended (their output folders stay)") \
  X("logs", cmd_logs, "print a rank's log of a job")
#else
#define TY_COMMANDS_CLIENT(X)
#endif

#define TY_X(name, fn, help) int fn(int argc, char **argv);
TY_COMMANDS_LOCAL(TY_X)
TY_COMMANDS_CLIENT(TY_X)
#undef TY_X

#endif
