/* sim_mem.c - the simulated device's memory and copies. Device memory is
 * one reserved mapping handed out upwards and never reused: each
 * allocation is 256-byte aligned and ends within 256 bytes of a page that
 * stays inaccessible, and is made inaccessible again when freed, so that an
 * overrun or a use after free faults where it happens (the fault handler
 * names the allocation). Pinned host memory is tracked so that copies from
 * and to it stay asynchronous, as on a GPU. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudasim.h"

#define ARENA_BYTES ((size_t)1 << 40)
#define ALIGN 256
#define GRANULE 512 /* what cudaMemGetInfo counts an allocation as */

typedef struct {
  char *p;
  size_t bytes;
  char *region; /* the mapped pages, from region to the guard page */
  size_t region_bytes;
  int device; /* -1 for pinned host memory */
} alloc_t;

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static char *g_arena, *g_next;
static size_t g_page;
static alloc_t *g_allocs; /* device allocations, by address (handed out upwards) */
static size_t g_nallocs, g_cap;
static alloc_t *g_pinned;
static size_t g_npinned, g_pcap;
static size_t g_used[64]; /* per device, in GRANULE units' bytes */
static size_t g_total;

static alloc_t *find(alloc_t *v, size_t n, const void *p);

static void on_fault(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  char *a = si->si_addr;
  if (g_arena && a >= g_arena && a < g_arena + ARENA_BYTES) {
    char msg[256];
    alloc_t *in = find(g_allocs, g_nallocs, a); /* no lock: the process is dying anyway */
    int n = in ? snprintf(msg, sizeof msg,
                          "cudasim: host code touched device memory (offset %zu of an allocation "
                          "of %zu bytes): a device pointer dereferenced on the host\n",
                          (size_t)(a - in->p), in->bytes)
               : snprintf(msg, sizeof msg,
                          "cudasim: device memory fault at arena offset %zu: an access past the "
                          "end of a device allocation, or into freed device memory\n",
                          (size_t)(a - g_arena));
    if (n > 0) (void)!write(2, msg, (size_t)n);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void arena_init(void) {
  if (g_arena) return;
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  g_arena = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (g_arena == MAP_FAILED) sim_fatal("cannot reserve the device memory mapping");
  g_next = g_arena;
  const char *mib = getenv("TY_SIM_MEM_MIB");
  g_total = (size_t)(mib && *mib ? atol(mib) : 16384) << 20;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
}

static size_t granules(size_t bytes) {
  return (bytes + GRANULE - 1) / GRANULE * GRANULE;
}

/* The allocation holding p, or NULL. */
static alloc_t *find(alloc_t *v, size_t n, const void *p) {
  const char *c = p;
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < v[mid].p)
      hi = mid;
    else if (c >= v[mid].p + (v[mid].bytes ? v[mid].bytes : 1))
      lo = mid + 1;
    else
      return &v[mid];
  }
  return NULL;
}

int sim_is_device_range(const void *p, size_t n) {
  pthread_mutex_lock(&g_mem_lock);
  alloc_t *a = find(g_allocs, g_nallocs, p);
  int ok = a && (const char *)p + n <= a->p + a->bytes;
  pthread_mutex_unlock(&g_mem_lock);
  return ok;
}

int sim_is_pinned(const void *p) {
  pthread_mutex_lock(&g_mem_lock);
  int ok = find(g_pinned, g_npinned, p) != NULL;
  pthread_mutex_unlock(&g_mem_lock);
  return ok;
}

void sim_require_device(const void *p, size_t n, const char *what) {
  if (!sim_is_device_range(p, n))
    sim_fatal("%s: %zu bytes at %p are not inside one live device allocation", what, n, p);
}

static void grow(alloc_t **v, size_t *cap, size_t need) {
  if (need <= *cap) return;
  size_t c = *cap ? *cap * 2 : 256;
  alloc_t *nv = realloc(*v, c * sizeof **v);
  if (!nv) sim_fatal("out of host memory");
  *v = nv;
  *cap = c;
}

