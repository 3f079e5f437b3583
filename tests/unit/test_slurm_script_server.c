/* test_slurm_script_server.c - the batch script of the Slurm dispatcher
 * (server/slurm_script.h): what it asks sbatch for, and that nothing in it
 * is interpreted. Hostile names and paths (quotes, $(...), backquotes,
 * newlines, '%') are run through sh with a stand-in srun that records its
 * argv: each arrives as the very bytes it was, and no command hidden in
 * them ran. Operator options that cannot be one #SBATCH token are refused
 * naming the option. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "server/slurm_script.h"

static char g_tmp[256];

static int make_tmp(void **state) {
  (void)state;
  snprintf(g_tmp, sizeof g_tmp, "/tmp/ty-slurm-script-XXXXXX");
  return mkdtemp(g_tmp) ? 0 : -1;
}

static int remove_tmp(void **state) {
  (void)state;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  return system(cmd) == 0 ? 0 : -1;
}

static slurm_script_t base(void) {
  slurm_script_t in = {.job_id = "j-0123",
                       .job_name = "lora",
                       .attempt = 2,
                       .nodes = 2,
                       .ranks_per_node = 4,
                       .cpus_per_rank = 3,
                       .mem_mib = 2048,
                       .cuda = false,
                       .grace_s = 10,
                       .worker = "/opt/trainyard/bin/trainyard-worker",
                       .log_dir = "/srv/state/jobs/j-0123/attempt-2"};
  return in;
}

static bool has_line(const char *text, const char *line) {
  size_t n = strlen(line);
  for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, line, n) && (p[n] == '\n' || p[n] == '\0')) return true;
  return false;
}

static void test_asks_for_the_resources(void **state) {
  (void)state;
  slurm_script_t in = base();
  in.partition = "gpu";
  in.account = "ml";
  in.qos = "high";
  in.time_limit = "4:00:00";
  in.extra = " --constraint=a100 ;;--exclusive";
  in.cuda = true;
  char *text, msg[512];
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), 0);
  static const char *const lines[] = {
      "#!/bin/sh",
      "#SBATCH --job-name=trainyard-lora-j-0123",
      "#SBATCH --nodes=2",
      "#SBATCH --ntasks-per-node=4",
      "#SBATCH --cpus-per-task=3",
      "#SBATCH --mem=2048M",
      "#SBATCH --gpus-per-node=4",
      "#SBATCH --no-requeue",
      "#SBATCH --signal=TERM@10",
      "#SBATCH --partition=gpu",
      "#SBATCH --account=ml",
      "#SBATCH --qos=high",
      "#SBATCH --time=4:00:00",
      "#SBATCH --constraint=a100",
      "#SBATCH --exclusive",
      "exec srun --kill-on-bad-exit=1 --output='/srv/state/jobs/j-0123/attempt-2/rank-%t.log' -- "
      "'/opt/trainyard/bin/trainyard-worker'",
  };
  for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
    if (!has_line(text, lines[i])) fail_msg("missing line: %s\nin:\n%s", lines[i], text);
  free(text);
  /* CPU ranks ask for no GPU, and no memory where the bound is unknown. */
  in = base();
  in.mem_mib = 0;
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), 0);
  assert_null(strstr(text, "--gpus-per-node"));
  assert_null(strstr(text, "--mem"));
  assert_null(strstr(text, "--partition"));
  free(text);
}

/* Runs script with a stand-in srun first in PATH that writes its
 * arguments, NUL-separated, to args; returns sh's exit status. */
