/* rng.h - a small seeded generator (splitmix64) for weight initialisation:
 * the same seed gives the same numbers on every host and thread count. */
#ifndef TY_WORKER_RNG_H
#define TY_WORKER_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct {
  uint64_t s;
} rng_t;

static inline void rng_seed(rng_t *r, uint64_t seed) {
  r->s = seed;
}

static inline uint64_t rng_u64(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 random bits. */
static inline double rng_uniform(rng_t *r) {
  return (double)(rng_u64(r) >> 11) * 0x1.0p-53;
}

/* Standard normal (Box-Muller; one draw per call, the partner discarded). */
static inline double rng_normal(rng_t *r) {
  double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r); /* u1 in (0, 1] */
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