cudaError_t cudaMalloc(void **out, size_t bytes) {
  *out = NULL;
  int ndev;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) return cudaErrorNoDevice;
  int dev = sim_current_device();
  sim_lock(); /* whether ops run decides the new memory's access */
  int executing = sim_executing();
  pthread_mutex_lock(&g_mem_lock);
  arena_init();
  if (g_used[dev] + granules(bytes) > g_total) {
    pthread_mutex_unlock(&g_mem_lock);
    sim_unlock();
    sim_set_error(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  size_t pages = (bytes + g_page - 1) / g_page;
  if (!pages) pages = 1;
  size_t region_bytes = pages * g_page;
  if ((size_t)(g_next - g_arena) + region_bytes + g_page > ARENA_BYTES)
    sim_fatal("the device memory mapping is used up (%zu bytes handed out)",
              (size_t)(g_next - g_arena));
  char *region = g_next;
  g_next += region_bytes + g_page; /* the page after stays PROT_NONE */
  if (mprotect(region, region_bytes, PROT_READ | PROT_WRITE))
    sim_fatal("mprotect of %zu bytes failed", region_bytes);
  size_t rounded = (bytes + ALIGN - 1) / ALIGN * ALIGN;
  alloc_t a = {region + region_bytes - rounded, bytes, region, region_bytes, dev};
  /* Never-written device memory reads as NaN-like garbage, not zeros. */
  memset(a.p, 0xff, rounded);
  if (!executing) mprotect(region, region_bytes, PROT_NONE);
  grow(&g_allocs, &g_cap, g_nallocs + 1);
  g_allocs[g_nallocs++] = a;
  g_used[dev] += granules(bytes);
  pthread_mutex_unlock(&g_mem_lock);
  sim_unlock();
  *out = a.p;
  return cudaSuccess;
}

void sim_device_access(int on) {
  pthread_mutex_lock(&g_mem_lock);
  for (size_t i = 0; i < g_nallocs; i++)
    if (mprotect(g_allocs[i].region, g_allocs[i].region_bytes,
                 on ? PROT_READ | PROT_WRITE : PROT_NONE))
      sim_fatal("mprotect of a device allocation failed");
  pthread_mutex_unlock(&g_mem_lock);
}

cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  sim_device_sync(); /* cudaFree waits for the device, as on a GPU */
  pthread_mutex_lock(&g_mem_lock);
  alloc_t *a = find(g_allocs, g_nallocs, p);
  if (!a || a->p != p) {
    pthread_mutex_unlock(&g_mem_lock);
    sim_fatal("cudaFree(%p): not the start of a live device allocation", p);
  }
  mprotect(a->region, a->region_bytes, PROT_NONE);
  madvise(a->region, a->region_bytes, MADV_DONTNEED);
  g_used[a->device] -= granules(a->bytes);
  size_t i = (size_t)(a - g_allocs);
  memmove(a, a + 1, (g_nallocs - i - 1) * sizeof *a);
  g_nallocs--;
  pthread_mutex_unlock(&g_mem_lock);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  int ndev;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) return cudaErrorNoDevice;
  pthread_mutex_lock(&g_mem_lock);
  arena_init();
  size_t used = g_used[sim_current_device()];
  *total_bytes = g_total;
  *free_bytes = g_total - used;
  pthread_mutex_unlock(&g_mem_lock);
  return cudaSuccess;
}

/* Pinned memory: ordinary host memory, remembered by address (sorted). */
cudaError_t cudaHostAlloc(void **out, size_t bytes, unsigned flags) {
  (void)flags;
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1)) return cudaErrorMemoryAllocation;
  alloc_t a = {p, bytes ? bytes : 1, p, bytes, -1};
  pthread_mutex_lock(&g_mem_lock);
  grow(&g_pinned, &g_pcap, g_npinned + 1);
  size_t i = g_npinned;
  while (i > 0 && g_pinned[i - 1].p > a.p) i--;
  memmove(&g_pinned[i + 1], &g_pinned[i], (g_npinned - i) * sizeof a);
  g_pinned[i] = a;
  g_npinned++;
  pthread_mutex_unlock(&g_mem_lock);
  *out = p;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **out, size_t bytes) {
  return cudaHostAlloc(out, bytes, cudaHostAllocDefault);
}
cudaError_t cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  sim_device_sync(); /* no queued copy may still read or write it */
  pthread_mutex_lock(&g_mem_lock);
  alloc_t *a = find(g_pinned, g_npinned, p);
  if (!a || a->p != p) {
    pthread_mutex_unlock(&g_mem_lock);
    sim_fatal("cudaFreeHost(%p): not a pinned allocation", p);
  }
  size_t i = (size_t)(a - g_pinned);
  memmove(a, a + 1, (g_npinned - i - 1) * sizeof *a);
  g_npinned--;
  pthread_mutex_unlock(&g_mem_lock);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p) {
  memset(at, 0, sizeof *at);
  pthread_mutex_lock(&g_mem_lock);
  alloc_t *a = find(g_allocs, g_nallocs, p);
  if (a) {
    at->type = cudaMemoryTypeDevice;
    at->device = a->device;
    at->devicePointer = (void *)p;
  } else if (find(g_pinned, g_npinned, p)) {
    at->type = cudaMemoryTypeHost;
    at->hostPointer = (void *)p;
    at->devicePointer = (void *)p;
  }
  pthread_mutex_unlock(&g_mem_lock);
  return cudaSuccess;
}

