/* kernels_check.c - every kernel of worker/cuda/backend_cuda.h against its CPU
 * twin (worker/model/cpu_ops.c, lora.c, optim.c, common/dtype.c) on the same
 * seeded inputs, forward and backward (ctest label gpu). Shapes are small
 * and deliberately uneven (grouped-query heads, odd T and V). fp32 kernels
 * agree within 2e-5 relative (summation order only); bf16 products take
 * bf16-rounded operands on both sides, so they agree as closely. Exits 77
 * (a skip) with the reason where no CUDA device is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "common/dtype.h"
#include "tests/gpu/gpu_util.h"
#include "worker/cuda/backend_cuda.h"
#include "worker/model/cpu_ops.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/optim.h"

enum { B = 2, T = 9, C = 40, NH = 4, NKV = 2, HS = 10, FF = 36, V = 53, R = 4, N = B * T };
#define QD (NH * HS)
#define KVD (NKV * HS)
#define RT 2e-5f /* relative tolerance of fp32 kernels */
#define AT 1e-5f /* absolute floor, for values near 0 */

static float *hbuf(size_t n, uint64_t seed, float amp) {
  float *x = malloc(n * sizeof(float) + 4);
  gpu_fill(x, n, seed, amp);
  return x;
}
#define F(n) ((size_t)(n) * sizeof(float))

static int check_dev(const char *what, const float *d, const float *want, size_t n, float rtol) {
  float *got = malloc(F(n) + 4);
  gpu_get(got, d, F(n));
  int bad = gpu_close(what, got, want, n, rtol, AT);
  free(got);
  return bad;
}

/* As check_dev, but against tol times the largest |want| (gpu_worst_diff). */
static int check_dev_scaled(const char *what, const float *d, const float *want, size_t n,
                            float tol) {
  float *got = malloc(F(n) + 4);
  gpu_get(got, d, F(n));
  double worst, top;
  size_t at;
  gpu_worst_diff(got, want, n, &worst, &at, &top);
  const int bad = n && !(worst <= tol * top);
  printf("%-4s %-28s n=%-8zu max|diff| %.3g (%.3g of max |want| %.3g)\n", bad ? "FAIL" : "ok", what,
         n, worst, top > 0 ? worst / top : worst, top);
  if (bad) printf("  at [%zu]: got %.9g want %.9g\n", at, got[at], want[at]);
  free(got);
  return bad;
}

static int test_matmul(cuda_backend_t *b, ty_dtype_t dt) {
  const int IN = C, OUT = FF;
  float *x = hbuf(N * IN, 1, 1), *w = hbuf(OUT * IN, 2, 0.3f), *dout = hbuf(N * OUT, 3, 1);
  float *out = hbuf(N * OUT, 4, 1), *dinp = hbuf(N * IN, 5, 1), *dw = hbuf(OUT * IN, 6, 0.1f);
  int bad = 0;
  const char *tag = dt == TY_DTYPE_BF16 ? "bf16" : "fp32";
  void *dx, *dW, *dO;
  if (dt == TY_DTYPE_BF16) { /* both sides see the bf16-rounded operands */
    size_t nn[3] = {N * IN, OUT * IN, N * OUT};
    float *hs[3] = {x, w, dout};
    void **ds[3] = {&dx, &dW, &dO};
    for (int i = 0; i < 3; i++) {
      uint16_t *h16 = malloc(nn[i] * 2);
      ty_dtype_from_f32(TY_DTYPE_BF16, hs[i], h16, nn[i]);
      ty_dtype_to_f32(TY_DTYPE_BF16, h16, hs[i], nn[i]);
      *ds[i] = gpu_dup(h16, nn[i] * 2);
      free(h16);
    }
  } else {
    dx = gpu_dup(x, F(N * IN));
    dW = gpu_dup(w, F(OUT * IN));
    dO = gpu_dup(dout, F(N * OUT));
  }
  float *d_out = gpu_dup(out, F(N * OUT)), *d_dinp = gpu_dup(dinp, F(N * IN));
  float *d_dw = gpu_dup(dw, F(OUT * IN));
  char name[64];
  /* beta 1: onto the existing out; dinp_beta 1 likewise; dweight += */
  cpu_matmul_forward(out, x, w, N, IN, OUT, 1.0f);
  bad |= cuda_matmul_forward(b, d_out, dx, dW, dt, N, IN, OUT, 1.0f) != 0;
  snprintf(name, sizeof name, "matmul_forward %s", tag);
  bad |= check_dev(name, d_out, out, N * OUT, RT);
  cpu_matmul_backward(dinp, dw, dout, x, w, N, IN, OUT, 1.0f);
  bad |= cuda_matmul_backward(b, d_dinp, d_dw, dO, dx, dW, dt, N, IN, OUT, 1.0f) != 0;
  snprintf(name, sizeof name, "matmul_backward dinp %s", tag);
  bad |= check_dev(name, d_dinp, dinp, N * IN, RT);
  snprintf(name, sizeof name, "matmul_backward dweight %s", tag);
  bad |= check_dev(name, d_dw, dw, OUT * IN, RT);
  cudaFree(dx), cudaFree(dW), cudaFree(dO), cudaFree(d_out), cudaFree(d_dinp), cudaFree(d_dw);
  free(x), free(w), free(dout), free(out), free(dinp), free(dw);
  return bad;
}

