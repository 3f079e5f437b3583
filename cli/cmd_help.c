/* cmd_help.c - trainyard help [COMMAND | TOPIC]: a command's usage and its
 * docs page, or a topic of the documentation and the commands it covers.
 * The topics are the pages of docs/ (docs/README.md lists them). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct {
  const char *page; /* docs/<page>.md; also the topic's name */
  const char *what; /* what the page covers, as docs/README.md says */
} help_topic_t;

static const help_topic_t g_topics[] = {
    {"getting-started", "the build, the demo, a first job without a server"},
    {"job-spec", "the fields, dotted flags, the validation rules, the memory rules"},
    {"data", "token files, JSONL (text, prompt/completion, chat), tokenizers, chat templates"},
    {"checkpoints", "formats, the supported models, the two load paths, convert, mkmodel"},
    {"training", "LoRA, full training, QLoRA, evaluation, generation, samples, merge, ranks"},
    {"server", "trainyardd, its options, the client commands"},
    {"rest-api", "endpoints, errors, events; the server's /v1/openapi.json and /docs"},
    {"grpc-api", "the service, errors, streams"},
    {"web", "the status page"},
    {"slurm", "one batch job per attempt; a test cluster on one machine"},
    {"gpu", "the CUDA backend, the simulated device, running on a GPU host"},
    {"observability", "TensorBoard, metrics.jsonl, Prometheus, progress and ETA"},
    {"security", "tokens, clients, inputs, files confined to roots"},
    {"recovery", "what survives kill -9, a full disk or a damaged database"},
    {"troubleshooting", "the refusals you are likely to meet, each with its fix"},
};
#define N_TOPICS (sizeof g_topics / sizeof g_topics[0])

void cli_print_docs_line(FILE *f, const cli_command_t *cmd) {
  fprintf(f, "\nSee docs/%s.md (trainyard help %s).\n", cmd->page, cmd->page);
}

const char *cli_help_topic(size_t i) {
  return i < N_TOPICS ? g_topics[i].page : NULL;
}

static void list_topics(FILE *f) {
  fprintf(f, "\ntopics (trainyard help TOPIC; each is a page docs/TOPIC.md):\n");
  for (size_t i = 0; i < N_TOPICS; i++)
    fprintf(f, "  %-16s %s\n", g_topics[i].page, g_topics[i].what);
}

static const help_topic_t *topic_find(const char *name) {
  for (size_t i = 0; i < N_TOPICS; i++)
    if (!strcmp(name, g_topics[i].page)) return &g_topics[i];
  return NULL;
}

/* A topic: what its page covers, where it is, and the commands it covers. */
static void print_topic(const help_topic_t *t) {
  printf("%s: %s\nSee docs/%s.md.\n", t->page, t->what, t->page);
  size_t n, shown = 0;
  const cli_command_t *cmds = cli_commands(&n);
  for (size_t i = 0; i < n; i++) {
    if (strcmp(cmds[i].page, t->page)) continue;
    printf("%s trainyard %s", shown++ ? "," : "Commands:", cmds[i].name);
  }
  if (shown) printf(" (trainyard COMMAND --help).\n");
}

int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    cli_usage(stdout);
    list_topics(stdout);
    return 0;
  }
  if (argc > 2) {
    fprintf(stderr, "trainyard help: one command or topic at a time, got %d\n", argc - 1);
    return 2;
  }
  const char *name = argv[1];
  const cli_command_t *cmd = cli_command_find(name);
  if (cmd && cmd->fn != cmd_help) {
    char help_flag[] = "--help";
    char *args[] = {argv[1], help_flag, NULL};
    int rc = cmd->fn(2, args);
    cli_print_docs_line(stdout, cmd);
    return rc;
  }
  const help_topic_t *t = topic_find(name);
  if (t) {
    print_topic(t);
    return 0;
  }
  if (cmd) { /* help help */
    cli_usage(stdout);
    list_topics(stdout);
    return 0;
  }
  fprintf(stderr, "trainyard help: '%s' is neither a command nor a topic; choose one of these:\n\n",
          name);
  cli_usage(stderr);
  list_topics(stderr);
  return 2;
}
