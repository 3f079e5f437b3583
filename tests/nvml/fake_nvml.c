/* fake_nvml.c - libnvidia-ml.so.1 for the tests of trainyardd's GPU
 * memory rule on hosts without a GPU driver: the five NVML calls that
 * server/gpu_info.c makes, over GPUs whose sizes come from the
 * environment. TY_FAKE_NVML_MIB="512,256" shows two GPUs of 512 and 256
 * MiB; unset, nvmlInit_v2 fails as it does where no driver is loaded (9,
 * NVML_ERROR_DRIVER_NOT_LOADED). */
#include <stdlib.h>

typedef struct {
  unsigned long long total, free, used;
} fake_memory_t;

static unsigned long long g_mib[16];
static unsigned int g_n;

int nvmlInit_v2(void) {
  const char *v = getenv("TY_FAKE_NVML_MIB");
  if (!v || !*v) return 9;
  g_n = 0;
  while (*v && g_n < 16) {
    char *end;
    g_mib[g_n++] = strtoull(v, &end, 10);
    if (end == v || (*end && *end != ',')) return 1; /* not a list of numbers */
    v = *end ? end + 1 : end;
  }
  return 0;
}

int nvmlShutdown(void) {
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
  *count = g_n;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
  if (index >= g_n) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *device = &g_mib[index];
  return 0;
}

int nvmlDeviceGetMemoryInfo(void *device, fake_memory_t *memory) {
  const unsigned long long bytes = *(unsigned long long *)device << 20;
  *memory = (fake_memory_t){bytes, bytes, 0};
  return 0;
}