/* f32 -> bf16 on the device equals common/dtype.c bit for bit (NaN: both NaN). */
static int test_convert(cuda_backend_t *b) {
  enum { K = 4096 };
  float *x = hbuf(K, 7, 3);
  const uint32_t special[] = {0x00000001u, 0x00007fffu, 0x807fffffu, 0x7f7fffffu, 0x7f800000u,
                              0xff800000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7fc00000u};
  for (size_t i = 0; i < sizeof special / 4; i++) memcpy(&x[i], &special[i], 4);
  uint16_t want[K], got[K];
  ty_dtype_from_f32(TY_DTYPE_BF16, x, want, K);
  float *dx = gpu_dup(x, F(K));
  uint16_t *d16 = gpu_dup(NULL, K * 2);
  cuda_f32_to_bf16(b, d16, dx, K);
  gpu_get(got, d16, K * 2);
  int bad = 0;
  for (int i = 0; i < K && !bad; i++) {
    int wn = (want[i] & 0x7fff) > 0x7f80, gn = (got[i] & 0x7fff) > 0x7f80;
    if (wn != gn || (!wn && want[i] != got[i])) {
      printf("FAIL f32_to_bf16 [%d] %08x: got %04x want %04x\n", i, ((uint32_t *)x)[i], got[i],
             want[i]);
      bad = 1;
    }
  }
  float back[K], wantf[K];
  ty_dtype_to_f32(TY_DTYPE_BF16, want, wantf, K);
  cudaMemcpy(d16, want, K * 2, cudaMemcpyHostToDevice);
  cuda_bf16_to_f32(b, dx, d16, K);
  gpu_get(back, dx, F(K));
  for (int i = 0; i < K && !bad; i++)
    if (memcmp(&back[i], &wantf[i], 4) && !(isnan(back[i]) && isnan(wantf[i]))) {
      printf("FAIL bf16_to_f32 [%d]\n", i);
      bad = 1;
    }
  if (!bad) printf("ok   f32<->bf16 conversions      n=%d bitwise\n", K);
  cudaFree(dx), cudaFree(d16), free(x);
  return bad;
}

