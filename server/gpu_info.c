/* gpu_info.c - each GPU's memory from NVML; see gpu_info.h. Only the five
 * calls used are declared here, with NVML's documented types: nvmlReturn_t
 * an int (0 is success), nvmlDevice_t an opaque pointer, nvmlMemory_t three
 * unsigned long longs (total, free, used). */
#include "server/gpu_info.h"

#include <dlfcn.h>
#include <stdio.h>

typedef struct {
  unsigned long long total, free, used;
} nvml_memory_t;

typedef int (*nvml_void_fn)(void);
typedef int (*nvml_count_fn)(unsigned int *count);
typedef int (*nvml_handle_fn)(unsigned int index, void **device);
typedef int (*nvml_memory_fn)(void *device, nvml_memory_t *memory);

int gpu_info_query(gpu_info_t *out, char *why, size_t whylen) {
  *out = (gpu_info_t){0};
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, whylen, "libnvidia-ml.so.1, the driver's management library, is not found");
    return -1;
  }
  nvml_void_fn init = (nvml_void_fn)dlsym(h, "nvmlInit_v2");
  nvml_void_fn shutdown = (nvml_void_fn)dlsym(h, "nvmlShutdown");
  nvml_count_fn count = (nvml_count_fn)dlsym(h, "nvmlDeviceGetCount_v2");
  nvml_handle_fn handle = (nvml_handle_fn)dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
  nvml_memory_fn memory = (nvml_memory_fn)dlsym(h, "nvmlDeviceGetMemoryInfo");
  int rc = -1, r;
  unsigned int n = 0;
  if (!init || !shutdown || !count || !handle || !memory) {
    snprintf(why, whylen, "libnvidia-ml.so.1 lacks the NVML calls asked for");
  } else if ((r = init()) != 0) {
    snprintf(why, whylen, "NVML did not start (nvmlInit_v2 returned %d: no driver or no GPU)", r);
  } else {
    if ((r = count(&n)) != 0 || n == 0) {
      snprintf(why, whylen, "NVML reports no GPU (nvmlDeviceGetCount_v2 returned %d)", r);
    } else {
      rc = 0;
      for (unsigned int i = 0; i < n && !rc; i++) {
        void *dev = NULL;
        nvml_memory_t m = {0};
        if ((r = handle(i, &dev)) != 0 || (r = memory(dev, &m)) != 0) {
          snprintf(why, whylen, "NVML could not read GPU %u's memory (returned %d)", i, r);
          rc = -1;
          break;
        }
        if (m.total > out->max_total) out->max_total = m.total;
      }
      out->count = rc ? 0 : (int)n;
    }
    shutdown();
  }
  if (rc) *out = (gpu_info_t){0};
  dlclose(h);
  return rc;
}
