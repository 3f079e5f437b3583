/* test_loader.c - both load paths give bitwise identical shards for world
 * sizes 1..4 (dimensions that do not divide evenly, and a rank with zero
 * rows, included); the ranks' shards concatenated equal each tensor in the
 * file value by value; from-scratch init does not depend on the world size;
 * memory accounting; failures are clean. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/clock.h"
#include "worker/ckpt/loader.h"

#include "ckpt_testutil.h"
#include "tmpdir_testutil.h"

/* C 12, NH 3, NKV 1, HS 4: k/v have 4 rows; FF 10; V 3, so a world of 4
 * leaves rank 3 without embedding rows. */
static llama_config_t tiny(bool tied) {
  return tu_tiny_config(12, 10, 2, 3, 1, 4, 3, tied);
}

static void test_rows(void **state) {
  (void)state;
  for (int64_t R = 0; R < 20; R++) {
    for (int N = 1; N <= 6; N++) {
      int64_t next = 0;
      for (int r = 0; r < N; r++) {
        int64_t row0, n;
        loader_rows(R, r, N, &row0, &n);
        assert_int_equal(row0, next);
        assert_int_equal(n, R / N + (r < R % N ? 1 : 0)); /* first R % N ranks get one more */
        next += n;
      }
      assert_int_equal(next, R);
    }
  }
}

static loader_shard_t *load_rank(const char *dir, int rank, int world, ty_dtype_t dt, bool eff,
                                 size_t bucket, placement_t *pl, loader_stats_t *st) {
  loader_opts_t o = {.rank = rank,
                     .world_size = world,
                     .dtype = dt,
                     .memory_efficient = eff,
                     .bucket_bytes = bucket,
                     .seed = 1,
                     .pl = pl};
  loader_shard_t *s;
  char err[1024];
  if (loader_load(dir, &o, &s, st, err, sizeof err)) fail_msg("load: %s", err);
  return s;
}

/* Byte counts and peaks of both paths, for each rank of worlds 1..4. */
static void check_stats(const char *dir, ty_dtype_t dt) {
  char err[1024];
  ckpt_t *ck;
  assert_int_equal(ckpt_open(dir, &ck, err, sizeof err), 0);
  const size_t dsz = ty_dtype_size(dt);
  for (int world = 1; world <= 4; world++) {
    uint64_t read_sum = 0;
    for (int r = 0; r < world; r++) {
      placement_t p1, p2;
      loader_stats_t s1, s2;
      placement_cpu_init(&p1);
      placement_cpu_init(&p2);
      loader_shard_t *a = load_rank(dir, r, world, dt, false, 64, &p1, &s1);
      loader_shard_t *b = load_rank(dir, r, world, dt, true, 64 + 8 * (size_t)r, &p2, &s2);
      /* Standard read everything and held the whole model; the efficient
       * path read its share and held only its shard. */
      assert_int_equal(s1.bytes_read, ck->st->data_bytes);
      assert_int_equal(s1.bytes_total, ck->st->data_bytes);
      assert_int_equal(s2.bytes_read, s2.bytes_total);
      assert_int_equal(s2.device_peak_bytes, b->bytes);
      assert_int_equal(s2.shard_bytes, b->bytes);
      assert_int_equal(loader_shard_bytes(&ck->layout.cfg, r, world, dt), b->bytes);
      assert_true(s1.device_peak_bytes >= ck->layout.nparams * dsz + a->bytes);
      assert_true(s1.host_peak_bytes > 0 && s2.load_seconds >= 0);
      read_sum += s2.bytes_read;
      loader_shard_free(a);
      loader_shard_free(b);
      assert_int_equal(p1.in_use + p2.in_use, 0);
    }
    assert_int_equal(read_sum, ck->st->data_bytes);
  }
  ckpt_close(ck);
}

