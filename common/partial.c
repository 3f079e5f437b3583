/* partial.c - removing half-written files when a signal stops the
 * process; see partial.h. A slot's path is written before the slot is
 * marked tracked, so the handler never reads one being written; it calls
 * only unlink, signal and raise, which are async-signal-safe. */
#include "common/partial.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 8
#define PATH_BYTES 4096

enum { SLOT_FREE, SLOT_FILLING, SLOT_TRACKED };

static char g_path[SLOTS][PATH_BYTES];
static atomic_int g_state[SLOTS];

int ty_partial_track(const char *path) {
  const size_t n = strlen(path);
  if (n >= PATH_BYTES) return -1;
  for (int i = 0; i < SLOTS; i++) {
    int expect = SLOT_FREE;
    if (atomic_compare_exchange_strong(&g_state[i], &expect, SLOT_FILLING)) {
      memcpy(g_path[i], path, n + 1);
      atomic_store(&g_state[i], SLOT_TRACKED);
      return i;
    }
  }
  return -1;
}

void ty_partial_untrack(int slot) {
  if (slot >= 0 && slot < SLOTS) atomic_store(&g_state[slot], SLOT_FREE);
}

static void on_stop(int sig) {
  for (int i = 0; i < SLOTS; i++)
    if (atomic_load(&g_state[i]) == SLOT_TRACKED) unlink(g_path[i]);
  /* Die of the signal, as without this handler: it is blocked while the
   * handler runs, and delivered with the default action on return. */
  signal(sig, SIG_DFL);
  raise(sig);
}

void ty_partial_cleanup_on_signals(void) {
  static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sigs[i], &sa, NULL);
  }
}
