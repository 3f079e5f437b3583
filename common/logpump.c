/* logpump.c - a capped copy of a rank's output into its log; see
 * logpump.h. */
#include "common/logpump.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "common/log.h"

void ty_logpump(int in_fd, int out_fd, int64_t max, const char *who, ty_logpump_fn each,
                void *ctx) {
  char buf[65536];
  int64_t written = 0;
  bool noted = false;
  for (;;) {
    ssize_t n = read(in_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (each) each(ctx, buf, (size_t)n);
    int64_t room = max - written;
    size_t take = room <= 0 ? 0 : (size_t)(room < n ? room : n);
    if (take && write(out_fd, buf, take) == (ssize_t)take) written += (int64_t)take;
    if (take < (size_t)n && !noted) {
      char note[160];
      int len =
          snprintf(note, sizeof note, "\n[%s: log capped at %lld bytes; later output dropped]\n",
                   who, (long long)max);
      if (write(out_fd, note, (size_t)len) < 0) ty_warn("log note not written");
      noted = true;
    }
  }
}
