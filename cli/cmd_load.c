/* cmd_load.c - trainyard load SPEC|--dotted.flags: starts world_size local
 * ranks that only load their shards (TRAINYARD_MODE=load), then prints one
 * JSON line per rank with what it read, held and how long it took. It
 * answers "will this checkpoint fit, and what will each rank hold?". */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "api/jobspec.h"
#include "cli/commands.h"
#include "common/xalloc.h"

typedef struct {
  pid_t pid;
  int out_fd; /* read end of the rank's stdout */
  char *buf;  /* everything it wrote to stdout */
  size_t len, cap;
  int status; /* from waitpid */
} rank_proc_t;

static void load_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard load [SPEC.json] [--dotted.field value ...]\n"
          "Starts world_size local ranks that load their shards of model_path (or initialise\n"
          "them, with init_from_scratch) and exit. Prints one JSON line per rank:\n"
          "  rank, world_size, path, status, bytes_loaded, bytes_total, host_peak_bytes,\n"
          "  device_peak_bytes, load_seconds, gb_per_s, message\n"
          "Exit status 0 when every rank loaded, 1 when one failed (its reason on stderr),\n"
          "2 for an invalid spec. Example:\n"
          "  trainyard load --model_path models/tiny --world_size 2 "
          "--fsdp.memory_efficient_load true\n");
}

/* The worker binary: $TRAINYARD_WORKER, else beside this executable, else
 * ../worker/ of it (the build tree). */
static int find_worker(char *out, size_t n) {
  const char *env = getenv("TRAINYARD_WORKER");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return access(out, X_OK);
  }
  char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) return -1;
  self[k] = 0;
  char *slash = strrchr(self, '/');
  if (!slash) return -1;
  *slash = 0;
  snprintf(out, n, "%s/trainyard-worker", self);
  if (!access(out, X_OK)) return 0;
  snprintf(out, n, "%s/../worker/trainyard-worker", self);
  return access(out, X_OK);
}

static int spawn_rank(const char *worker, const char *spec_path, const char *job_id, int rank,
                      int world, rank_proc_t *p) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC)) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0); /* its own process group, as the worker contract says */
    dup2(fds[1], STDOUT_FILENO);
    char num[32];
    setenv("TRAINYARD_SPEC", spec_path, 1);
    setenv("TRAINYARD_MODE", "load", 1);
    setenv("TRAINYARD_JOB_ID", job_id, 1);
    setenv("TRAINYARD_ATTEMPT", "1", 1);
    snprintf(num, sizeof num, "%d", rank);
    setenv("TRAINYARD_RANK", num, 1);
    snprintf(num, sizeof num, "%d", world);
    setenv("TRAINYARD_WORLD_SIZE", num, 1);
    char rdv[96];
    snprintf(rdv, sizeof rdv, "shm:%s", job_id);
    setenv("TRAINYARD_RENDEZVOUS", rdv, 1);
    unsetenv("TRAINYARD_REPORT_URL"); /* reports come back on stdout */
    execl(worker, worker, (char *)NULL);
    fprintf(stderr, "trainyard load: cannot start %s: %s\n", worker, strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  p->pid = pid;
  p->out_fd = fds[0];
  return 0;
}