static int test_rmsnorm(cuda_backend_t *b) {
  float *x = hbuf(N * C, 8, 2), *w = hbuf(C, 9, 1), *out = hbuf(N * C, 0, 0), *rstd = hbuf(N, 0, 0);
  float *dout = hbuf(N * C, 10, 1), *dres = hbuf(N * C, 11, 1), *dw = hbuf(C, 12, 0.5f);
  float *d_x = gpu_dup(x, F(N * C)), *d_w = gpu_dup(w, F(C));
  float *d_out = gpu_dup(out, F(N * C)), *d_rstd = gpu_dup(rstd, F(N));
  float *d_dout = gpu_dup(dout, F(N * C)), *d_dres = gpu_dup(dres, F(N * C));
  float *d_dw = gpu_dup(dw, F(C));
  int bad = 0;
  cpu_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
  cuda_rmsnorm_forward(b, d_out, d_rstd, d_x, d_w, N, C, 1e-5f);
  bad |= check_dev("rmsnorm_forward out", d_out, out, N * C, RT);
  bad |= check_dev("rmsnorm_forward rstd", d_rstd, rstd, N, RT);
  /* dinp aliases dresid, as the model calls it */
  cpu_rmsnorm_backward(dres, dw, dout, dres, x, w, rstd, N, C);
  cuda_rmsnorm_backward(b, d_dres, d_dw, d_dout, d_dres, d_x, d_w, d_rstd, N, C);
  bad |= check_dev("rmsnorm_backward dinp", d_dres, dres, N * C, RT);
  bad |= check_dev("rmsnorm_backward dweight", d_dw, dw, C, RT);
  cudaFree(d_x), cudaFree(d_w), cudaFree(d_out), cudaFree(d_rstd), cudaFree(d_dout);
  cudaFree(d_dres), cudaFree(d_dw);
  free(x), free(w), free(out), free(rstd), free(dout), free(dres), free(dw);
  return bad;
}

static int test_rope(cuda_backend_t *b) {
  const size_t half = HS / 2, n = (size_t)N * QD;
  float *cs = hbuf(T * half, 0, 0), *sn = hbuf(T * half, 0, 0), *x = hbuf(n, 13, 1);
  cpu_rope_tables(cs, sn, T, HS, 500000.0, NULL);
  float *d_cs = gpu_dup(NULL, F(T * half)), *d_sn = gpu_dup(NULL, F(T * half));
  int bad = cuda_rope_tables(b, d_cs, d_sn, T, HS, 500000.0, NULL) != 0;
  bad |= check_dev("rope_tables cos", d_cs, cs, T * half, 0.0f);
  float *d_x = gpu_dup(x, F(n));
  cpu_rope_forward(x, cs, sn, NULL, B, T, NH, HS);
  cuda_rope_forward(b, d_x, d_cs, d_sn, NULL, B, T, NH, HS);
  bad |= check_dev("rope_forward", d_x, x, n, RT);
  cpu_rope_backward(x, cs, sn, NULL, B, T, NH, HS);
  cuda_rope_backward(b, d_x, d_cs, d_sn, NULL, B, T, NH, HS);
  bad |= check_dev("rope_backward", d_x, x, n, RT);
  /* Positions restarting inside rows, as packed documents have them. */
  int pos[N];
  for (int i = 0; i < N; i++) pos[i] = i % T < 5 ? i % T : (i % T - 5) % 3;
  int *d_pos = gpu_dup(pos, sizeof pos);
  cpu_rope_forward(x, cs, sn, pos, B, T, NH, HS);
  cuda_rope_forward(b, d_x, d_cs, d_sn, d_pos, B, T, NH, HS);
  bad |= check_dev("rope_forward with positions", d_x, x, n, RT);
  cpu_rope_backward(x, cs, sn, pos, B, T, NH, HS);
  cuda_rope_backward(b, d_x, d_cs, d_sn, d_pos, B, T, NH, HS);
  bad |= check_dev("rope_backward with positions", d_x, x, n, RT);
  cudaFree(d_pos);
  cudaFree(d_cs), cudaFree(d_sn), cudaFree(d_x), free(cs), free(sn), free(x);
  return bad;
}

/* TF32 products (10 mantissa bits): scores and gradients within this of
 * fp32's, relative to the largest element (inputs of magnitude 1, T up to
 * 300: at most 6.3e-4 measured on the simulated device, which rounds the
 * operands as tensor cores do). */
#define TF32_TOL 4e-3f

