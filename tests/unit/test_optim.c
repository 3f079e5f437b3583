/* test_optim.c - AdamW, the schedule and clipping against values worked out
 * by hand (tests/numerics/optim_ref.py compares many steps with PyTorch). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "worker/model/optim.h"

static optim_config_t config(double lr, double wd, int warmup, int total) {
  optim_config_t c;
  optim_config_defaults(&c);
  c.lr = lr;
  c.weight_decay = wd;
  c.warmup_steps = warmup;
  c.total_steps = total;
  return c;
}

static void test_schedule(void **state) {
  (void)state;
  optim_config_t c = config(1.0, 0, 4, 14);
  /* Warmup: (step + 1) / 4. */
  assert_float_equal(optim_lr_at(&c, 0), 0.25, 1e-12);
  assert_float_equal(optim_lr_at(&c, 3), 1.0, 1e-12);
  /* Cosine over the 10 remaining steps: step 4 is the peak, step 9 is half
   * way (cos(pi/2) = 0 -> 0.5), step 13 the last. */
  assert_float_equal(optim_lr_at(&c, 4), 1.0, 1e-12);
  assert_float_equal(optim_lr_at(&c, 9), 0.5, 1e-12);
  assert_float_equal(optim_lr_at(&c, 13), 0.5 * (1 + cos(M_PI * 0.9)), 1e-12);
  assert_float_equal(optim_lr_at(&c, 14), 0.0, 0);
  assert_float_equal(optim_lr_at(&c, -1), 0.0, 0);
  /* No warmup: the first step is at the peak, and the rate falls
   * monotonically. */
  c = config(3e-4, 0, 0, 100);
  assert_float_equal(optim_lr_at(&c, 0), 3e-4, 1e-15);
  for (int s = 1; s < 100; s++) assert_true(optim_lr_at(&c, s) < optim_lr_at(&c, s - 1));
}

static void test_clip(void **state) {
  (void)state;
  const float g[5] = {3, 4, 0, 0, 0}; /* norm 5 */
  assert_float_equal(optim_sumsq(g, 5), 25.0, 0);
  assert_float_equal(optim_clip_factor(5.0, 1.0), 1.0 / (5.0 + 1e-6), 1e-15);
  assert_float_equal(optim_clip_factor(5.0, 10.0), 1.0, 0);
  assert_float_equal(optim_clip_factor(5.0, 0.0), 1.0, 0);
  /* A NaN norm is not clipped silently to a number: it passes through so
   * that the caller's non-finite check sees it. */
  assert_float_equal(optim_clip_factor(NAN, 1.0), 1.0, 0);
  float big[1001];
  for (int i = 0; i < 1001; i++) big[i] = (float)(i % 7) - 3.0f;
  double want = 0;
  for (int i = 0; i < 1001; i++) want += (double)big[i] * big[i];
  assert_float_equal(optim_sumsq(big, 1001), want, 0);
}

/* The first AdamW step moves every parameter by lr * g / (|g| + eps') and
 * decays it by (1 - lr * wd) first: m_hat = g and v_hat = g^2 exactly. */
static void test_first_step(void **state) {
  (void)state;
  optim_config_t c = config(0.1, 0.5, 0, 10);
  char msg[256];
  optim_t *o = optim_new(&c, 4, msg, sizeof msg);
  assert_non_null(o);
  float p[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  const float g[4] = {0.2f, -0.4f, 0.0f, 1e-3f};
  optim_step(o, p, g, 0.1, 1.0);
  assert_int_equal(o->t, 1);
  const float p0[4] = {1.0f, -2.0f, 0.5f, 3.0f};
  for (int i = 0; i < 4; i++) {
    double decayed = p0[i] * (1.0 - 0.1 * 0.5);
    double upd = g[i] == 0 ? 0 : 0.1 * g[i] / (fabs(g[i]) + 1e-8);
    assert_float_equal(p[i], decayed - upd, 2e-6);
  }
  assert_float_equal(o->m[1], 0.1 * -0.4, 1e-7);
  assert_float_equal(o->v[1], 0.001 * 0.16, 1e-9);
  optim_free(o);
}

/* Two steps with grad_scale and an excluded range, worked through by hand
 * in double precision. */
static void test_two_steps_scale_and_nodecay(void **state) {
  (void)state;
  optim_config_t c = config(0.01, 0.1, 0, 10);
  optim_t *o = optim_new(&c, 3, NULL, 0);
  assert_non_null(o);
  optim_exclude_decay(o, 1, 1);
  float p[3] = {1.0f, 1.0f, 1.0f};
  const float g1[3] = {2.0f, 2.0f, -1.0f}, g2[3] = {-1.0f, 4.0f, 0.5f};
  const double scale = 0.5;
  double ref[3] = {1, 1, 1}, m[3] = {0}, v[3] = {0};
  for (int t = 1; t <= 2; t++) {
    const float *g = t == 1 ? g1 : g2;
    optim_step(o, p, g, 0.01, scale);
    for (int i = 0; i < 3; i++) {
      double gi = g[i] * scale;
      if (i != 1) ref[i] *= 1 - 0.01 * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.999 * v[i] + 0.001 * gi * gi;
      double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
      ref[i] -= 0.01 * mh / (sqrt(vh) + 1e-8);
    }
    for (int i = 0; i < 3; i++) assert_float_equal(p[i], ref[i], 1e-6);
  }
  optim_free(o);
}

static void test_rejects_bad_config(void **state) {
  (void)state;
  char msg[256] = "";
  optim_config_t c = config(0.0, 0, 0, 10);
  assert_null(optim_new(&c, 8, msg, sizeof msg));
  assert_non_null(strstr(msg, "lr"));
  c = config(1e-3, 0, 0, 0);
  assert_null(optim_new(&c, 8, msg, sizeof msg));
  c = config(1e-3, -1, 0, 10);
  assert_null(optim_new(&c, 8, msg, sizeof msg));
  optim_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule),           cmocka_unit_test(test_clip),
      cmocka_unit_test(test_first_step),         cmocka_unit_test(test_two_steps_scale_and_nodecay),
      cmocka_unit_test(test_rejects_bad_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
