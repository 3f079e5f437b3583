/* memstat.c - VmRSS and VmHWM from /proc/self/status; see memstat.h. */
#include "common/memstat.h"

#include <stdio.h>
#include <string.h>

int memstat_read(memstat_t *m) {
  memset(m, 0, sizeof *m);
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) {
      m->rss_bytes = (uint64_t)kb * 1024;
      found++;
    } else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
      m->hwm_bytes = (uint64_t)kb * 1024;
      found++;
    }
  }
  fclose(f);
  return found == 2 ? 0 : -1;
}

int memstat_reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return -1;
  int ok = fputs("5", f) >= 0;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : -1;
}