/* One attention shape against the CPU: B, T, heads, kv heads, head size;
 * the tensor-core path's workspace for `budget` bytes of scores (small
 * budgets make many chunks of query rows); packed: documents of 1 to 40
 * tokens packed in each row (positions restarting), so that attention is
 * block-diagonal and whole tiles and chunks of keys are masked for a row. */
static int attention_case(cuda_backend_t *b, int Bn, int Tn, int NHn, int NKVn, int HSn,
                          size_t budget, bool packed) {
  const size_t n = (size_t)Bn * Tn, qd = (size_t)NHn * HSn, kvd = (size_t)NKVn * HSn;
  const size_t nl = (size_t)Bn * NHn * Tn;
  float *q = hbuf(n * qd, 14, 1), *k = hbuf(n * kvd, 15, 1), *v = hbuf(n * kvd, 16, 1);
  float *out = hbuf(n * qd, 0, 0), *lse = hbuf(nl, 0, 0), *dout = hbuf(n * qd, 17, 1);
  float *dq = hbuf(n * qd, 0, 0), *dk = hbuf(n * kvd, 0, 0), *dv = hbuf(n * kvd, 0, 0);
  float *scratch = hbuf(2 * (size_t)Tn * Tn, 0, 0);
  float *d_q = gpu_dup(q, F(n * qd)), *d_k = gpu_dup(k, F(n * kvd)), *d_v = gpu_dup(v, F(n * kvd));
  float *d_out = gpu_dup(NULL, F(n * qd)), *d_lse = gpu_dup(NULL, F(nl));
  float *d_dout = gpu_dup(dout, F(n * qd)), *d_dq = gpu_dup(NULL, F(n * qd));
  float *d_dk = gpu_dup(NULL, F(n * kvd)), *d_dv = gpu_dup(NULL, F(n * kvd));
  float *d_scr = gpu_dup(NULL, F(nl)); /* the backward pass's B*NH*T floats, no more */
  const size_t wsb = cuda_attention_tf32_bytes(Bn, Tn, NHn, budget);
  void *ws = gpu_dup(NULL, wsb);
  int *pos = NULL, *d_pos = NULL;
  if (packed) {
    pos = malloc(n * sizeof *pos);
    uint32_t x = 12345u;
    for (int r = 0; r < Bn; r++)
      for (int t = 0, left = 0, p = 0; t < Tn; t++, p++, left--) {
        if (left <= 0) x = x * 1664525u + 1013904223u, left = 1 + (int)(x >> 16) % 40, p = 0;
        pos[(size_t)r * Tn + t] = p;
      }
    d_pos = gpu_dup(pos, n * sizeof *pos);
  }
  char what[160];
  int bad = 0;
  cpu_attention_forward(out, lse, scratch, q, k, v, pos, Bn, Tn, NHn, NKVn, HSn);
  cpu_attention_backward(dq, dk, dv, scratch, dout, lse, q, k, v, pos, Bn, Tn, NHn, NKVn, HSn);
  /* The tiled kernels (the per-row ones past head size 256), the per-row
   * ones, then the tensor-core path. */
  static const char *const paths[] = {"tiled", "per row", "tf32"};
  for (int p = 0; p < 3; p++) {
    cuda_backend_attention_rows(b, p == 1);
    void *w = p == 2 ? ws : NULL;
    /* NaN: every element read must have been written. */
    cudaMemset(d_out, 0xff, F(n * qd));
    cudaMemset(d_dq, 0xff, F(n * qd));
    cudaMemset(d_dk, 0xff, F(n * kvd));
    cudaMemset(d_dv, 0xff, F(n * kvd));
    cudaMemset(d_scr, 0xff, F(nl));
    cudaMemset(ws, 0xff, wsb);
    snprintf(what, sizeof what, "attention (B %d T %d NH %d NKV %d HS %d, %s%s)", Bn, Tn, NHn, NKVn,
             HSn, paths[p], packed ? ", packed" : "");
    if (cuda_attention_forward(b, w, wsb, d_out, d_lse, d_q, d_k, d_v, d_pos, Bn, Tn, NHn, NKVn,
                               HSn) ||
        cuda_attention_backward(b, w, wsb, d_dq, d_dk, d_dv, d_scr, d_dout, d_out, d_lse, d_q, d_k,
                                d_v, d_pos, Bn, Tn, NHn, NKVn, HSn)) {
      fprintf(stderr, "%s: cuBLAS refused a product\n", what);
      bad = 1;
      continue;
    }
    char w2[200];
    const char *parts[] = {"forward out", "forward lse", "backward dq", "backward dk",
                           "backward dv"};
    const float *dev[] = {d_out, d_lse, d_dq, d_dk, d_dv}, *want[] = {out, lse, dq, dk, dv};
    const size_t cnt[] = {n * qd, nl, n * qd, n * kvd, n * kvd};
    for (int i = 0; i < 5; i++) {
      snprintf(w2, sizeof w2, "%s %s", what, parts[i]);
      bad |= p == 2 ? check_dev_scaled(w2, dev[i], want[i], cnt[i], TF32_TOL)
                    : check_dev(w2, dev[i], want[i], cnt[i], i < 2 ? RT : 1e-4f);
    }
  }
  cuda_backend_attention_rows(b, false);
  float *ptrs[] = {d_q, d_k, d_v, d_out, d_lse, d_dout, d_dq, d_dk, d_dv, d_scr};
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) cudaFree(ptrs[i]);
  cudaFree(ws);
  cudaFree(d_pos);
  free(pos);
  free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
  free(scratch);
  return bad;
}