/* The value checks proper: shards kept alive with one placement per world. */
static void compare_world(const char *dir, ty_dtype_t dt, int world) {
  char err[1024];
  ckpt_t *ck;
  assert_int_equal(ckpt_open(dir, &ck, err, sizeof err), 0);
  const size_t dsz = ty_dtype_size(dt);
  placement_t pl;
  placement_cpu_init(&pl);
  loader_shard_t *a[4], *b[4];
  for (int r = 0; r < world; r++) {
    a[r] = load_rank(dir, r, world, dt, false, 64, &pl, NULL);
    b[r] = load_rank(dir, r, world, dt, true, 100, &pl, NULL);
  }
  for (size_t i = 0; i < ck->layout.ntensors; i++) {
    const st_tensor_t *ft = ck->file_tensor[i];
    size_t n = (size_t)ft->nelem;
    unsigned char *raw = malloc(ft->nbytes + 1), *want = malloc(n * dsz + 1);
    float *f32 = malloc(n * 4 + 4);
    assert_int_equal(st_read(ck->st, ft, 0, raw, ft->nbytes, err, sizeof err), 0);
    ty_dtype_to_f32(ft->dtype, raw, f32, n);
    ty_dtype_from_f32(dt, f32, want, n);
    size_t at = 0;
    for (int r = 0; r < world; r++) {
      const loader_view_t *va = &a[r]->views[i], *vb = &b[r]->views[i];
      assert_string_equal(va->t->name, ft->name);
      assert_int_equal(va->nbytes, vb->nbytes);
      assert_memory_equal(va->data, vb->data, va->nbytes); /* the two paths agree bitwise */
      assert_int_equal(va->row0 * va->t->cols * (int64_t)dsz, (int64_t)at);
      if (va->nbytes) assert_memory_equal(va->data, want + at, va->nbytes);
      if (dt == TY_DTYPE_F32) /* and value by value against the file's own values */
        for (int64_t e = 0; e < va->rows * va->t->cols; e++)
          assert_true(((const float *)va->data)[e] == f32[at / 4 + (size_t)e]);
      at += va->nbytes;
    }
    assert_int_equal(at, n * dsz);
    free(raw), free(want), free(f32);
  }
  for (int r = 0; r < world; r++) loader_shard_free(a[r]), loader_shard_free(b[r]);
  assert_int_equal(pl.in_use, 0);
  ckpt_close(ck);
}

static void test_paths_agree(void **state) {
  (void)state;
  char dir[300];
  const ty_dtype_t files[] = {TY_DTYPE_F32, TY_DTYPE_BF16, TY_DTYPE_F16};
  const ty_dtype_t shards[] = {TY_DTYPE_F32, TY_DTYPE_BF16, TY_DTYPE_F16};
  for (int f = 0; f < 3; f++) {
    llama_config_t c = tiny(f == 1);
    c.qkv_bias = f == 2; /* Qwen2: 1-D biases sharded (and read by byte range) too */
    snprintf(dir, sizeof dir, "%s/m%d", g_dir, f);
    tu_write_ckpt(dir, &c, files[f], f + 1, 3, NULL);
    check_stats(dir, TY_DTYPE_F32);
    for (int s = 0; s < 3; s++)
      for (int world = 1; world <= 4; world++) compare_world(dir, shards[s], world);
  }
}

static void test_views(void **state) {
  (void)state;
  char dir[300];
  llama_config_t c = tiny(true);
  snprintf(dir, sizeof dir, "%s/v", g_dir);
  tu_write_ckpt(dir, &c, TY_DTYPE_BF16, 1, 3, NULL);
  placement_t pl;
  placement_cpu_init(&pl);
  loader_shard_t *s = load_rank(dir, 1, 3, TY_DTYPE_F32, true, 1 << 20, &pl, NULL);
  const loader_view_t *q = loader_view(s, CKPT_WQ, 1);
  assert_string_equal(q->t->name, "model.layers.1.self_attn.q_proj.weight");
  assert_int_equal(q->t->rows, 12);
  assert_int_equal(q->row0, 4);
  assert_int_equal(q->rows, 4);
  assert_int_equal(q->offset % 64, 0);
  assert_ptr_equal(q->data, (char *)s->base + q->offset);
  assert_null(loader_view(s, CKPT_LM_HEAD, -1)); /* tied */
  assert_ptr_equal(loader_view_by_name(s, "model.layers.1.self_attn.q_proj.weight"), q);
  assert_null(loader_view_by_name(s, "lm_head.weight"));
  const loader_view_t *e = loader_view(s, CKPT_EMBED, -1);
  assert_int_equal(e->rows, 1);
  assert_int_equal(pl.peak, s->bytes);
  loader_shard_free(s);
}

