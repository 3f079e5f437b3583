/* cmd_completion.c - trainyard completion bash|zsh: prints a shell
 * completion script. Its words come from the tables, never from a copy:
 * the command table (commands.h), each command's flags as its own --help
 * names them, the job spec's fields as --dotted.flags with their values
 * (jobspec_fields_each) and the help topics. Job ids are asked of the
 * server (`trainyard list`, quietly) while the user completes. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/jobspec.h"
#include "cli/commands.h"

#define MAX_FLAGS 128 /* distinct flags a command's --help may name */

static void usage(FILE *f) {
  fprintf(f,
          "usage: trainyard completion bash|zsh\n"
          "Prints a completion script for the shell: the commands, each command's flags,\n"
          "the job spec's fields as dotted flags (with true/false or an enum's choices\n"
          "as their values), the help topics, and job ids from the server (trainyard list,\n"
          "quietly, with the server, gRPC and token flags of the line; nothing when the\n"
          "server does not answer within 2 s). Where no word fits, file names are completed.\n"
          "  bash:  source <(trainyard completion bash)\n"
          "         or save it as ~/.local/share/bash-completion/completions/trainyard\n"
          "  zsh:   source <(trainyard completion zsh)   (after compinit)\n"
          "         or save it as _trainyard in a folder of $fpath\n");
}

/* What the script knows of one command, as words separated by spaces. */
typedef struct {
  const cli_command_t *cmd;
  char *flags;  /* "--json --watch ..." (owned) */
  char *values; /* pairs "KEY\tWORDS\n", KEY "cmd --flag" (owned) */
  bool spec;    /* takes the spec's --dotted.field flags */
  bool job;     /* takes JOB_ID arguments */
} comp_cmd_t;

/* cmd's `--help` text, run in a child process whose stdout is a pipe (the
 * command prints its usage as it always does). Caller frees; NULL when the
 * command could not be run or did not exit 0. */
static char *help_text(const cli_command_t *cmd) {
  int fd[2];
  if (pipe(fd)) return NULL;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return NULL;
  }
  if (pid == 0) {
    close(fd[0]);
    dup2(fd[1], STDOUT_FILENO);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDERR_FILENO);
    char name[64], help[] = "--help";
    snprintf(name, sizeof name, "%s", cmd->name);
    char *args[] = {name, help, NULL};
    int rc = cmd->fn(2, args);
    fflush(stdout);
    _exit(rc ? 1 : 0);
  }
  close(fd[1]);
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  char buf[4096];
  ssize_t n;
  while (out && (n = read(fd[0], buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)n, out);
  close(fd[0]);
  if (out) fclose(out);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) {
    free(text);
    return NULL;
  }
  return text;
}

static bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.';
}

/* The choices written after a flag in a usage ("--dtype f32|bf16|f16"):
 * lower-case words joined by '|', copied to out with spaces; false when
 * the text at p is not such a list. */
static bool usage_choices(const char *p, char *out, size_t outsz) {
  size_t n = 0;
  bool bar = false;
  for (; *p && *p != ' ' && *p != ']' && *p != ')' && *p != '\n'; p++) {
    if (*p == '|') {
      if (n == 0 || out[n - 1] == ' ') return false; /* "| --fields", "a||b" */
      bar = true;
    } else if (!word_char(*p) || (*p >= 'A' && *p <= 'Z')) {
      return false;
    }
    if (n + 1 >= outsz) return false;
    out[n++] = *p == '|' ? ' ' : *p;
  }
  out[n] = '\0';
  return bar && out[n - 1] != ' ';
}