static int run_script(const char *script, const char *bin, const char *args) {
  char path[1024];
  snprintf(path, sizeof path, "PATH=%s:/usr/bin:/bin", bin);
  char out[1024];
  snprintf(out, sizeof out, "TY_ARGS=%s", args);
  pid_t pid = fork();
  if (pid == 0) {
    char *envp[] = {path, out, NULL};
    execle("/bin/sh", "sh", script, (char *)NULL, envp);
    _exit(127);
  }
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_nothing_is_interpreted(void **state) {
  (void)state;
  char bin[300], args[300], script[300], pwned[300], dir[2048], worker[2048];
  snprintf(bin, sizeof bin, "%s/bin", g_tmp);
  mkdir(bin, 0755);
  char srun[400];
  snprintf(srun, sizeof srun, "%s/srun", bin);
  FILE *f = fopen(srun, "w");
  assert_non_null(f);
  fputs("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done > \"$TY_ARGS\"\n", f);
  fclose(f);
  chmod(srun, 0755);
  snprintf(args, sizeof args, "%s/args", g_tmp);
  snprintf(pwned, sizeof pwned, "%s/PWNED", g_tmp);
  /* Every way a shell could be made to run something. */
  snprintf(dir, sizeof dir, "%s/a b'c\"$(touch %s)`touch %s`;touch %s\n%%j%%%%t$HOME", g_tmp, pwned,
           pwned, pwned);
  snprintf(worker, sizeof worker, "%s/w'; touch %s; '$(touch %s)", g_tmp, pwned, pwned);
  slurm_script_t in = base();
  in.job_name = "x'$(touch /tmp/x)\n#SBATCH --wrap=touch";
  in.log_dir = dir;
  in.worker = worker;
  char *text, msg[512];
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), 0);
  /* The name keeps only safe characters: one line, no second option. */
  assert_true(
      has_line(text, "#SBATCH --job-name=trainyard-x___touch__tmp_x___SBATCH_--wrap_touch-j-0123"));
  assert_null(strstr(text, "#SBATCH --wrap"));
  snprintf(script, sizeof script, "%s/sbatch.sh", g_tmp);
  f = fopen(script, "w");
  fputs(text, f);
  fclose(f);
  free(text);
  assert_int_equal(run_script(script, bin, args), 0);
  struct stat st;
  assert_int_not_equal(stat(pwned, &st), 0); /* nothing ran */
  f = fopen(args, "rb");
  assert_non_null(f);
  char got[4096];
  size_t n = fread(got, 1, sizeof got, f);
  fclose(f);
  /* srun's words, exactly: the pattern with every '%' of the path doubled. */
  char *pattern = slurm_output_pattern(dir, "/rank-%t.log");
  char want[4096];
  size_t w = 0;
  const char *words[] = {"--kill-on-bad-exit=1", NULL, "--", worker};
  char opt[2048];
  snprintf(opt, sizeof opt, "--output=%s", pattern);
  words[1] = opt;
  for (size_t i = 0; i < 4; i++) {
    size_t len = strlen(words[i]) + 1;
    memcpy(want + w, words[i], len);
    w += len;
  }
  assert_int_equal(n, w);
  assert_memory_equal(got, want, w);
  assert_non_null(strstr(pattern, "%%j%%%%t$HOME/rank-%t.log"));
  free(pattern);
}

static void test_refusals(void **state) {
  (void)state;
  char *text, msg[512];
  slurm_script_t in = base();
  in.partition = "a b";
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "--slurm_partition \"a b\" cannot be written as an #SBATCH line"));
  in = base();
  in.time_limit = "1:00\n#SBATCH --wrap=x";
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "--slurm_time"));
  in = base();
  in.extra = "--exclusive;rm -rf /";
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "--slurm_extra option \"rm -rf /\" is not one sbatch option"));
  in = base();
  in.extra = "--comment='a b'";
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), TY_EINVAL);
  in = base();
  in.log_dir = "/srv/a\\b";
  assert_int_equal(slurm_script(&in, &text, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "backslash"));
  assert_null(text);
}

static void test_quote(void **state) {
  (void)state;
  char *q = slurm_sh_quote("it's");
  assert_string_equal(q, "'it'\\''s'");
  free(q);
  q = slurm_sh_quote("");
  assert_string_equal(q, "''");
  free(q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_asks_for_the_resources),
      cmocka_unit_test_setup_teardown(test_nothing_is_interpreted, make_tmp, remove_tmp),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_quote),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