/* ---- copies and sets ---- */

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
  int value;   /* memset; -1 for a copy */
  void *owned; /* a snapshot of a pageable source, freed with the op */
} copy_t;

static int copy_run(void *arg) {
  copy_t *c = arg;
  if (c->value >= 0)
    memset(c->dst, c->value, c->bytes);
  else
    memmove(c->dst, c->src, c->bytes);
  return 1;
}
static void copy_drop(void *arg) {
  copy_t *c = arg;
  free(c->owned);
  free(c);
}

static cudaError_t check_kind(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                              const char *what) {
  char buf[96];
  switch (kind) {
    case cudaMemcpyHostToDevice:
      snprintf(buf, sizeof buf, "%s host to device: the destination", what);
      sim_require_device(dst, bytes, buf);
      break;
    case cudaMemcpyDeviceToHost:
      snprintf(buf, sizeof buf, "%s device to host: the source", what);
      sim_require_device(src, bytes, buf);
      break;
    case cudaMemcpyDeviceToDevice:
      snprintf(buf, sizeof buf, "%s device to device: the destination", what);
      sim_require_device(dst, bytes, buf);
      snprintf(buf, sizeof buf, "%s device to device: the source", what);
      sim_require_device(src, bytes, buf);
      break;
    default:
      sim_fatal("%s: copy kind %d is not simulated (name the direction)", what, (int)kind);
  }
  return cudaSuccess;
}

/* Queues a copy on s. A pageable source is read now (CUDA stages it before
 * returning); a pageable destination is written before returning (the copy
 * is synchronous for the host); pinned memory is read or written when the
 * stream gets there. */
static cudaError_t queue_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                              cudaStream_t s, const char *what) {
  if (!bytes) return cudaSuccess;
  check_kind(dst, src, bytes, kind, what);
  copy_t *c = calloc(1, sizeof *c);
  if (!c) return cudaErrorMemoryAllocation;
  c->dst = dst, c->src = src, c->bytes = bytes, c->value = -1;
  if (kind == cudaMemcpyHostToDevice && !sim_is_pinned(src)) {
    if (!(c->owned = malloc(bytes))) {
      free(c);
      return cudaErrorMemoryAllocation;
    }
    memcpy(c->owned, src, bytes);
    c->src = c->owned;
  }
  sim_enqueue(s, what, copy_run, c, copy_drop);
  if (kind == cudaMemcpyDeviceToHost && !sim_is_pinned(dst)) sim_stream_drain(s);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  return queue_copy(dst, src, bytes, kind, s, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  cudaError_t e = queue_copy(dst, src, bytes, kind, NULL, "cudaMemcpy");
  if (e == cudaSuccess) sim_stream_drain(NULL);
  return e;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
  if (!bytes) return cudaSuccess;
  sim_require_device(p, bytes, "cudaMemset");
  copy_t *c = calloc(1, sizeof *c);
  if (!c) return cudaErrorMemoryAllocation;
  c->dst = p, c->bytes = bytes, c->value = value & 0xff;
  sim_enqueue(s, "cudaMemset", copy_run, c, copy_drop);
  return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
  return cudaMemsetAsync(p, value, bytes, NULL);
}