/* Whether flag is one of the words of list (" --a --b"). */
static bool in_words(const char *list, const char *flag) {
  size_t n = strlen(flag);
  for (const char *p = list; (p = strstr(p, flag)); p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
  return false;
}

/* Collects the --flags a usage text names (each once; "--dotted.field"
 * stands for the spec's fields, which spec_flags lists, as the examples'
 * flags are) and the choices written after them, into c. */
static int scan_usage(comp_cmd_t *c, const char *text, const char *spec_flags) {
  char *seen[MAX_FLAGS];
  size_t nseen = 0, flen = 0, vlen = 0;
  FILE *flags = open_memstream(&c->flags, &flen);
  FILE *values = open_memstream(&c->values, &vlen);
  if (!flags || !values) {
    if (flags) fclose(flags);
    if (values) fclose(values);
    return -1;
  }
  c->spec = strstr(text, "--dotted.") != NULL;
  c->job = strstr(text, "JOB_ID") != NULL;
  fputs("--help", flags);
  for (const char *p = text; (p = strstr(p, "--")); p += 2) {
    if (p > text && word_char(p[-1])) continue;
    size_t n = 0;
    while (word_char(p[2 + n])) n++;
    if (n == 0 || !strncmp(p + 2, "dotted.", 7) || (n == 4 && !strncmp(p + 2, "help", 4))) continue;
    char *flag = strndup(p, n + 2);
    if (!flag) break;
    bool dup = c->spec && in_words(spec_flags, flag);
    for (size_t i = 0; i < nseen && !dup; i++) dup = !strcmp(seen[i], flag);
    if (dup || nseen == MAX_FLAGS) {
      free(flag);
      continue;
    }
    seen[nseen++] = flag;
    fprintf(flags, " %s", flag);
    char choices[256];
    if (p[2 + n] == ' ' && usage_choices(p + 3 + n, choices, sizeof choices))
      fprintf(values, "%s %s\t%s\n", c->cmd->name, flag, choices);
  }
  for (size_t i = 0; i < nseen; i++) free(seen[i]);
  fclose(flags);
  fclose(values);
  return c->flags && c->values ? 0 : -1;
}

/* The spec's fields as flags and their values (jobspec_fields_each). */
typedef struct {
  FILE *flags;  /* " --name --model_path ..." */
  FILE *values; /* "spec --dtype\tfloat32 bfloat16 float16\n" */
} spec_words_t;

static void add_spec_field(const char *path, const char *type, const char *dflt, const char *range,
                           const char *help, void *ctx) {
  (void)dflt, (void)range, (void)help;
  spec_words_t *w = ctx;
  if (!strcmp(type, "object")) return; /* a group: its fields are flags themselves */
  fprintf(w->flags, " --%s", path);
  if (!strcmp(type, "bool")) {
    fprintf(w->values, "spec --%s\ttrue false\n", path);
  } else if (strchr(type, '|') && !strstr(type, "object") && !strstr(type, "list")) {
    fprintf(w->values, "spec --%s\t", path);
    for (const char *t = type; *t; t++) fputc(*t == '|' ? ' ' : *t, w->values);
    fputc('\n', w->values);
  }
}

/* Each "KEY\tWORDS\n" line of pairs in the shell's assignment form. */
static void print_pairs(const char *pairs, bool zsh) {
  const char *p = pairs;
  while (p && *p) {
    const char *tab = strchr(p, '\t'), *nl = strchr(p, '\n');
    if (!tab || !nl || tab > nl) break;
    printf(zsh ? "  \"%.*s\" \"%.*s\"\n" : "  [\"%.*s\"]=\"%.*s\"\n", (int)(tab - p), p,
           (int)(nl - tab - 1), tab + 1);
    p = nl + 1;
  }
}

typedef enum { WORDS_ALL, WORDS_SPEC, WORDS_JOB } words_t;

/* The names of the commands (every one, or those that take a spec or job
 * ids), space-separated with a space at each end, as the variable var. */
static void print_words(const char *var, const comp_cmd_t *cmds, size_t n, words_t which) {
  printf("%s=\" ", var);
  for (size_t i = 0; i < n; i++)
    if (which == WORDS_ALL || (which == WORDS_SPEC && cmds[i].spec) ||
        (which == WORDS_JOB && cmds[i].job))
      printf("%s ", cmds[i].cmd->name);
  printf("\"\n");
}

static void print_data(const comp_cmd_t *cmds, size_t n, const char *spec_flags,
                       const char *spec_values, bool zsh) {
  print_words("_trainyard_commands", cmds, n, WORDS_ALL);
  print_words("_trainyard_spec_commands", cmds, n, WORDS_SPEC);
  print_words("_trainyard_job_commands", cmds, n, WORDS_JOB);
  printf("_trainyard_topics=\"");
  for (size_t i = 0; cli_help_topic(i); i++) printf("%s%s", i ? " " : "", cli_help_topic(i));
  printf("\"\n_trainyard_spec_flags=\"%s\"\n", spec_flags + (*spec_flags == ' '));
  printf(zsh ? "typeset -gA _trainyard_flags _trainyard_values\n_trainyard_flags=(\n"
             : "declare -gA _trainyard_flags=(\n");
  for (size_t i = 0; i < n; i++)
    printf(zsh ? "  %s \"%s\"\n" : "  [%s]=\"%s\"\n", cmds[i].cmd->name, cmds[i].flags);
  printf(zsh ? ")\n_trainyard_values=(\n" : ")\ndeclare -gA _trainyard_values=(\n");
  for (size_t i = 0; i < n; i++) print_pairs(cmds[i].values, zsh);
  print_pairs(spec_values, zsh);
  printf(")\n");
}

/* The shell functions: the words above, picked by the word's place. */
static const char g_bash_functions[] =
    "# Job ids of the server the line names (--server, --grpc, --token), else\n"
    "# the default one; nothing when it does not answer within 2 s.\n"
    "_trainyard_job_ids() {\n"
    "  local i args=() t=()\n"
    "  for ((i = 2; i < COMP_CWORD; i++)); do\n"
    "    case ${COMP_WORDS[i]} in\n"
    "      --server | --grpc | --token) args+=(\"${COMP_WORDS[i]}\" \"${COMP_WORDS[i + 1]}\") ;;\n"
    "    esac\n"
    "  done\n"
    "  command -v timeout >/dev/null && t=(timeout 2)\n"
    "  \"${t[@]}\" \"${COMP_WORDS[0]}\" list --limit 200 \"${args[@]}\" 2>/dev/null |\n"
    "    while read -r id _; do [[ $id == ID ]] || printf '%s\\n' \"$id\"; done\n"
    "}\n"
    "\n"
    "_trainyard() {\n"
    "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}\n"
    "  local cmd=${COMP_WORDS[1]} words=\n"
    "  COMPREPLY=()\n"
    "  if ((COMP_CWORD == 1)); then\n"
    "    words=$_trainyard_commands\n"
    "  elif [[ $cmd == help ]]; then\n"
    "    ((COMP_CWORD == 2)) && words=\"$_trainyard_commands $_trainyard_topics\"\n"
    "  elif [[ $cmd == completion ]]; then\n"
    "    ((COMP_CWORD == 2)) && words=\"bash zsh\"\n"
    "  elif [[ $cur == -* ]]; then\n"
    "    words=${_trainyard_flags[$cmd]}\n"
    "    [[ $_trainyard_spec_commands == *\" $cmd \"* ]] && words+=\" $_trainyard_spec_flags\"\n"
    "  elif [[ -n ${_trainyard_values[\"$cmd $prev\"]+set} ]]; then\n"
    "    words=${_trainyard_values[\"$cmd $prev\"]}\n"
    "  elif [[ $_trainyard_spec_commands == *\" $cmd \"* &&\n"
    "          -n ${_trainyard_values[\"spec $prev\"]+set} ]]; then\n"
    "    words=${_trainyard_values[\"spec $prev\"]}\n"
    "  elif [[ $_trainyard_job_commands == *\" $cmd \"* && $prev != -* ]]; then\n"
    "    words=$(_trainyard_job_ids)\n"
    "  fi\n"
    "  # No words: readline completes file names (complete -o default).\n"
    "  [[ -n $words ]] && mapfile -t COMPREPLY < <(compgen -W \"$words\" -- \"$cur\")\n"
    "  return 0\n"
    "}\n"
    "complete -o default -F _trainyard trainyard\n";

static const char g_zsh_functions[] =
    "_trainyard_job_ids() {\n"
    "  local i; local -a args t\n"
    "  for ((i = 3; i < CURRENT; i++)); do\n"
    "    case ${words[i]} in\n"
    "      --server | --grpc | --token) args+=(${words[i]} ${words[i + 1]}) ;;\n"
    "    esac\n"
    "  done\n"
    "  (( $+commands[timeout] )) && t=(timeout 2)\n"
    "  $t ${words[1]} list --limit 200 $args 2>/dev/null |\n"
    "    while read -r id rest; do [[ $id == ID ]] || print -r -- $id; done\n"
    "}\n"
    "\n"
    "_trainyard() {\n"
    "  local cur=${words[CURRENT]} prev=${words[CURRENT - 1]} cmd=${words[2]}\n"
    "  local -a choices\n"
    "  if (( CURRENT == 2 )); then\n"
    "    choices=(${=_trainyard_commands})\n"
    "  elif [[ $cmd == help ]]; then\n"
    "    (( CURRENT == 3 )) && choices=(${=_trainyard_commands} ${=_trainyard_topics})\n"
    "  elif [[ $cmd == completion ]]; then\n"
    "    (( CURRENT == 3 )) && choices=(bash zsh)\n"
    "  elif [[ $cur == -* ]]; then\n"
    "    choices=(${=_trainyard_flags[$cmd]})\n"
    "    [[ $_trainyard_spec_commands == *\" $cmd \"* ]] && choices+=(${=_trainyard_spec_flags})\n"
    "  elif (( ${+_trainyard_values[$cmd $prev]} )); then\n"
    "    choices=(${=_trainyard_values[$cmd $prev]})\n"
    "  elif [[ $_trainyard_spec_commands == *\" $cmd \"* ]] &&\n"
    "       (( ${+_trainyard_values[spec $prev]} )); then\n"
    "    choices=(${=_trainyard_values[spec $prev]})\n"
    "  elif [[ $_trainyard_job_commands == *\" $cmd \"* && $prev != -* ]]; then\n"
    "    choices=(${(f)\"$(_trainyard_job_ids)\"})\n"
    "  fi\n"
    "  if (( $#choices )); then compadd -- $choices; else _files; fi\n"
    "}\n"
    "(( $+functions[compdef] )) && compdef _trainyard trainyard\n";

static void free_cmds(comp_cmd_t *cmds, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(cmds[i].flags);
    free(cmds[i].values);
  }
  free(cmds);
}