/* The tiled kernels take a tile of 32, 16 or 8 rows by head size (8 threads
 * to a row, each with HS / 8 rounded up to a power of two of the row's
 * values); heads over 256 take the row kernels. The suite's small shape
 * (one partial tile); then many tiles with a partial last one in each
 * layout: a head size of 72 (not a multiple of 8: tiles of 32 forward, 16
 * backward) with four query heads to a kv head, 64 (tiles of 32, two
 * heads to a kv head), 256 (16 forward, 8 backward) and 264 (the row
 * kernels, with keys and (head, row) pairs in several blocks' worth).
 * The tensor-core path: every row in one chunk (a budget of 1 GiB);
 * chunks that grow shorter as the causal rows grow longer, with a short
 * last one (T 300 in 512 KiB: backward 112, 80, 48, 48 and 12 rows); and
 * the least workspace (budget 0, 16 rows' worth: at T 70 backward 32, 16,
 * 16 and 6 rows). */
static int test_attention(cuda_backend_t *b) {
  int bad = attention_case(b, B, T, NH, NKV, HS, (size_t)1 << 30, false);
  bad |= attention_case(b, 1, 300, 4, 1, 72, (size_t)512 << 10, false);
  bad |= attention_case(b, 2, 70, 4, 2, 64, 0, false);
  bad |= attention_case(b, 1, 41, 2, 2, 256, (size_t)1 << 30, false);
  bad |= attention_case(b, 1, 270, 2, 1, 264, (size_t)256 << 10, false);
  /* Packed documents, in every layout and in chunks of the tf32 path. */
  bad |= attention_case(b, B, T, NH, NKV, HS, (size_t)1 << 30, true);
  bad |= attention_case(b, 1, 300, 4, 1, 72, (size_t)512 << 10, true);
  bad |= attention_case(b, 2, 70, 4, 2, 64, 0, true);
  bad |= attention_case(b, 1, 270, 2, 1, 264, (size_t)256 << 10, true);
  return bad;
}

