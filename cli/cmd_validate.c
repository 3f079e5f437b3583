/* cmd_validate.c - trainyard validate: parse a job spec (file and/or dotted
 * flags), check every rule, print the normalized spec or every error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "cli/commands.h"
#include "common/json_util.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: trainyard validate [SPEC.json] [--dotted.field VALUE ...] [--json]\n"
          "       trainyard validate --rules | --fields\n\n"
          "Prints the normalized spec (defaults filled in) and exits 0, or prints every\n"
          "error as 'field: message' on stderr and exits 2. Flags override the file:\n"
          "  trainyard validate --model_path DIR --fsdp.memory_efficient_load true \\\n"
          "                     --allocation_mode static --world_size 2\n\n"
          "  --json            errors as the API error model on stdout\n"
          "  --no-check-paths  do not check that model_path and data.path exist\n"
          "  --rules           print the validation rules (markdown table)\n"
          "  --fields          print the spec fields with defaults and bounds\n");
}

static void print_rule(const char *id, const char *fields, const char *why, void *ctx) {
  (void)ctx;
  printf("| `%s` | %s | %s | %s |\n", id, fields, jobspec_rule_stage(id), why);
}

static void print_field(const char *path, const char *type, const char *dflt, const char *range,
                        const char *help, void *ctx) {
  (void)ctx;
  printf("| `%s` | %s | %s | %s | %s |\n", path, type, *dflt ? dflt : "", range, help);
}

static bool has_flag(int argc, char **argv, const char *flag) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], flag)) return true;
  return false;
}

int cmd_validate(int argc, char **argv) {
  if (has_flag(argc, argv, "--help") || has_flag(argc, argv, "-h")) {
    usage(stdout);
    return 0;
  }
  if (has_flag(argc, argv, "--rules")) {
    printf("| rule | fields | checked at | why |\n| --- | --- | --- | --- |\n");
    jobspec_rules_each(print_rule, NULL);
    return 0;
  }
  if (has_flag(argc, argv, "--fields")) {
    printf("| field | type | default | range | meaning |\n| --- | --- | --- | --- | --- |\n");
    jobspec_fields_each(print_field, NULL);
    return 0;
  }
  bool as_json = has_flag(argc, argv, "--json");
  bool check_paths = !has_flag(argc, argv, "--no-check-paths");
  static const char *const passthrough[] = {"json", "no-check-paths", NULL};

  jobspec_t spec;
  jobspec_init(&spec);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  jobspec_from_args(&spec, argc - 1, argv + 1, passthrough, &errs);
  /* Rules run even after field errors, so one pass reports everything;
   * not after a whole-document error (bad JSON, unreadable file), which
   * leaves nothing meaningful to check. */
  bool document_ok = true;
  for (size_t i = 0; i < errs.len; i++)
    if (!errs.items[i].field[0]) document_ok = false;
  if (document_ok) jobspec_validate(&spec, check_paths, &errs);
  if (errs.len) {
    if (as_json) {
      json_t *e = ty_error_json(TY_EINVAL, "the job spec is invalid", &errs);
      char *t = ty_json_dumps(e, JSON_INDENT(2));
      printf("%s\n", t);
      free(t);
      json_decref(e);
    } else {
      for (size_t i = 0; i < errs.len; i++)
        fprintf(stderr, "%s: %s\n", errs.items[i].field[0] ? errs.items[i].field : "spec",
                errs.items[i].message);
    }
    ty_errlist_clear(&errs);
    return 2;
  }
  char *text = jobspec_dumps(&spec, true);
  printf("%s\n", text);
  free(text);
  return 0;
}
