/* cudasim_device.h - the kernel side of the simulated device, for CUDA
 * sources compiled as C++ (the worker's .cu files under TRAINYARD_CUDA=SIM).
 * Kernels are plain functions; a launch queues every block on the legacy
 * stream, and each block runs its threads as fibers (tests/cudasim/
 * sim_launch.c), so __syncthreads and the warp shuffles wait for the other
 * threads as they do on a GPU. Kernels run one block at a time under the
 * runtime's lock, so the thread and block indices and __shared__ (static)
 * storage are plain globals.
 *
 * A launch is written TY_LAUNCH(kernel, grid, block, shmem)(args...), which
 * the CUDA build spells kernel<<<grid, block, shmem>>>(args...); dynamic
 * shared memory is TY_DYN_SHARED(type, name). */
#ifndef TY_CUDASIM_DEVICE_H
#define TY_CUDASIM_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "cudasim.h"

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern "C" {
struct sim_idx {
  unsigned x, y, z;
};
extern struct sim_idx sim_thread_idx, sim_block_idx, sim_block_dim, sim_grid_dim;
extern void *sim_dyn_shared; /* this block's dynamic shared memory */
/* Waits for every live thread of the block (SIM_BLOCK) or of the warp
 * (SIM_WARP); returns in the fiber once they all arrived. */
enum { SIM_BLOCK = 1, SIM_WARP = 2 };
void sim_barrier(int scope);
/* The exchange slots of thread `me`'s next shuffle, one 8-byte slot a
 * thread (linear index); two sets, used in turn by each thread. */
uint64_t *sim_warp_slots(unsigned me);
unsigned sim_linear_tid(void);
}

#define threadIdx sim_thread_idx
#define blockIdx sim_block_idx
#define blockDim sim_block_dim
#define gridDim sim_grid_dim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

static inline void __syncthreads(void) {
  sim_barrier(SIM_BLOCK);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  sim_barrier(SIM_WARP);
}

/* The value of lane (this lane ^ lane_mask) of the warp. Every live lane of
 * the warp must call it (the full mask is all this simulator supports).
 * Each lane writes its value into the slots of this shuffle's parity and
 * waits for its warp; the next shuffle uses the other slots, and the one
 * after can only start once every lane has passed the next one's barrier,
 * that is, has read this one's value: one barrier a shuffle. */
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
  if (mask != 0xffffffffu || width != 32) sim_fatal("__shfl_xor_sync: only a full warp is simulated");
  unsigned me = sim_linear_tid();
  uint64_t *slot = sim_warp_slots(me);
  memcpy(&slot[me], &v, sizeof v);
  sim_barrier(SIM_WARP);
  T r;
  memcpy(&r, &slot[me ^ (unsigned)lane_mask], sizeof r);
  return r;
}

namespace cudasim {

template <typename... P>
struct launcher {
  using closure = std::tuple<void (*)(P...), std::decay_t<P>...>;
  const char *name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shmem;

  static void body(void *arg) {
    closure *c = static_cast<closure *>(arg);
    std::apply([](auto k, auto... a) { k(a...); }, *c);
  }
  static void drop(void *arg) { delete static_cast<closure *>(arg); }

  /* Arguments convert to the kernel's parameter types here, at the launch,
   * and are kept by value until the kernel runs, as CUDA does. */
  void operator()(P... a) const {
    sim_launch_t l;
    l.name = name;
    l.key = reinterpret_cast<const void *>(kernel);
    l.grid[0] = grid.x, l.grid[1] = grid.y, l.grid[2] = grid.z;
    l.block[0] = block.x, l.block[1] = block.y, l.block[2] = block.z;
    l.shmem = shmem;
    l.body = body;
    l.arg = new closure(kernel, a...);
    l.drop = drop;
    sim_launch(&l);
  }
};

template <typename... P>
launcher<P...> launch(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t shmem) {
  return launcher<P...>{name, k, grid, block, shmem};
}

} /* namespace cudasim */

#define TY_LAUNCH(k, grid, block, shmem) cudasim::launch(#k, k, grid, block, shmem)
#define TY_DYN_SHARED(type, name) type *name = static_cast<type *>(sim_dyn_shared)
#define TY_UNROLL

#endif
