/* preempt.c - SIGTERM as a request to stop at the next step boundary, the
 * ranks agreeing; see preempt.h. */
#include "worker/rank/preempt.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/partial.h"
#include "common/rankproc.h"

static volatile sig_atomic_t g_term, g_stepping;
static bool g_installed;

static void on_term(int sig) {
  (void)sig;
  if (!g_stepping) { /* nothing to keep yet; no half-written file left either */
    ty_partial_remove_all();
    _exit(RANKPROC_EXIT_PREEMPTED);
  }
  g_term = 1;
}

void preempt_install(void) {
  if (g_installed) return;
  struct sigaction sa = {.sa_handler = on_term, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  g_installed = true;
}

int preempt_at_step(comm_t *comm, bool *stop, char *err, size_t errlen) {
  g_stepping = 1;
  preempt_install();
  /* A rank that got the signal stops them all: the flags are summed. */
  float flag = g_term ? 1.0f : 0.0f;
  if (comm && comm_world_size(comm) > 1 && comm_all_reduce(comm, &flag, 1)) {
    snprintf(err, errlen, "agreeing on a stop: %s", comm_error(comm));
    return TY_EUNAVAILABLE;
  }
  *stop = flag > 0.0f;
  return 0;
}
