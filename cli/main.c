/* main.c - trainyard: dispatches to one command per cli/cmd_*.c. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const cli_command_t g_commands[] = {
#define TY_X(name, fn, help, page) {name, fn, help, page},
    TY_COMMANDS_LOCAL(TY_X) TY_COMMANDS_CLIENT(TY_X)
#undef TY_X
        {"help", cmd_help, "where a command or a topic is documented: help [COMMAND | TOPIC]",
         "README"},
};
#define N_COMMANDS (sizeof g_commands / sizeof g_commands[0])

const cli_command_t *cli_commands(size_t *n) {
  *n = N_COMMANDS;
  return g_commands;
}

const cli_command_t *cli_command_find(const char *name) {
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (!strcmp(name, g_commands[i].name)) return &g_commands[i];
  return NULL;
}

void cli_usage(FILE *f) {
  fprintf(f, "usage: trainyard <command> [args]\n\ncommands:\n");
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(f, "  %-10s %s\n", g_commands[i].name, g_commands[i].help);
  fprintf(f,
          "\n'trainyard <command> --help' describes one command; 'trainyard help' lists the\n"
          "topics of the documentation (docs/README.md).\n");
}

static bool is_help_flag(const char *arg) {
  return !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

int main(int argc, char **argv) {
  /* validate and train check a JSONL file's examples with the tokenizer:
   * jobspec_jsonl_check, installed by the ty_jsonl_rule object linked in. */
  if (argc < 2) {
    cli_usage(stderr);
    return 2;
  }
  if (is_help_flag(argv[1])) {
    cli_usage(stdout);
    return 0;
  }
  const cli_command_t *cmd = cli_command_find(argv[1]);
  if (!cmd) {
    fprintf(stderr, "trainyard: unknown command '%s'\n\n", argv[1]);
    cli_usage(stderr);
    return 2;
  }
  /* `trainyard CMD --help`: the command's usage, then where its page is.
   * Asked before the command runs: commands may rearrange their argv. */
  const bool help = argc > 2 && is_help_flag(argv[2]);
  int rc = cmd->fn(argc - 1, argv + 1);
  if (help && rc == 0 && cmd->fn != cmd_help)
    cli_print_docs_line(stdout, cmd);
  return rc;
}