static int test_swiglu_embed_ce(cuda_backend_t *b) {
  const size_t n = (size_t)N * FF;
  float *g = hbuf(n, 18, 4), *u = hbuf(n, 19, 2), *h = hbuf(n, 0, 0), *dh = hbuf(n, 20, 1);
  float *dg = hbuf(n, 0, 0), *du = hbuf(n, 0, 0);
  float *d_g = gpu_dup(g, F(n)), *d_u = gpu_dup(u, F(n)), *d_h = gpu_dup(NULL, F(n));
  float *d_dh = gpu_dup(dh, F(n)), *d_dg = gpu_dup(NULL, F(n)), *d_du = gpu_dup(NULL, F(n));
  int bad = 0;
  cpu_swiglu_forward(h, g, u, n);
  cuda_swiglu_forward(b, d_h, d_g, d_u, n);
  bad |= check_dev("swiglu_forward", d_h, h, n, RT);
  cpu_swiglu_backward(dg, du, dh, g, u, n);
  cuda_swiglu_backward(b, d_dg, d_du, d_dh, d_g, d_u, n);
  bad |= check_dev("swiglu_backward dgate", d_dg, dg, n, RT);
  bad |= check_dev("swiglu_backward dup", d_du, du, n, RT);

  int tok[N], tgt[N];
  for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % V, tgt[i] = (i * 11 + 5) % V;
  tok[1] = tok[0]; /* a repeated token: its gradient rows add up */
  float *emb = hbuf(V * C, 21, 1), *eo = hbuf(N * C, 0, 0), *demb = hbuf(V * C, 22, 0.1f);
  float *deo = hbuf(N * C, 23, 1);
  int *d_tok = gpu_dup(tok, sizeof tok), *d_tgt = gpu_dup(tgt, sizeof tgt);
  float *d_emb = gpu_dup(emb, F(V * C)), *d_eo = gpu_dup(NULL, F(N * C));
  float *d_demb = gpu_dup(demb, F(V * C)), *d_deo = gpu_dup(deo, F(N * C));
  cpu_embedding_forward(eo, tok, emb, N, C);
  cuda_embedding_forward(b, d_eo, d_tok, d_emb, TY_DTYPE_F32, N, C);
  bad |= check_dev("embedding_forward", d_eo, eo, N * C, 0.0f);
  cpu_embedding_backward(demb, deo, tok, N, C);
  cuda_embedding_backward(b, d_demb, d_deo, d_tok, N, C);
  bad |= check_dev("embedding_backward", d_demb, demb, V * C, RT);
  { /* a bf16 table, as a loader shard holds it */
    uint16_t *e16 = malloc((size_t)V * C * 2);
    ty_dtype_from_f32(TY_DTYPE_BF16, emb, e16, (size_t)V * C);
    ty_dtype_to_f32(TY_DTYPE_BF16, e16, emb, (size_t)V * C);
    void *d_e16 = gpu_dup(e16, (size_t)V * C * 2);
    cpu_embedding_forward(eo, tok, emb, N, C);
    cuda_embedding_forward(b, d_eo, d_tok, d_e16, TY_DTYPE_BF16, N, C);
    bad |= check_dev("embedding_forward bf16", d_eo, eo, N * C, 0.0f);
    cudaFree(d_e16);
    free(e16);
  }

  float *lg = hbuf(N * V, 24, 6), *loss = hbuf(N, 0, 0);
  float *d_lg = gpu_dup(lg, F(N * V)), *d_loss = gpu_dup(NULL, F(N));
  double want = cpu_crossentropy_forward(loss, lg, tgt, N, V), got = 0.0;
  bad |= cuda_crossentropy_forward(b, d_loss, d_lg, d_tgt, NULL, N, V, &got) != 0;
  bad |= check_dev("crossentropy_forward", d_loss, loss, N, RT);
  float fg = (float)got, fw = (float)want;
  bad |= gpu_close("crossentropy_forward sum", &fg, &fw, 1, RT, AT);
  cpu_crossentropy_backward(lg, tgt, NULL, N, V, 1.0f / N);
  cuda_crossentropy_backward(b, d_lg, d_tgt, NULL, N, V, 1.0f / N);
  bad |= check_dev("crossentropy_backward", d_lg, lg, N * V, 1e-4f);
  { /* a loss mask: rows of weight 0 lose nothing and get no gradient */
    float wts[N], *lg2 = hbuf(N * V, 25, 6);
    for (int i = 0; i < N; i++) wts[i] = i % 3 ? 1.0f : 0.0f;
    float *d_w = gpu_dup(wts, sizeof wts), *d_lg2 = gpu_dup(lg2, F(N * V));
    cpu_crossentropy_forward(loss, lg2, tgt, N, V);
    for (int i = 0; i < N; i++) loss[i] *= wts[i];
    bad |= cuda_crossentropy_forward(b, d_loss, d_lg2, d_tgt, d_w, N, V, NULL) != 0;
    bad |= check_dev("crossentropy_forward masked", d_loss, loss, N, RT);
    cpu_crossentropy_backward(lg2, tgt, wts, N, V, 0.25f);
    cuda_crossentropy_backward(b, d_lg2, d_tgt, d_w, N, V, 0.25f);
    bad |= check_dev("crossentropy_backward masked", d_lg2, lg2, N * V, 1e-4f);
    cudaFree(d_w), cudaFree(d_lg2), free(lg2);
  }
  void *ptrs[] = {d_g,   d_u,   d_h,  d_dh,   d_dg,  d_du, d_tok,
                  d_tgt, d_emb, d_eo, d_demb, d_deo, d_lg, d_loss};
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) cudaFree(ptrs[i]);
  free(g), free(u), free(h), free(dh), free(dg), free(du), free(emb), free(eo), free(demb);
  free(deo), free(lg), free(loss);
  return bad;
}