/* Reads every command's --help into cmds (the caller's; free_cmds). */
static int collect(const char *spec_flags, comp_cmd_t **out, size_t *nout) {
  size_t n;
  const cli_command_t *table = cli_commands(&n);
  comp_cmd_t *cmds = calloc(n, sizeof *cmds);
  if (!cmds) return 1;
  for (size_t i = 0; i < n; i++) {
    cmds[i].cmd = &table[i];
    if (table[i].fn == cmd_help) {
      cmds[i].flags = strdup("");
      cmds[i].values = strdup("");
      continue;
    }
    char *text = help_text(&table[i]);
    if (!text) {
      fprintf(stderr,
              "trainyard completion: 'trainyard %s --help' failed, so its flags are unknown; "
              "run it to see why\n",
              table[i].name);
      free_cmds(cmds, n);
      return 1;
    }
    int rc = scan_usage(&cmds[i], text, spec_flags);
    free(text);
    if (rc) {
      fprintf(stderr, "trainyard completion: out of memory\n");
      free_cmds(cmds, n);
      return 1;
    }
  }
  *out = cmds;
  *nout = n;
  return 0;
}

int cmd_completion(int argc, char **argv) {
  if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    usage(stdout);
    return 0;
  }
  if (argc != 2 || (strcmp(argv[1], "bash") && strcmp(argv[1], "zsh"))) {
    if (argc == 2) fprintf(stderr, "trainyard completion: no script for the shell '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  bool zsh = !strcmp(argv[1], "zsh");
  char *flags = NULL, *values = NULL;
  size_t flen = 0, vlen = 0;
  spec_words_t spec = {open_memstream(&flags, &flen), open_memstream(&values, &vlen)};
  if (!spec.flags || !spec.values) {
    if (spec.flags) fclose(spec.flags);
    if (spec.values) fclose(spec.values);
    free(flags);
    free(values);
    fprintf(stderr, "trainyard completion: out of memory\n");
    return 1;
  }
  jobspec_fields_each(add_spec_field, &spec);
  fclose(spec.flags);
  fclose(spec.values);
  comp_cmd_t *cmds;
  size_t n;
  if (collect(flags, &cmds, &n)) {
    free(flags);
    free(values);
    return 1;
  }

  printf(
      "%s# %s completion for trainyard, written by `trainyard completion %s`;\n"
      "# `trainyard completion --help` says how to install it.\n",
      zsh ? "#compdef trainyard\n" : "", argv[1], argv[1]);
  print_data(cmds, n, flags, values, zsh);
  printf("\n%s", zsh ? g_zsh_functions : g_bash_functions);
  free(flags);
  free(values);
  free_cmds(cmds, n);
  return fflush(stdout) ? 1 : 0;
}
