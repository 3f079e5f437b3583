/* sim_launch.c - kernel launches on the simulated device. A launch is
 * checked as CUDA checks it (block and grid limits, 48 KiB of dynamic
 * shared memory) and queued on the legacy stream; when it runs, each block
 * runs its threads as fibers on the host thread, switching at every
 * __syncthreads and warp shuffle (sim_barrier) until all of them arrived.
 * A kernel whose first launch met no barrier runs its later launches as a
 * plain loop over the threads (the fast path for elementwise kernels). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cudasim.h"

#define MAX_THREADS 1024
#define STACK_BYTES ((size_t)64 << 10)
#define MAX_DYN_SHARED ((size_t)48 << 10)

struct sim_idx {
  unsigned x, y, z;
};
struct sim_idx sim_thread_idx, sim_block_idx, sim_block_dim, sim_grid_dim;
void *sim_dyn_shared;

enum { SIM_BLOCK = 1, SIM_WARP = 2 };
enum { F_RUN, F_BLOCK, F_WARP, F_DONE };

typedef struct {
  void *sp;
  int state;
} fiber_t;

/* ---- context switch: the callee-saved registers and the FP control words
 * pushed on the old stack, the stack pointer swapped (x86-64 System V). ---- */
#if defined(__x86_64__)
void sim_fiber_swap(void **save_sp, void *to_sp);
void sim_fiber_tramp(void);
__asm__(
    ".text\n"
    ".globl sim_fiber_swap\n.hidden sim_fiber_swap\n.type sim_fiber_swap,@function\n"
    "sim_fiber_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size sim_fiber_swap, .-sim_fiber_swap\n"
    ".globl sim_fiber_tramp\n.hidden sim_fiber_tramp\n.type sim_fiber_tramp,@function\n"
    "sim_fiber_tramp:\n"
    "  callq *%r12\n  ud2\n"
    ".size sim_fiber_tramp, .-sim_fiber_tramp\n");

/* A fresh stack that "returns" into sim_fiber_tramp, which calls entry. */
static void *fiber_stack_init(char *stack, size_t bytes, void (*entry)(void)) {
  uint64_t *top = (uint64_t *)(((uintptr_t)(stack + bytes)) & ~(uintptr_t)15);
  uint64_t *sp = top - 8;
  uint32_t csr[2] = {0x1f80u, 0x037fu}; /* MXCSR and x87 control word defaults */
  memcpy(&sp[0], csr, sizeof csr);
  sp[1] = 0;                          /* r15 */
  sp[2] = 0;                          /* r14 */
  sp[3] = 0;                          /* r13 */
  sp[4] = (uint64_t)(uintptr_t)entry; /* r12 */
  sp[5] = 0;                          /* rbx */
  sp[6] = 0;                          /* rbp */
  sp[7] = (uint64_t)(uintptr_t)sim_fiber_tramp;
  return sp;
}
#else
#error "the simulated device's fibers are written for x86-64"
#endif

/* AddressSanitizer must be told of every stack switch, or it takes the
 * fibers' frames for the scheduler's (and reports them as overflows). */
#if defined(__SANITIZE_ADDRESS__)
#define SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_ASAN 1
#endif
#endif
#ifdef SIM_ASAN
#include <sanitizer/common_interface_defs.h>
static const void *g_sched_bottom;
static size_t g_sched_size;
/* Into fiber i from the scheduler, and back. */
static void to_fiber(const void *bottom, size_t size, void **fake) {
  __sanitizer_start_switch_fiber(fake, bottom, size);
}
static void in_fiber(void *fake) {
  __sanitizer_finish_switch_fiber(fake, &g_sched_bottom, &g_sched_size);
}
static void to_sched(void **fake) {
  __sanitizer_start_switch_fiber(fake, g_sched_bottom, g_sched_size);
}
static void in_sched(void *fake) {
  __sanitizer_finish_switch_fiber(fake, NULL, NULL);
}
#else
static void to_fiber(const void *bottom, size_t size, void **fake) {
  (void)bottom, (void)size, (void)fake;
}
static void in_fiber(void *fake) {
  (void)fake;
}
static void to_sched(void **fake) {
  (void)fake;
}
static void in_sched(void *fake) {
  (void)fake;
}
#endif

