/* gpu_info.h - what this host's GPUs hold, as the driver's management
 * library (NVML) reports it: no CUDA context is made, and trainyardd links
 * no GPU library (NVML is loaded with dlopen), so it runs where there is
 * none. */
#ifndef TRAINYARD_SERVER_GPU_INFO_H
#define TRAINYARD_SERVER_GPU_INFO_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int count;          /* GPUs NVML reports */
  uint64_t max_total; /* the largest one's memory, bytes */
} gpu_info_t;

/* Asks NVML (libnvidia-ml.so.1). Returns 0 and fills out, or -1 with why
 * (no driver library, no GPU, a call that failed) in why. */
int gpu_info_query(gpu_info_t *out, char *why, size_t whylen);

#endif