/* LoRA against worker/model/lora.c on a real adapter (q_proj of layer 0). */
static int test_lora(cuda_backend_t *b) {
  llama_config_t cfg;
  llama_config_init(&cfg);
  cfg.hidden_size = C, cfg.intermediate_size = FF, cfg.num_hidden_layers = 1;
  cfg.num_attention_heads = NH, cfg.num_key_value_heads = NKV, cfg.head_dim = HS;
  cfg.vocab_size = V;
  model_t *m;
  lora_t *lo;
  char err[256];
  if (model_create_unowned(&m, &cfg, B, T, MODEL_TRAIN_LORA, err, sizeof err) ||
      lora_create(&lo, m, R, 16.0, 1u << JOBSPEC_TARGET_BIT_Q, err, sizeof err)) {
    printf("FAIL lora setup: %s\n", err);
    return 1;
  }
  lora_init(lo, 3);
  const int IN = C, OUT = QD, tg = JOBSPEC_TARGET_BIT_Q;
  lora_pair_t *p = &lo->w[tg], *dp = &lo->dw[tg]; /* layer 0 */
  gpu_fill(p->B, (size_t)OUT * R, 25, 0.5f);      /* B is zero after init */
  gpu_fill(dp->A, (size_t)R * IN, 26, 0.1f);
  gpu_fill(dp->B, (size_t)OUT * R, 27, 0.1f);
  float *x = hbuf(N * IN, 28, 1), *out = hbuf(N * OUT, 29, 1), *dout = hbuf(N * OUT, 30, 1);
  float *dx = hbuf(N * IN, 31, 1);
  float *d_A = gpu_dup(p->A, F(R * IN)), *d_B = gpu_dup(p->B, F(OUT * R));
  float *d_dA = gpu_dup(dp->A, F(R * IN)), *d_dB = gpu_dup(dp->B, F(OUT * R));
  float *d_x = gpu_dup(x, F(N * IN)), *d_out = gpu_dup(out, F(N * OUT));
  float *d_dout = gpu_dup(dout, F(N * OUT)), *d_dx = gpu_dup(dx, F(N * IN));
  float *d_xa = gpu_dup(NULL, F(N * R)), *d_dxa = gpu_dup(NULL, F(N * R));
  int bad = 0;
  lora_proj_forward(lo, 0, tg, out, x, N);
  bad |= cuda_lora_forward(b, d_out, d_xa, d_x, d_A, d_B, N, IN, OUT, R, lo->scale) != 0;
  bad |= check_dev("lora_forward", d_out, out, N * OUT, RT);
  lora_proj_backward(lo, 0, tg, dx, dout, x, N);
  bad |= cuda_lora_backward(b, d_dx, d_dA, d_dB, d_dxa, d_dout, d_x, d_xa, d_A, d_B, N, IN, OUT, R,
                            lo->scale) != 0;
  bad |= check_dev("lora_backward dx", d_dx, dx, N * IN, RT);
  bad |= check_dev("lora_backward dA", d_dA, dp->A, R * IN, RT);
  bad |= check_dev("lora_backward dB", d_dB, dp->B, OUT * R, RT);
  float *ptrs[] = {d_A, d_B, d_dA, d_dB, d_x, d_out, d_dout, d_dx, d_xa, d_dxa};
  for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) cudaFree(ptrs[i]);
  free(x), free(out), free(dout), free(dx);
  lora_free(lo);
  model_free(m);
  return bad;
}

