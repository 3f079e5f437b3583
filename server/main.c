/* main.c - trainyardd: options, recovery, the REST front end and the
 * scheduler; runs until SIGTERM or SIGINT, then stops cleanly. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/config.h"
#include "server/grpc.h"
#include "server/dispatcher.h"
#include "server/recovery.h"
#include "server/rest.h"
#include "server/scheduler.h"
#include "server/service.h"

/* Where ranks send reports: the bound port on a host they can reach. */
static void report_base(const char *listen, int port, char *out, size_t size) {
  char host[256];
  if (listen[0] == '[') {
    const char *end = strchr(listen, ']');
    snprintf(host, sizeof host, "[%.*s]", end ? (int)(end - listen - 1) : 0, listen + 1);
    if (!strcmp(host, "[::]")) snprintf(host, sizeof host, "[::1]");
  } else {
    const char *colon = strrchr(listen, ':');
    snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - listen) : 0, listen);
    if (!*host || !strcmp(host, "0.0.0.0")) snprintf(host, sizeof host, "127.0.0.1");
  }
  snprintf(out, size, "http://%s:%d", host, port);
}

int main(int argc, char **argv) {
  /* Submit and validate check a JSONL file's examples with the tokenizer:
   * jobspec_jsonl_check, installed by the ty_jsonl_rule object linked in. */
  srv_config_t cfg;
  srv_config_init(&cfg);
  char msg[1024];
  bool help;
  if (srv_config_load(&cfg, argc, argv, &help, msg, sizeof msg)) {
    fprintf(stderr, "trainyardd: %s\n", msg);
    srv_config_free(&cfg);
    return 2;
  }
  if (help) {
    srv_config_usage(stdout);
    srv_config_free(&cfg);
    return 0;
  }
  if (srv_config_check(&cfg, msg, sizeof msg)) {
    fprintf(stderr, "trainyardd: %s\n", msg);
    srv_config_free(&cfg);
    return 2;
  }
  /* Signals are taken by sigwait below; every thread inherits the mask
   * (rank processes get a clean one in dispatch). */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  svc_t *svc = NULL;
  rest_t *rest = NULL;
  gsrv_t *grpc = NULL;
  sched_t *sched = NULL;
  int rc = svc_open(&cfg, &svc, msg, sizeof msg);
  if (rc) goto fail;
  dispatcher_t slurm, *disp = &dispatch_local;
  if (!strcmp(cfg.dispatcher, "slurm")) {
    dispatch_slurm_init(&slurm, &cfg);
    disp = &slurm;
  }
  recovery_adopt_t *adopt = NULL;
  size_t nadopt = 0;
  if ((rc = recovery_run(svc, &cfg, disp, &adopt, &nadopt)) < 0) {
    snprintf(msg, sizeof msg, "recovery of the previous state failed (see the log)");
    goto fail;
  }
  int port;
  if ((rc = rest_start(svc, &cfg, &rest, &port, msg, sizeof msg))) goto fail;
  char base[300];
  report_base(cfg.listen, port, base, sizeof base);
  /* Ranks on other hosts reach this server where the operator says. */
  char ranks_base[300];
  snprintf(ranks_base, sizeof ranks_base, "%s", *cfg.advertise_url ? cfg.advertise_url : base);
  for (size_t n = strlen(ranks_base); n && ranks_base[n - 1] == '/';) ranks_base[--n] = '\0';
  if ((rc = sched_create(svc, &cfg, disp, ranks_base, &sched, msg, sizeof msg))) goto fail;
  svc_set_scheduler(svc, sched);
  /* Attempts still running in the cluster are watched again; one that
   * cannot be is failed (a restart queues it again where allowed). */
  for (size_t i = 0; i < nadopt; i++)
    if (sched_adopt(sched, adopt[i].id, adopt[i].attempt, adopt[i].pid, adopt[i].start))
      svc_transition(svc, adopt[i].id, DB_MASK_ACTIVE, DB_JOB_FAILED,
                     "trainyardd restarted and could not watch the attempt again", NULL, NULL);
  free(adopt);
  if ((rc = sched_start(sched))) {
    snprintf(msg, sizeof msg, "cannot start the scheduler thread");
    goto fail;
  }
  if (*cfg.grpc_listen) {
    int gport;
    if ((rc = gsrv_start(svc, &cfg, cfg.grpc_listen, &grpc, &gport, msg, sizeof msg))) goto fail;
    ty_info("trainyardd gRPC listening on %s (port %d)", cfg.grpc_listen, gport);
  }
  ty_info(
      "trainyardd listening on %s (db %s, %lld CPU slots, %lld GPUs, auth %s, dispatcher %s, "
      "ranks report to %s)",
      base, cfg.db, (long long)cfg.cpu_slots, (long long)cfg.gpus, *cfg.tokens ? "on" : "off",
      cfg.dispatcher, ranks_base);
  int sig = 0;
  sigdelset(&set, SIGPIPE);
  sigwait(&set, &sig);
  ty_info("trainyardd: signal %d, shutting down", sig);
  gsrv_stop(grpc);
  rest_stop(rest);
  sched_shutdown(sched);
  sched_free(sched);
  svc_close(svc);
  srv_config_free(&cfg);
  return 0;
fail:
  fprintf(stderr, "trainyardd: %s\n", msg);
  gsrv_stop(grpc);
  rest_stop(rest);
  if (sched) {
    sched_shutdown(sched);
    sched_free(sched);
  }
  svc_close(svc);
  srv_config_free(&cfg);
  return 1;
}
