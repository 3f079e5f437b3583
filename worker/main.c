/* main.c - trainyard-worker: one rank of a job. What it does comes from its
 * environment (DESIGN.md "Worker contract"); RANKENV_MODE picks the work:
 * train (the default) or load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsfault.h"
#include "common/beneath.h"
#include "common/partial.h"
#include "common/rankenv.h"
#include "worker/rank/rank_log.h"
#include "worker/rank/worker_load.h"
#include "worker/rank/worker_train.h"

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "--help"))) {
    printf("trainyard-worker 0.1.0: one rank of a trainyard job (started by trainyardd or "
           "'trainyard train')\n");
    return 0;
  }
  /* Stopped mid-save (a cancel, a failed peer), a rank removes the part of
   * the checkpoint or output it was writing. */
  ty_partial_cleanup_on_signals();
  /* The tests' disk faults (TY_TEST_FS_FAULTS) apply to ranks alone. */
  ty_fsfault_arm();
  /* Every model, data and output file is opened inside the roots the
   * launcher names (none: no confinement), before anything is read. */
  char why[1024];
  if (ty_beneath_roots_from_env(why, sizeof why) != 0) {
    fprintf(stderr, "trainyard-worker: %s\n", why);
    return 2;
  }
  const char *mode = getenv(rankenv_name(RANKENV_MODE));
  if (mode && !strcmp(mode, "load")) return wload_main();
  const char *spec = getenv(rankenv_name(RANKENV_SPEC));
  if (!spec || !*spec) {
    fprintf(stderr, "trainyard-worker: started without a job (run it through 'trainyard train' "
                    "or trainyardd)\n");
    return 2;
  }
  if (!mode || !*mode || !strcmp(mode, "train")) {
    worker_env_t e;
    char err[512];
    if (worker_env_read(&e, err, sizeof err) != 0 || rank_log_start(e.rank, err, sizeof err)) {
      fprintf(stderr, "trainyard-worker: %s\n", err);
      return 2;
    }
    return worker_train_main(&e);
  }
  fprintf(stderr, "trainyard-worker: unknown %s '%s' (use train or load)\n",
          rankenv_name(RANKENV_MODE), mode);
  return 2;
}
