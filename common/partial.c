/* partial.c - removing half-written files when a signal stops the
 * process; see partial.h. A slot's folder and name are written before the
 * slot is marked tracked, so the handler never reads one being written; it
 * calls only unlinkat, signal and raise, which are async-signal-safe. The
 * folder is held open (inside the process's roots, common/beneath.h), so
 * the part is removed where it was made even if a link replaced a folder
 * on its path since. */
#include "common/partial.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/beneath.h"

#define SLOTS 8

enum { SLOT_FREE, SLOT_FILLING, SLOT_TRACKED };

static int g_dir[SLOTS];                 /* the part's folder, O_PATH */
static char g_name[SLOTS][NAME_MAX + 1]; /* the part's name in it */
static atomic_int g_state[SLOTS];

int ty_partial_track(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *name = slash ? slash + 1 : path;
  char dir[PATH_MAX];
  if (strlen(name) > NAME_MAX || !*name) return -1;
  if (snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1,
               slash ? (slash == path ? "/" : path) : ".") >= (int)sizeof dir)
    return -1;
  for (int i = 0; i < SLOTS; i++) {
    int expect = SLOT_FREE;
    if (atomic_compare_exchange_strong(&g_state[i], &expect, SLOT_FILLING)) {
      g_dir[i] = ty_beneath_open(dir, O_PATH | O_DIRECTORY, 0, NULL, 0);
      if (g_dir[i] < 0) { /* the part cannot be made there either */
        atomic_store(&g_state[i], SLOT_FREE);
        return -1;
      }
      memcpy(g_name[i], name, strlen(name) + 1);
      atomic_store(&g_state[i], SLOT_TRACKED);
      return i;
    }
  }
  return -1;
}

void ty_partial_untrack(int slot) {
  if (slot < 0 || slot >= SLOTS) return;
  int expect = SLOT_TRACKED;
  if (!atomic_compare_exchange_strong(&g_state[slot], &expect, SLOT_FILLING)) return;
  close(g_dir[slot]);
  atomic_store(&g_state[slot], SLOT_FREE);
}

void ty_partial_remove_all(void) {
  for (int i = 0; i < SLOTS; i++)
    if (atomic_load(&g_state[i]) == SLOT_TRACKED) unlinkat(g_dir[i], g_name[i], 0);
}

static void on_stop(int sig) {
  ty_partial_remove_all();
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