static void test_scratch(void **state) {
  (void)state;
  char dir[300], err[1024];
  llama_config_t c = tiny(false);
  /* A float32 mkmodel checkpoint with the same seed holds the same values. */
  snprintf(dir, sizeof dir, "%s/s", g_dir);
  tu_write_ckpt(dir, &c, TY_DTYPE_F32, 1, 99, NULL);
  const ty_dtype_t dts[] = {TY_DTYPE_F32, TY_DTYPE_BF16};
  for (int d = 0; d < 2; d++) {
    for (int world = 1; world <= 4; world++) {
      placement_t pl;
      placement_cpu_init(&pl);
      for (int r = 0; r < world; r++) {
        loader_opts_t o = {.rank = r,
                           .world_size = world,
                           .dtype = dts[d],
                           .bucket_bytes = 64,
                           .seed = 99,
                           .pl = &pl};
        loader_shard_t *s, *f;
        assert_int_equal(loader_init_scratch(&c, &o, &s, NULL, err, sizeof err), 0);
        o.memory_efficient = true;
        assert_int_equal(loader_load(dir, &o, &f, NULL, err, sizeof err), 0);
        for (size_t i = 0; i < s->layout.ntensors; i++)
          assert_memory_equal(s->views[i].data, f->views[i].data, s->views[i].nbytes);
        loader_shard_free(s);
        loader_shard_free(f);
      }
      assert_int_equal(pl.in_use, 0);
    }
  }
  placement_t pl;
  placement_cpu_init(&pl);
  loader_opts_t o = {.rank = 2, .world_size = 2, .dtype = TY_DTYPE_F32, .pl = &pl};
  loader_shard_t *s;
  assert_int_equal(loader_init_scratch(&c, &o, &s, NULL, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "rank 2"));
}

static void test_failures(void **state) {
  (void)state;
  char dir[300], err[1024], p[400];
  llama_config_t c = tiny(false);
  snprintf(dir, sizeof dir, "%s/bad", g_dir);
  tu_write_ckpt(dir, &c, TY_DTYPE_BF16, 2, 3, NULL);
  /* A shard file cut short: both paths fail with the file's name. */
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
  FILE *f = fopen(p, "r+");
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fclose(f);
  assert_int_equal(truncate(p, len - 3), 0);
  for (int eff = 0; eff < 2; eff++) {
    placement_t pl;
    placement_cpu_init(&pl);
    loader_opts_t o = {.rank = 0,
                       .world_size = 2,
                       .dtype = TY_DTYPE_F32,
                       .memory_efficient = eff,
                       .bucket_bytes = 64,
                       .pl = &pl};
    loader_shard_t *s = (loader_shard_t *)1;
    assert_int_not_equal(loader_load(dir, &o, &s, NULL, err, sizeof err), 0);
    assert_null(s);
    assert_non_null(strstr(err, "model-00002-of-00002.safetensors"));
    assert_int_equal(pl.in_use, 0);
  }
}

/* A placement that fails on purpose: alloc number fail_alloc (from 1), or
 * every copy_in once copies_left reaches 0. Host memory otherwise. */
typedef struct {
  int allocs, fail_alloc, copies_left;
} faulty_t;

static int faulty_alloc(placement_t *p, size_t n, void **out) {
  faulty_t *f = p->ctx;
  if (++f->allocs == f->fail_alloc) return TY_EEXHAUSTED;
  *out = malloc(n ? n : 1);
  return 0;
}
static void faulty_release(placement_t *p, void *ptr, size_t n) {
  (void)p, (void)n;
  free(ptr);
}
static int faulty_copy_in(placement_t *p, void *dst, size_t off, const void *src, size_t n) {
  faulty_t *f = p->ctx;
  if (f->copies_left-- <= 0) return TY_EUNAVAILABLE;
  memcpy((char *)dst + off, src, n);
  return 0;
}
static int faulty_copy_within(placement_t *p, void *dst, size_t doff, const void *src, size_t soff,
                              size_t n) {
  (void)p;
  memcpy((char *)dst + doff, (const char *)src + soff, n);
  return 0;
}
static const placement_ops_t g_faulty = {.name = "faulty",
                                         .alloc = faulty_alloc,
                                         .release = faulty_release,
                                         .copy_in = faulty_copy_in,
                                         .copy_within = faulty_copy_within};

