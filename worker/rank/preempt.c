/* preempt.c - SIGTERM as a request to stop at the next step boundary, the
 * ranks agreeing; see preempt.h. */
#include "worker/rank/preempt.h"

#include <signal.h>
#include <stdio.h>

#include "common/errors.h"

static volatile sig_atomic_t g_term;
static bool g_installed;

static void on_term(int sig) {
  (void)sig;
  g_term = 1;
}

int preempt_at_step(comm_t *comm, bool *stop, char *err, size_t errlen) {
  if (!g_installed) {
    struct sigaction sa = {.sa_handler = on_term, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    g_installed = true;
  }
  /* A rank that got the signal stops them all: the flags are summed. */
  float flag = g_term ? 1.0f : 0.0f;
  if (comm && comm_world_size(comm) > 1 && comm_all_reduce(comm, &flag, 1)) {
    snprintf(err, errlen, "agreeing on a stop: %s", comm_error(comm));
    return TY_EUNAVAILABLE;
  }
  *stop = flag > 0.0f;
  return 0;
}
