/* main.c - trainyard: dispatches to one command per cli/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *help;
} command_t;

static const command_t g_commands[] = {
#define TY_X(name, fn, help) {name, fn, help},
    TY_COMMANDS_LOCAL(TY_X) TY_COMMANDS_CLIENT(TY_X)
#undef TY_X
};

static void usage(FILE *f) {
  fprintf(f, "usage: trainyard <command> [args]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
    fprintf(f, "  %-10s %s\n", g_commands[i].name, g_commands[i].help);
  fprintf(f, "\n'trainyard <command> --help' describes one command.\n");
}

int main(int argc, char **argv) {
  /* validate and train check a JSONL file's examples with the tokenizer:
   * jobspec_jsonl_check, installed by the ty_jsonl_rule object linked in. */
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
    if (!strcmp(argv[1], g_commands[i].name)) return g_commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "trainyard: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