/* Three AdamW steps against optim_step, one span decayed and one not. */
static int test_adamw(cuda_backend_t *b) {
  enum { K = 1000, K0 = 700 };
  optim_config_t oc;
  optim_config_defaults(&oc);
  oc.lr = 1e-3, oc.weight_decay = 0.1, oc.warmup_steps = 0, oc.total_steps = 10;
  char msg[128];
  optim_t *o = optim_new(&oc, K, msg, sizeof msg);
  optim_exclude_decay(o, K0, K - K0);
  float *p = hbuf(K, 32, 1), *g = hbuf(K, 33, 1);
  float *d_p = gpu_dup(p, F(K)), *d_g = gpu_dup(g, F(K));
  float *d_m = gpu_dup(o->m, F(K)), *d_v = gpu_dup(o->v, F(K));
  cuda_adamw_cfg_t cc = {oc.lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay};
  int bad = 0;
  for (int s = 1; s <= 3; s++) {
    double lr = optim_lr_at(&oc, s - 1);
    optim_step(o, p, g, lr, 0.5);
    cc.lr = lr;
    cuda_adamw_step(b, d_p, d_g, d_m, d_v, K0, &cc, s, 0.5, 1);
    cuda_adamw_step(b, d_p + K0, d_g + K0, d_m + K0, d_v + K0, K - K0, &cc, s, 0.5, 0);
  }
  bad |= check_dev("adamw params", d_p, p, K, 1e-6f);
  bad |= check_dev("adamw m", d_m, o->m, K, 1e-6f);
  bad |= check_dev("adamw v", d_v, o->v, K, 1e-6f);
  double ss = 0.0, want = optim_sumsq(g, K);
  bad |= cuda_sumsq(b, d_g, K, &ss) != 0;
  float fs = (float)ss, fw = (float)want;
  bad |= gpu_close("sumsq", &fs, &fw, 1, 1e-6f, 0.0f);
  cudaFree(d_p), cudaFree(d_g), cudaFree(d_m), cudaFree(d_v);
  free(p), free(g);
  optim_free(o);
  return bad;
}

int main(void) {
  gpu_require_device("gpu/kernels");
  cuda_backend_t *b;
  char err[512];
  if (cuda_backend_create(&b, 0, err, sizeof err)) {
    printf("FAIL %s\n", err);
    return 1;
  }
  int bad = 0;
  bad |= test_convert(b);
  bad |= test_matmul(b, TY_DTYPE_F32);
  bad |= test_matmul(b, TY_DTYPE_BF16);
  bad |= test_rmsnorm(b);
  bad |= test_rope(b);
  bad |= test_attention(b);
  bad |= test_swiglu_embed_ce(b);
  bad |= test_lora(b);
  bad |= test_adamw(b);
  if (cuda_backend_sync(b, err, sizeof err)) {
    printf("FAIL %s\n", err);
    bad = 1;
  }
  cuda_backend_free(b);
  printf("gpu/kernels: %s\n", bad ? "FAILED" : "all kernels match the CPU backend");
  return bad ? 1 : 0;
}
