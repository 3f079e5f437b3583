/* memstat.h - the process's host memory figures, as the kernel counts them.
 *
 * The host peak trainyard reports is VmHWM (the resident-set high-water
 * mark): it counts touched pages of mapped files too, so an mmap read in
 * full is no saving, and it cannot be fooled by freeing before a sample. */
#ifndef TY_COMMON_MEMSTAT_H
#define TY_COMMON_MEMSTAT_H

#include <stdint.h>

typedef struct {
  uint64_t rss_bytes;  /* VmRSS: resident now */
  uint64_t hwm_bytes;  /* VmHWM: resident high-water mark */
} memstat_t;

/* Reads /proc/self/status. Returns 0, or -1 where it cannot be read (the
 * fields are then 0). */
int memstat_read(memstat_t *m);

/* Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs), so
 * that a phase can be measured on its own. Returns 0, or -1 where the kernel
 * does not allow it. */
int memstat_reset_peak(void);

#endif