static void test_placement_faults(void **state) {
  (void)state;
  char dir[300], err[1024];
  llama_config_t c = tiny(false);
  snprintf(dir, sizeof dir, "%s/f", g_dir);
  tu_write_ckpt(dir, &c, TY_DTYPE_BF16, 1, 3, NULL);
  const struct {
    bool eff, scratch;
    int fail_alloc, copies;
    int rc;
    const char *want;
  } cases[] = {
      {true, false, 1, 1000, TY_EEXHAUSTED, "cannot allocate its"},
      {false, false, 1, 1000, TY_EEXHAUSTED, "cannot place the whole"},
      /* The standard path placed the whole model first: the fix is named. */
      {false, false, 2, 1000, TY_EEXHAUSTED, "beside the whole"},
      {true, false, 0, 3, TY_EUNAVAILABLE, "to faulty failed"},
      {false, false, 0, 3, TY_EUNAVAILABLE, "to faulty failed"},
      {false, true, 1, 1000, TY_EEXHAUSTED, "cannot allocate its"},
      {false, true, 0, 3, TY_EUNAVAILABLE, "to faulty failed"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    faulty_t f = {0, cases[i].fail_alloc, cases[i].copies};
    placement_t pl = {.ops = &g_faulty, .ctx = &f};
    loader_opts_t o = {.rank = 1,
                       .world_size = 2,
                       .dtype = TY_DTYPE_F32,
                       .memory_efficient = cases[i].eff,
                       .bucket_bytes = 64,
                       .pl = &pl};
    loader_shard_t *s = (loader_shard_t *)1;
    err[0] = 0;
    int rc = cases[i].scratch ? loader_init_scratch(&c, &o, &s, NULL, err, sizeof err)
                              : loader_load(dir, &o, &s, NULL, err, sizeof err);
    if (rc != cases[i].rc || !strstr(err, cases[i].want))
      fail_msg("case %zu: rc %d, '%s'", i, rc, err);
    assert_null(s);
    assert_int_equal(pl.in_use, 0); /* everything placed was released */
  }
}

/* A host shard copied onto another placement (a stand-in device): the
 * same views and bytes, one allocation of the shard's size there; a failed
 * allocation or copy leaves nothing placed; a shard not in host memory is
 * refused by name. */
static void test_upload(void **state) {
  (void)state;
  char err[1024];
  llama_config_t c = tiny(true);
  placement_t host;
  placement_cpu_init(&host);
  loader_opts_t o = {.rank = 1, .world_size = 3, .dtype = TY_DTYPE_F32, .seed = 5, .pl = &host};
  loader_shard_t *s;
  assert_int_equal(loader_init_scratch(&c, &o, &s, NULL, err, sizeof err), 0);
  faulty_t f = {0, 0, 1000};
  placement_t dev = {.ops = &g_faulty, .ctx = &f};
  loader_shard_t *d;
  assert_int_equal(loader_shard_upload(s, &dev, &d, err, sizeof err), 0);
  assert_int_equal(d->bytes, s->bytes);
  assert_int_equal(dev.peak, s->bytes);
  assert_int_equal(f.allocs, 1);
  assert_true(d->rank == 1 && d->world_size == 3 && d->dtype == TY_DTYPE_F32 && d->pl == &dev);
  assert_int_equal(d->layout.ntensors, s->layout.ntensors);
  for (size_t i = 0; i < s->layout.ntensors; i++) {
    assert_string_equal(d->views[i].t->name, s->views[i].t->name);
    assert_int_equal(d->views[i].offset, s->views[i].offset);
    assert_int_equal(d->views[i].rows, s->views[i].rows);
    assert_ptr_equal(d->views[i].data, (char *)d->base + d->views[i].offset);
    assert_memory_equal(d->views[i].data, s->views[i].data, s->views[i].nbytes);
  }
  /* From a shard that is not in host memory. */
  loader_shard_t *dd = (loader_shard_t *)1;
  assert_int_equal(loader_shard_upload(d, &host, &dd, err, sizeof err), TY_EINVAL);
  assert_null(dd);
  assert_non_null(strstr(err, "not in host memory"));
  loader_shard_free(d);
  assert_int_equal(dev.in_use, 0);
  /* No room, then a failed copy: nothing stays placed. */
  faulty_t cases[] = {{0, 1, 1000}, {0, 0, 0}}; /* no room; copies fail */
  const char *want[] = {"cannot allocate its", "copying its shard onto faulty"};
  for (int i = 0; i < 2; i++) {
    placement_t pl = {.ops = &g_faulty, .ctx = &cases[i]};
    dd = (loader_shard_t *)1;
    assert_int_not_equal(loader_shard_upload(s, &pl, &dd, err, sizeof err), 0);
    assert_null(dd);
    if (!strstr(err, want[i])) fail_msg("case %d: '%s'", i, err);
    assert_int_equal(pl.in_use, 0);
  }
  loader_shard_free(s);
  assert_int_equal(host.in_use, 0);
}

/* A progress report is due at most once a second, and never for the end. */
static void test_progress_due(void **state) {
  (void)state;
  double last = ty_mono_s() - 2.0, was = last;
  assert_true(loader_progress_due(&last, 10, 100));
  assert_true(last > was);
  assert_false(loader_progress_due(&last, 20, 100)); /* within the second */
  last -= 2.0;
  assert_false(loader_progress_due(&last, 100, 100)); /* the end has its own */
  assert_true(loader_progress_due(&last, 99, 100));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rows),     cmocka_unit_test(test_paths_agree),
      cmocka_unit_test(test_views),    cmocka_unit_test(test_scratch),
      cmocka_unit_test(test_failures), cmocka_unit_test(test_placement_faults),
      cmocka_unit_test(test_upload),   cmocka_unit_test(test_progress_due),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