/* Reads every rank's stdout until all have closed it. */
static void drain(rank_proc_t *r, int n) {
  struct pollfd *pf = xcalloc((size_t)n, sizeof *pf);
  int open_fds = n;
  while (open_fds > 0) {
    for (int i = 0; i < n; i++) {
      pf[i].fd = r[i].out_fd;
      pf[i].events = POLLIN;
    }
    if (poll(pf, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < n; i++) {
      if (r[i].out_fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t k = read(r[i].out_fd, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        close(r[i].out_fd);
        r[i].out_fd = -1;
        open_fds--;
        continue;
      }
      if (r[i].len + (size_t)k + 1 > r[i].cap) {
        r[i].cap = (r[i].len + (size_t)k + 1) * 2;
        r[i].buf = xrealloc(r[i].buf, r[i].cap);
      }
      memcpy(r[i].buf + r[i].len, buf, (size_t)k);
      r[i].len += (size_t)k;
      r[i].buf[r[i].len] = 0;
    }
  }
  free(pf);
}

/* The rank's last report (a JSON object line), or NULL. */
static json_t *last_report(const rank_proc_t *p) {
  json_t *last = NULL;
  if (!p->buf) return NULL;
  char *save = NULL, *copy = xstrdup(p->buf);
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    json_t *j = json_loads(line, 0, NULL);
    if (json_is_object(j)) {
      json_decref(last);
      last = j;
    } else {
      json_decref(j);
    }
  }
  free(copy);
  return last;
}

/* Prints rank r's line; returns 0 when it loaded. */
static int print_rank(const jobspec_t *s, int rank, const rank_proc_t *p) {
  json_t *rep = last_report(p);
  const char *phase = json_string_value(json_object_get(rep, "phase"));
  const char *msg = json_string_value(json_object_get(rep, "message"));
  bool ok = WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0 && phase && !strcmp(phase, "done");
  char why[512];
  if (!ok && (!msg || !*msg)) {
    if (WIFSIGNALED(p->status))
      snprintf(why, sizeof why, "killed by signal %d (%s)%s", WTERMSIG(p->status),
               strsignal(WTERMSIG(p->status)),
               WTERMSIG(p->status) == SIGKILL ? ": out of memory?" : "");
    else
      snprintf(why, sizeof why, "exited with status %d without a report",
               WIFEXITED(p->status) ? WEXITSTATUS(p->status) : -1);
    msg = why;
  }
  double secs = json_real_value(json_object_get(rep, "load_seconds"));
  json_int_t loaded = json_integer_value(json_object_get(rep, "bytes_loaded"));
  json_t *out = json_pack(
      "{s:i,s:i,s:s,s:s,s:I,s:I,s:I,s:I,s:f,s:f,s:s}", "rank", rank, "world_size", s->world_size,
      "path",
      s->init_from_scratch            ? "init_from_scratch"
      : s->fsdp.memory_efficient_load ? "memory_efficient"
                                      : "standard",
      "status", ok ? "ok" : "failed", "bytes_loaded", loaded, "bytes_total",
      json_integer_value(json_object_get(rep, "bytes_total")), "host_peak_bytes",
      json_integer_value(json_object_get(rep, "host_peak_bytes")), "device_peak_bytes",
      json_integer_value(json_object_get(rep, "device_peak_bytes")), "load_seconds", secs,
      "gb_per_s", secs > 0 ? (double)loaded / secs / 1e9 : 0.0, "message", msg ? msg : "");
  char *line = json_dumps(out, JSON_COMPACT);
  printf("%s\n", line);
  free(line);
  json_decref(out);
  if (!ok) fprintf(stderr, "trainyard load: rank %d failed: %s\n", rank, msg);
  json_decref(rep);
  return ok ? 0 : -1;
}

int cmd_load(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      load_usage(stdout);
      return 0;
    }
  }
  jobspec_t s;
  jobspec_init(&s);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = jobspec_from_args(&s, argc - 1, argv + 1, NULL, &errs);
  if (!rc) rc = jobspec_validate(&s, true, &errs);
  if (rc) {
    for (size_t i = 0; i < errs.len; i++)
      fprintf(stderr, "trainyard load: %s: %s\n",
              *errs.items[i].field ? errs.items[i].field : "spec", errs.items[i].message);
    ty_errlist_clear(&errs);
    return 2;
  }
  char worker[PATH_MAX + 64];
  if (find_worker(worker, sizeof worker)) {
    fprintf(stderr,
            "trainyard load: trainyard-worker not found beside this binary (set "
            "TRAINYARD_WORKER to its path)\n");
    return 1;
  }
  /* The normalized spec, for the ranks. */
  char spec_path[] = "/tmp/trainyard-load-spec-XXXXXX";
  int fd = mkstemp(spec_path);
  json_t *j = jobspec_to_json(&s);
  if (fd < 0 || json_dumpfd(j, fd, JSON_COMPACT)) {
    fprintf(stderr, "trainyard load: cannot write the spec for the ranks: %s\n", strerror(errno));
    json_decref(j);
    if (fd >= 0) close(fd), unlink(spec_path);
    return 1;
  }
  json_decref(j);
  close(fd);
  char job_id[64];
  snprintf(job_id, sizeof job_id, "load-%d", (int)getpid());
  int world = s.world_size;
  rank_proc_t *r = xcalloc((size_t)world, sizeof *r);
  int started = 0;
  for (; started < world; started++) {
    if (spawn_rank(worker, spec_path, job_id, started, world, &r[started])) {
      fprintf(stderr, "trainyard load: cannot start rank %d: %s\n", started, strerror(errno));
      break;
    }
  }
  drain(r, started);
  for (int i = 0; i < started; i++)
    while (waitpid(r[i].pid, &r[i].status, 0) < 0 && errno == EINTR) {
    }
  unlink(spec_path);
  int failed = started < world;
  for (int i = 0; i < started; i++) failed |= print_rank(&s, i, &r[i]) != 0;
  for (int i = 0; i < started; i++) free(r[i].buf);
  free(r);
  return failed ? 1 : 0;
}