static fiber_t g_fibers[MAX_THREADS];
static char *g_stacks;
static void *g_sched_sp;
static int g_cur = -1; /* the running fiber, -1 outside one */
static unsigned g_nthreads;
static const sim_launch_t *g_launch;
static int g_met_barrier;
static uint64_t g_slots[2][MAX_THREADS];
static unsigned char g_parity[MAX_THREADS]; /* each thread's shuffles so far, mod 256 */
static char g_dyn[MAX_DYN_SHARED];

/* Which kernels met no barrier on their first launch. */
static struct {
  const void *key;
  int flat;
} g_learned[256];
static int g_nlearned;

unsigned sim_linear_tid(void) {
  return sim_thread_idx.x +
         sim_block_dim.x * (sim_thread_idx.y + sim_block_dim.y * sim_thread_idx.z);
}
uint64_t *sim_warp_slots(unsigned me) {
  return g_slots[g_parity[me]++ & 1];
}

static void set_thread(unsigned i) {
  sim_thread_idx.x = i % sim_block_dim.x;
  sim_thread_idx.y = (i / sim_block_dim.x) % sim_block_dim.y;
  sim_thread_idx.z = i / (sim_block_dim.x * sim_block_dim.y);
}

static void fiber_entry(void) {
  in_fiber(NULL);
  g_launch->body(g_launch->arg);
  g_fibers[g_cur].state = F_DONE;
  void *dead;
  to_sched(NULL); /* this fiber's stack is done with */
  sim_fiber_swap(&dead, g_sched_sp);
  abort(); /* a finished fiber is never resumed */
}

void sim_barrier(int scope) {
  if (g_cur < 0)
    sim_fatal(
        "kernel %s reached a barrier in a launch after one that met none: barriers "
        "that depend on the data are not simulated",
        g_launch ? g_launch->name : "?");
  g_met_barrier = 1;
  g_fibers[g_cur].state = scope == SIM_BLOCK ? F_BLOCK : F_WARP;
  void *fake = NULL;
  to_sched(&fake);
  sim_fiber_swap(&g_fibers[g_cur].sp, g_sched_sp);
  in_fiber(fake);
}

/* Lets waiting threads go: a warp whose live threads all wait at a warp
 * barrier, else the block when all its live threads wait at __syncthreads. */
static int release(void) {
  unsigned n = g_nthreads;
  int any = 0;
  for (unsigned w = 0; w * 32 < n; w++) {
    unsigned lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, warp = 0, live = 0;
    for (unsigned i = lo; i < hi; i++) {
      if (g_fibers[i].state == F_DONE) continue;
      live++;
      if (g_fibers[i].state == F_WARP) warp++;
    }
    if (warp && warp == live) {
      for (unsigned i = lo; i < hi; i++)
        if (g_fibers[i].state == F_WARP) g_fibers[i].state = F_RUN;
      any = 1;
    }
  }
  if (any) return 1;
  for (unsigned i = 0; i < n; i++)
    if (g_fibers[i].state != F_DONE && g_fibers[i].state != F_BLOCK) return 0;
  for (unsigned i = 0; i < n; i++)
    if (g_fibers[i].state == F_BLOCK) g_fibers[i].state = F_RUN;
  return 1;
}

static void run_block_fibers(void) {
  if (!g_stacks) {
    g_stacks = mmap(NULL, STACK_BYTES * MAX_THREADS, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (g_stacks == MAP_FAILED) sim_fatal("cannot map the fibers' stacks");
  }
  unsigned n = g_nthreads;
  memset(g_parity, 0, n);
  for (unsigned i = 0; i < n; i++) {
    g_fibers[i].state = F_RUN;
    g_fibers[i].sp = fiber_stack_init(g_stacks + (size_t)i * STACK_BYTES, STACK_BYTES, fiber_entry);
  }
  for (;;) {
    unsigned done = 0;
    for (unsigned i = 0; i < n; i++) {
      if (g_fibers[i].state == F_RUN) {
        g_cur = (int)i;
        set_thread(i);
        void *fake = NULL;
        to_fiber(g_stacks + (size_t)i * STACK_BYTES, STACK_BYTES, &fake);
        sim_fiber_swap(&g_sched_sp, g_fibers[i].sp);
        in_sched(fake);
        g_cur = -1;
      }
      done += g_fibers[i].state == F_DONE;
    }
    if (done == n) return;
    if (!release()) {
      unsigned at_block = 0, at_warp = 0;
      for (unsigned i = 0; i < n; i++) {
        at_block += g_fibers[i].state == F_BLOCK;
        at_warp += g_fibers[i].state == F_WARP;
      }
      sim_fatal(
          "kernel %s, block (%u,%u,%u): %u threads wait at __syncthreads and %u at a "
          "warp shuffle, %u finished: a barrier not every thread reaches",
          g_launch->name, sim_block_idx.x, sim_block_idx.y, sim_block_idx.z, at_block, at_warp,
          done);
    }
  }
}

static int *learned_slot(const void *key) {
  for (int i = 0; i < g_nlearned; i++)
    if (g_learned[i].key == key) return &g_learned[i].flat;
  if (g_nlearned == (int)(sizeof g_learned / sizeof g_learned[0])) return NULL;
  g_learned[g_nlearned].key = key;
  g_learned[g_nlearned].flat = -1;
  return &g_learned[g_nlearned++].flat;
}

static int launch_run(void *arg) {
  const sim_launch_t *l = arg;
  g_launch = l;
  sim_block_dim = (struct sim_idx){l->block[0], l->block[1], l->block[2]};
  sim_grid_dim = (struct sim_idx){l->grid[0], l->grid[1], l->grid[2]};
  g_nthreads = l->block[0] * l->block[1] * l->block[2];
  int *learned = learned_slot(l->key);
  int flat = learned && *learned == 1;
  g_met_barrier = 0;
  sim_dyn_shared = g_dyn;
  for (unsigned z = 0; z < l->grid[2]; z++)
    for (unsigned y = 0; y < l->grid[1]; y++)
      for (unsigned x = 0; x < l->grid[0]; x++) {
        sim_block_idx = (struct sim_idx){x, y, z};
        if (l->shmem) memset(g_dyn, 0xff, l->shmem); /* shared memory starts as garbage */
        if (flat) {
          for (unsigned i = 0; i < g_nthreads; i++) {
            set_thread(i);
            l->body(l->arg);
          }
        } else {
          run_block_fibers();
        }
      }
  if (learned && *learned < 0) *learned = !g_met_barrier;
  g_launch = NULL;
  return 1;
}

static void launch_drop(void *arg) {
  sim_launch_t *l = arg;
  l->drop(l->arg);
  free(l);
}

void sim_launch(const sim_launch_t *l) {
  const unsigned *b = l->block, *g = l->grid;
  unsigned long long threads = (unsigned long long)b[0] * b[1] * b[2];
  const char *why = NULL;
  if (!threads || !g[0] || !g[1] || !g[2])
    why = "a zero grid or block dimension";
  else if (threads > MAX_THREADS || b[0] > 1024 || b[1] > 1024 || b[2] > 64)
    why = "more than 1024 threads in a block";
  else if (g[0] > 0x7fffffffu || g[1] > 65535 || g[2] > 65535)
    why = "a grid dimension over its limit";
  else if (l->shmem > MAX_DYN_SHARED)
    why = "more than 48 KiB of dynamic shared memory";
  if (why) {
    fprintf(stderr, "cudasim: launch of %s refused: %s (grid %u,%u,%u block %u,%u,%u)\n", l->name,
            why, g[0], g[1], g[2], b[0], b[1], b[2]);
    sim_set_error(cudaErrorInvalidConfiguration);
    l->drop(l->arg);
    return;
  }
  sim_launch_t *op = malloc(sizeof *op);
  if (!op) sim_fatal("out of host memory");
  *op = *l;
  sim_enqueue(NULL, l->name, launch_run, op, launch_drop);
}
