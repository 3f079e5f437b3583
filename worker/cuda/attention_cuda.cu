/* attention_cuda.cu - causal GQA attention on the GPU, backend_cuda.h's
 * cuda_attention_*: in fp32 on CUDA cores, by tiles of query rows or one
 * block per row; or its products on tensor cores (TF32) through batched
 * cuBLAS products over chunks of query rows, given a workspace. */
#include <math.h>
#include <string.h>

#include "worker/cuda/backend_cuda_impl.cuh"

/* ---- causal GQA attention ----
 * Without a (T, T) matrix: scores are recomputed from q and k where they
 * are needed, a tile at a time in shared memory. The forward pass keeps
 * only each row's log-sum-exp; the backward pass rebuilds the
 * probabilities from it and keeps only each row's dout . out (B*NH*T
 * floats of scratch). Two paths: the tiled kernels below (k_flash_*) for
 * head sizes up to ATT_MAX_HS, and one block per row (k_attn_*) for any
 * larger head, whose rows would not fit a tile in shared memory. */

/* The first key query row t of batch row bb may see: its document's first
 * token with positions (pos, B*T, or NULL: one document a row). */
#define FIRST_KEY(t) (pos ? (t)-pos[bb * T + (t)] : 0)

/* The place of a row kernel's block: query row t of head h (kv head kvh)
 * of batch row bb, its q/dout/out offset qo, its kv head's k and v rows. */
#define ROW_PLACE                                                                              \
  const size_t row = blockIdx.x, bb = row / ((size_t)T * NH);                                  \
  const int t = (int)(row % T), h = (int)((row / T) % NH), kvh = h / (NH / NKV), QD = NH * HS; \
  const int KVD = NKV * HS, nt = blockDim.x;                                                   \
  const float scale = 1.0f / sqrtf((float)HS);                                                 \
  const size_t qo = (bb * T + t) * QD + (size_t)h * HS;                                        \
  const float *kb = k + bb * T * KVD + (size_t)kvh * HS, *vb = v + bb * T * KVD + (size_t)kvh * HS

/* One block per (b, h, t) query row. Shared: the query row (HS floats)
 * and one tile's probabilities (blockDim.x floats). Pass 1: the row's
 * max and sum (log-sum-exp); pass 2: out = sum_j p_j v_j by tiles, each
 * thread owning its d's of the output row. */
__global__ void k_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                           const int *pos, int T, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sp = sh + HS;
  ROW_PLACE;
  const int js = FIRST_KEY(t);
  for (int d = threadIdx.x; d < HS; d += nt) sq[d] = q[qo + d];
  __syncthreads();
  const float l = attend_row(out + qo, sq, sp, kb, vb, js, t, KVD, HS, scale);
  if (threadIdx.x == 0) lse[row] = l;
}

/* One block per query row: D = dout . out into dsum, then dq = scale *
 * sum_j p_j (dout . v_j - D) k_j by tiles. Shared: the row's query and
 * dout (2 * HS floats) and one tile's score gradients (blockDim.x). */
__global__ void k_attn_bwd_q(float *dq, float *dsum, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             const int *pos, int T, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sd = sh + HS, *sds = sh + 2 * HS;
  ROW_PLACE;
  const int js = FIRST_KEY(t);
  float part = 0.0f;
  for (int d = threadIdx.x; d < HS; d += nt) {
    sq[d] = q[qo + d], sd[d] = dout[qo + d];
    part += sd[d] * out[qo + d];
  }
  const float D = block_sum(part), l = lse[row]; /* block_sum's barrier orders sq, sd too */
  if (threadIdx.x == 0) dsum[row] = D;
  float *dqt = dq + qo;
  for (int d = threadIdx.x; d < HS; d += nt) dqt[d] = 0.0f;
  for (int j0 = js; j0 <= t; j0 += nt) {
    int j = j0 + threadIdx.x, n = t - j0 + 1 < nt ? t - j0 + 1 : nt;
    float ds = 0.0f;
    if (j <= t) {
      float p = expf(dot_hs(sq, kb + (size_t)j * KVD, HS) * scale - l);
      ds = p * (dot_hs(sd, vb + (size_t)j * KVD, HS) - D);
    }
    __syncthreads(); /* every thread's reads of sq, sd and of the last tile's sds done */
    sds[threadIdx.x] = ds;
    __syncthreads();
    row_accum(dqt, sds, kb + (size_t)j0 * KVD, KVD, n, HS);
  }
  for (int d = threadIdx.x; d < HS; d += nt) dqt[d] *= scale;
}
#undef ROW_PLACE

/* One block per (b, kv head, key j): dk and dv summed over the query heads
 * of the group and the rows t >= j, as the other kernels do, a tile of
 * blockDim.x (head, row) pairs at a time: each thread a pair's score and
 * dout . v_j, then each thread adds the tile into its d's of dk and dv, in
 * pair order. Shared: k_j and v_j (2 * HS floats), one tile's
 * probabilities and score gradients (2 * blockDim.x). */
__global__ void k_attn_bwd_kv(float *dk, float *dv, const float *dout, const float *dsum,
                              const float *lse, const float *q, const float *k, const float *v,
                              const int *pos, int T, int NH, int NKV, int HS) {
  TY_DYN_SHARED(float, sh);
  const int nt = blockDim.x;
  float *skj = sh, *svj = sh + HS, *sp = sh + 2 * HS, *sds = sh + 2 * HS + nt;
  size_t row = blockIdx.x;
  int j = (int)(row % T), kvh = (int)((row / T) % NKV);
  size_t bb = row / ((size_t)T * NKV);
  const int G = NH / NKV, QD = NH * HS, KVD = NKV * HS, rows = T - j, pairs = G * rows;
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t ko = (bb * T + j) * KVD + (size_t)kvh * HS;
  for (int d = threadIdx.x; d < HS; d += nt) {
    skj[d] = k[ko + d], svj[d] = v[ko + d];
    dk[ko + d] = 0.0f, dv[ko + d] = 0.0f;
  }
  __syncthreads();
  /* Pair x: query head kvh * G + x / rows, row j + x % rows. */
#define PAIR_Q(x) ((bb * T + j + (x) % rows) * QD + (size_t)(kvh * G + (x) / rows) * HS)
  for (int x0 = 0; x0 < pairs; x0 += nt) {
    int x = x0 + threadIdx.x, n = pairs - x0 < nt ? pairs - x0 : nt;
    float p = 0.0f, ds = 0.0f;
    if (x < pairs && j >= FIRST_KEY(j + x % rows)) {
      const size_t qi = PAIR_Q(x), ri = (bb * NH + kvh * G + x / rows) * (size_t)T + j + x % rows;
      p = expf(dot_hs(q + qi, skj, HS) * scale - lse[ri]);
      ds = p * (dot_hs(dout + qi, svj, HS) - dsum[ri]);
    }
    __syncthreads(); /* every thread's reads of skj, svj and of the last tile done */
    sp[threadIdx.x] = p, sds[threadIdx.x] = ds;
    __syncthreads();
    for (int d = threadIdx.x; d < HS; d += nt) {
      float ak = 0.0f, av = 0.0f;
      for (int xx = 0; xx < n; xx++) {
        const size_t qi = PAIR_Q(x0 + xx) + d;
        ak += sds[xx] * q[qi], av += sp[xx] * dout[qi];
      }
      dk[ko + d] += ak, dv[ko + d] += av;
    }
  }
#undef PAIR_Q
  for (int d = threadIdx.x; d < HS; d += nt) dk[ko + d] *= scale;
}

/* ---- the tiled path, for head sizes up to 256 (every Llama-family model):
 * FlashAttention's scheme in fp32 on CUDA cores. A block takes a tile of
 * TL query rows of one head (for dk and dv, TL keys of one kv head) with
 * ATT_TPR threads to a row, and walks the other side TL rows at a time
 * through shared memory, so that each k and v row is read from global
 * memory once per tile of queries instead of once per query row. Thread c
 * of a row owns the row's scores at columns c, c + 8, ... of a tile and
 * its output at d = c, c + 8, ... (DPT of them, in registers). Rows in
 * shared memory are 8 * DPT + 1 floats apart: zeros past HS, and an odd
 * stride, so that the eight rows a row's threads read in step lie in
 * distinct banks. Every sum runs in a fixed order, as the row kernels'. */

#define ATT_TPR 8
#define ATT_MAX_HS 256

__host__ __device__ constexpr int att_stride(int dpt) {
  return ATT_TPR * dpt + 1;
}
/* Bytes of shared memory: nbuf row buffers of TL rows, two TL x (TL + 1)
 * tiles of scores and two TL vectors (what the largest kernel uses). */
constexpr size_t att_smem(int dpt, int tl, int nbuf) {
  return ((size_t)nbuf * tl * att_stride(dpt) + 2 * (size_t)tl * (tl + 1) + 2 * (size_t)tl) *
         sizeof(float);
}
/* The largest tile of 32, 16 or 8 rows whose buffers fit CUDA's default
 * 48 KiB of shared memory a block. */
constexpr int att_tile(int dpt, int nbuf) {
  return att_smem(dpt, 32, nbuf) <= (48 << 10)   ? 32
         : att_smem(dpt, 16, nbuf) <= (48 << 10) ? 16
                                                 : 8;
}

/* Rows r0 .. r0 + TL - 1 (of width HS, ld floats apart, T of them) into
 * dst, zero past HS and past T. */
template <int DPT, int TL>
static __device__ void att_load(float *dst, const float *src, size_t ld, int r0, int T, int HS) {
  constexpr int S = att_stride(DPT);
  for (int x = threadIdx.x; x < TL * S; x += TL * ATT_TPR) {
    int rr = x / S, d = x % S;
    dst[x] = d < HS && r0 + rr < T ? src[(size_t)(r0 + rr) * ld + d] : 0.0f;
  }
}

/* s[i] = a . rows[i * ATT_TPR], rows S floats apart (rows already points
 * at this thread's first one). */
template <int DPT, int TL>
static __device__ void att_dots(float *s, const float *a, const float *rows, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR;
  TY_UNROLL
  for (int i = 0; i < KPT; i++) s[i] = 0.0f;
  for (int d = 0; d < HS; d++) {
    const float x = a[d];
    TY_UNROLL
    for (int i = 0; i < KPT; i++) s[i] += x * rows[i * ATT_TPR * S + d];
  }
}

/* acc[i] += sum over jj < n of w[jj] * tile[jj * S + i * ATT_TPR]: a row
 * of weights times a tile (tile already points at this thread's column). */
template <int DPT>
static __device__ void att_accum(float *acc, const float *w, const float *tile, int n) {
  constexpr int S = att_stride(DPT);
  for (int jj = 0; jj < n; jj++) {
    const float x = w[jj], *row = tile + jj * S;
    TY_UNROLL
    for (int i = 0; i < DPT; i++) acc[i] += x * row[i * ATT_TPR];
  }
}

/* dst[c + i * ATT_TPR] = acc[i] * f, for this thread's d below HS. */
template <int DPT>
static __device__ void att_store(float *dst, const float *acc, float f, int c, int HS) {
  TY_UNROLL
  for (int i = 0; i < DPT; i++)
    if (c + i * ATT_TPR < HS) dst[c + i * ATT_TPR] = acc[i] * f;
}

/* Over a row's ATT_TPR threads (adjacent lanes of one warp). */
static __device__ float row_sum(float v) {
  for (int o = ATT_TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ float row_max(float v) {
  for (int o = ATT_TPR / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* The block's place: tile `tile` of TL rows of head-row `hr` (b * NH + h
 * for queries, b * NKV + kvh for keys); this thread's row r and lane c. */
#define ATT_PLACE(nheads, first_longest)                                                   \
  const int ntile = (T + TL - 1) / TL;                                                     \
  const int tile =                                                                         \
      (first_longest) ? ntile - 1 - (int)(blockIdx.x % ntile) : (int)(blockIdx.x % ntile); \
  const size_t hr = blockIdx.x / ntile, bb = hr / (nheads);                                \
  const int r = (int)threadIdx.x / ATT_TPR, c = (int)threadIdx.x % ATT_TPR;                \
  const int QD = NH * HS, KVD = NKV * HS, r0 = tile * TL;                                  \
  const float scale = 1.0f / sqrtf((float)HS)

/* Forward: per key tile, the scores, the row's running max m and sum l
 * (online softmax), then out += p v. Shared: q tile, k then v tile, p. */
template <int DPT, int TL>
__global__ void k_flash_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int *pos, int T, int NH, int NKV, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR, P = TL + 1;
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *skv = sh + TL * S, *sp = sh + 2 * TL * S;
  ATT_PLACE(NH, true); /* the causal rows at the end do the most work */
  const int h = (int)(hr % NH), kvh = h / (NH / NKV), t = r0 + r;
  const int js = t < T ? FIRST_KEY(t) : 0;
  const size_t kvo = bb * T * KVD + (size_t)kvh * HS;
  const int kend = r0 + TL < T ? r0 + TL : T;
  att_load<DPT, TL>(sq, q + bb * T * QD + (size_t)h * HS, QD, r0, T, HS);
  float m = -INFINITY, l = 0.0f, acc[DPT];
  TY_UNROLL
  for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += TL) {
    __syncthreads(); /* q in; the last tile's v and p read */
    att_load<DPT, TL>(skv, k + kvo, KVD, j0, T, HS);
    __syncthreads();
    float s[KPT], mt = -INFINITY, ls = 0.0f;
    att_dots<DPT, TL>(s, sq + r * S, skv + c * S, HS);
    TY_UNROLL
    for (int i = 0; i < KPT; i++) {
      const int j = j0 + c + i * ATT_TPR;
      s[i] = t < T && j <= t && j >= js ? s[i] * scale : -INFINITY;
      mt = fmaxf(mt, s[i]);
    }
    const float mn = fmaxf(m, row_max(mt));
    const float alpha = mn == -INFINITY ? 1.0f : expf(m - mn);
    TY_UNROLL
    for (int i = 0; i < KPT; i++) {
      const float p = s[i] == -INFINITY ? 0.0f : expf(s[i] - mn);
      sp[r * P + c + i * ATT_TPR] = p;
      ls += p;
    }
    l = l * alpha + row_sum(ls), m = mn;
    TY_UNROLL
    for (int i = 0; i < DPT; i++) acc[i] *= alpha;
    __syncthreads(); /* k read, p written */
    att_load<DPT, TL>(skv, v + kvo, KVD, j0, T, HS);
    __syncthreads();
    att_accum<DPT>(acc, sp + r * P, skv + c, kend - j0 < TL ? kend - j0 : TL);
  }
  if (t < T) {
    att_store<DPT>(out + (bb * T + t) * QD + (size_t)h * HS, acc, 1.0f / l, c, HS);
    if (c == 0) lse[hr * T + t] = m + logf(l);
  }
}

/* dq = scale * sum_j p_j (dout . v_j - D) k_j over key tiles, and D =
 * dout . out into dsum for k_flash_bwd_kv. Shared: q, dout, k, v tiles and
 * the score gradients. */
template <int DPT, int TL>
__global__ void k_flash_bwd_q(float *dq, float *dsum, const float *dout, const float *out,
                              const float *lse, const float *q, const float *k, const float *v,
                              const int *pos, int T, int NH, int NKV, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR, P = TL + 1;
  TY_DYN_SHARED(float, sh);
  float *sq = sh, *sdo = sh + TL * S, *sk = sh + 2 * TL * S, *sv = sh + 3 * TL * S;
  float *sds = sh + 4 * TL * S;
  ATT_PLACE(NH, true);
  const int h = (int)(hr % NH), kvh = h / (NH / NKV), t = r0 + r;
  const int js = t < T ? FIRST_KEY(t) : 0;
  const size_t qo = bb * T * QD + (size_t)h * HS, kvo = bb * T * KVD + (size_t)kvh * HS;
  const int kend = r0 + TL < T ? r0 + TL : T;
  att_load<DPT, TL>(sq, q + qo, QD, r0, T, HS);
  att_load<DPT, TL>(sdo, dout + qo, QD, r0, T, HS);
  float D = 0.0f, L = 0.0f, acc[DPT];
  if (t < T) {
    const float *o = out + qo + (size_t)t * QD, *g = dout + qo + (size_t)t * QD;
    for (int d = c; d < HS; d += ATT_TPR) D += g[d] * o[d];
    L = lse[hr * T + t];
  }
  D = row_sum(D);
  if (t < T && c == 0) dsum[hr * T + t] = D;
  TY_UNROLL
  for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += TL) {
    __syncthreads(); /* q, dout in; the last tile's k and ds read */
    att_load<DPT, TL>(sk, k + kvo, KVD, j0, T, HS);
    att_load<DPT, TL>(sv, v + kvo, KVD, j0, T, HS);
    __syncthreads();
    float s[KPT], dp[KPT];
    att_dots<DPT, TL>(s, sq + r * S, sk + c * S, HS);
    att_dots<DPT, TL>(dp, sdo + r * S, sv + c * S, HS);
    TY_UNROLL
    for (int i = 0; i < KPT; i++) {
      const int j = j0 + c + i * ATT_TPR;
      sds[r * P + c + i * ATT_TPR] =
          t < T && j <= t && j >= js ? expf(s[i] * scale - L) * (dp[i] - D) : 0.0f;
    }
    __syncthreads();
    att_accum<DPT>(acc, sds + r * P, sk + c, kend - j0 < TL ? kend - j0 : TL);
  }
  if (t < T) att_store<DPT>(dq + qo + (size_t)t * QD, acc, scale, c, HS);
}

/* dk and dv of a tile of TL keys of one kv head, summed over the group's
 * query heads and, by tiles, the rows t >= the tile's first key: dv +=
 * p dout_t, dk += scale * ds q_t. Shared: the keys' k and v, one tile's q
 * and dout, its p and ds, and its rows' lse and D. */
template <int DPT, int TL>
__global__ void k_flash_bwd_kv(float *dk, float *dv, const float *dout, const float *dsum,
                               const float *lse, const float *q, const float *k, const float *v,
                               const int *pos, int T, int NH, int NKV, int HS) {
  constexpr int S = att_stride(DPT), KPT = TL / ATT_TPR, P = TL + 1;
  TY_DYN_SHARED(float, sh);
  float *sk = sh, *sv = sh + TL * S, *sq = sh + 2 * TL * S, *sdo = sh + 3 * TL * S;
  float *sp = sh + 4 * TL * S, *sds = sp + TL * P, *sl = sds + TL * P, *sd = sl + TL;
  ATT_PLACE(NKV, false); /* the causal keys at the start do the most work */
  const int kvh = (int)(hr % NKV), G = NH / NKV, j = r0 + r;
  const size_t kvo = bb * T * KVD + (size_t)kvh * HS;
  att_load<DPT, TL>(sk, k + kvo, KVD, r0, T, HS);
  att_load<DPT, TL>(sv, v + kvo, KVD, r0, T, HS);
  float ak[DPT], av[DPT];
  TY_UNROLL
  for (int i = 0; i < DPT; i++) ak[i] = 0.0f, av[i] = 0.0f;
  for (int g = 0; g < G; g++) {
    const size_t bh = bb * NH + (size_t)kvh * G + g, qo = bb * T * QD + (bh % NH) * HS;
    for (int q0 = r0; q0 < T; q0 += TL) {
      __syncthreads(); /* k, v in; the last tile's q, dout, p, ds read */
      att_load<DPT, TL>(sq, q + qo, QD, q0, T, HS);
      att_load<DPT, TL>(sdo, dout + qo, QD, q0, T, HS);
      if ((int)threadIdx.x < TL) {
        const int tt = q0 + (int)threadIdx.x;
        sl[threadIdx.x] = tt < T ? lse[bh * T + tt] : 0.0f;
        sd[threadIdx.x] = tt < T ? dsum[bh * T + tt] : 0.0f;
      }
      __syncthreads();
      float s[KPT], dp[KPT];
      att_dots<DPT, TL>(s, sk + r * S, sq + c * S, HS);
      att_dots<DPT, TL>(dp, sv + r * S, sdo + c * S, HS);
      TY_UNROLL
      for (int i = 0; i < KPT; i++) {
        const int x = c + i * ATT_TPR, tt = q0 + x;
        const float p = tt < T && j <= tt && j >= FIRST_KEY(tt) ? expf(s[i] * scale - sl[x]) : 0.0f;
        sp[r * P + x] = p, sds[r * P + x] = p * (dp[i] - sd[x]);
      }
      __syncthreads();
      const int n = T - q0 < TL ? T - q0 : TL;
      att_accum<DPT>(av, sp + r * P, sdo + c, n);
      att_accum<DPT>(ak, sds + r * P, sq + c, n);
    }
  }
  if (j < T) {
    att_store<DPT>(dk + kvo + (size_t)j * KVD, ak, scale, c, HS);
    att_store<DPT>(dv + kvo + (size_t)j * KVD, av, 1.0f, c, HS);
  }
}
#undef ATT_PLACE

/* Launches of the tiled kernels for one DPT. */
template <int DPT>
static void flash_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int *pos, int B, int T, int NH, int NKV, int HS) {
  constexpr int TL = att_tile(DPT, 2);
  void (*k_fwd)(float *, float *, const float *, const float *, const float *, const int *, int,
                int, int, int) = k_flash_fwd<DPT, TL>;
  const size_t blocks = (size_t)(T + TL - 1) / TL * B * NH;
  TY_LAUNCH(k_fwd, (unsigned)blocks, TL * ATT_TPR, att_smem(DPT, TL, 2))
  (out, lse, q, k, v, pos, T, NH, NKV, HS);
}
template <int DPT>
static void flash_backward(float *dq, float *dk, float *dv, float *dsum, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k,
                           const float *v, const int *pos, int B, int T, int NH, int NKV, int HS) {
  constexpr int TL = att_tile(DPT, 4);
  void (*k_bwd_q)(float *, float *, const float *, const float *, const float *, const float *,
                  const float *, const float *, const int *, int, int, int, int) =
      k_flash_bwd_q<DPT, TL>;
  void (*k_bwd_kv)(float *, float *, const float *, const float *, const float *, const float *,
                   const float *, const float *, const int *, int, int, int, int) =
      k_flash_bwd_kv<DPT, TL>;
  const size_t tiles = (size_t)(T + TL - 1) / TL;
  TY_LAUNCH(k_bwd_q, (unsigned)(tiles * B * NH), TL * ATT_TPR, att_smem(DPT, TL, 4))
  (dq, dsum, dout, out, lse, q, k, v, pos, T, NH, NKV, HS);
  TY_LAUNCH(k_bwd_kv, (unsigned)(tiles * B * NKV), TL * ATT_TPR, att_smem(DPT, TL, 4))
  (dk, dv, dout, dsum, lse, q, k, v, pos, T, NH, NKV, HS);
}

/* The tiled kernels' DPT for a head size: the least power of two >=
 * HS / ATT_TPR (at least 2), or 0 for the row kernels (past ATT_MAX_HS,
 * or when the backend asks for them). */
static int flash_dpt(const cuda_backend_t *b, int HS) {
  if (HS > ATT_MAX_HS || b->attn_rows) return 0;
  int dpt = 2;
  while (dpt * ATT_TPR < HS) dpt *= 2;
  return dpt;
}

/* ---- the TF32 path: attention's products on tensor cores ----
 * cublasGemmBatchedEx with TF32 operands (fp32's exponent and 10 of its 23
 * mantissa bits) and fp32 accumulation, one product per (b, head) pair of
 * a batch, over chunks of query rows [r0, r1): a chunk's scores (n x r1 a
 * pair, the keys past r1 being masked anyway) lie in the caller's
 * workspace, never a (T, T) matrix. Forward: S = scale q k^T; a row kernel
 * makes S the probabilities P and keeps each row's lse; out = P v.
 * Backward: each row's D = dout . out; per chunk S again and dP = dout
 * v^T, then P and dS = P (dP - D) elementwise, dq = scale dS k, and for
 * each query head i of a kv group in turn dv += P^T dout and dk += scale
 * dS^T q over the batch of (b, kv head) pairs (the results of one batch
 * must not overlap). The workspace: three pointer arrays (A, B, C of a
 * batch, written by a kernel before each product), then two score
 * buffers. */

#define TC_MIN_ROWS 16

/* An operand of a batch: entry e is pair (e / per_b, x = e % per_b), its
 * matrix at base + (e / per_b) * sb + (x / div) * sx floats. */
struct tc_op {
  const float *base;
  size_t sb, sx;
  int div;
};
static tc_op tc_at(const float *base, size_t sb, size_t sx, int div) {
  tc_op o = {base, sb, sx, div};
  return o;
}

static __device__ const float *tc_ptr(const tc_op &o, int e, int per_b) {
  return o.base + (size_t)(e / per_b) * o.sb + (size_t)(e % per_b / o.div) * o.sx;
}
__global__ void k_tc_ptrs(const float **arr, tc_op a, tc_op b, tc_op c, int per_b, int count) {
  int e = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= count) return;
  arr[e] = tc_ptr(a, e, per_b);
  arr[count + e] = tc_ptr(b, e, per_b);
  arr[2 * count + e] = tc_ptr(c, e, per_b);
}

/* Bytes of the pointer arrays for `count` products, kept a multiple of 256
 * so that the score buffers after them stay aligned. */
static size_t tc_ptr_bytes(size_t count) {
  return (3 * count * sizeof(void *) + 255) / 256 * 256;
}

/* Column-major C = alpha op(A) op(B) + beta C for each of `count` entries
 * (as gemm), the operands' places from A, B and C. */
static int tc_gemm(cuda_backend_t *b, const float **arr, int count, int per_b, cublasOperation_t ta,
                   cublasOperation_t tb, int m, int n, int k, float alpha, tc_op A, int lda,
                   tc_op B, int ldb, float beta, tc_op C, int ldc) {
  TY_LAUNCH(k_tc_ptrs, cb_blocks((size_t)count), CB_THREADS, 0)(arr, A, B, C, per_b, count);
  cublasStatus_t s = g_blas.gemm_batched(
      b->blas, ta, tb, m, n, k, &alpha, (const void *const *)arr, CUDA_R_32F, lda,
      (const void *const *)(arr + count), CUDA_R_32F, ldb, &beta, (void *const *)(arr + 2 * count),
      CUDA_R_32F, ldc, count, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? 0 : TY_EINTERNAL;
}

/* Row x of pair e of a forward chunk (one block a row, its n x r1 scores
 * at S + (e * n + x) * r1): the causal row t = r0 + x's log-sum-exp into
 * lse, and its probabilities in place (0 past t). */
__global__ void k_tc_softmax(float *S, float *lse, const int *pos, int n, int r1, int r0, int T,
                             int NH) {
  const size_t row = blockIdx.x, e = row / n, bb = e / NH;
  const int t = r0 + (int)(row % n), nt = blockDim.x, js = FIRST_KEY(t);
  float *s = S + row * r1;
  float mx = -INFINITY, sum = 0.0f;
  for (int j = js + threadIdx.x; j <= t; j += nt) mx = fmaxf(mx, s[j]);
  const float M = block_max(mx);
  for (int j = js + threadIdx.x; j <= t; j += nt) sum += expf(s[j] - M);
  const float l = M + logf(block_sum(sum));
  for (int j = threadIdx.x; j < r1; j += nt) s[j] = j <= t && j >= js ? expf(s[j] - l) : 0.0f;
  if (threadIdx.x == 0) lse[e * T + t] = l;
}

/* D = dout . out of each (b, h, t) row, a warp a row. */
__global__ void k_tc_dsum(float *dsum, const float *dout, const float *out, int T, int NH, int HS,
                          size_t rows) {
  const size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = (int)(threadIdx.x & 31);
  if (row >= rows) return; /* the whole warp: its lanes share the row */
  const size_t t = row % T, h = row / T % NH, bb = row / ((size_t)T * NH);
  const size_t o = (bb * T + t) * (size_t)NH * HS + h * HS;
  float p = 0.0f;
  for (int d = lane; d < HS; d += 32) p += dout[o + d] * out[o + d];
  p = warp_sum(p);
  if (lane == 0) dsum[row] = p;
}

/* A backward chunk's scores S (scaled) and dP = dout v^T, elementwise: S
 * becomes P, dP becomes dS = P (dP - D). */
__global__ void k_tc_dsoft(float *S, float *dP, const float *lse, const float *dsum, const int *pos,
                           int n, int r1, int r0, int T, int NH, size_t total) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const size_t row = i / r1, e = row / n, bb = e / NH;
  const int j = (int)(i % r1), t = r0 + (int)(row % n);
  const float p = j <= t && j >= FIRST_KEY(t) ? expf(S[i] - lse[e * T + t]) : 0.0f;
  S[i] = p;
  dP[i] = p * (dP[i] - dsum[e * T + t]);
}

extern "C" size_t cuda_attention_tf32_bytes(int B, int T, int NH, size_t budget) {
  const size_t pairs = (size_t)B * NH, row = 2 * pairs * (size_t)T * sizeof(float);
  size_t rows = budget / (row ? row : 1);
  const size_t least = (size_t)T < TC_MIN_ROWS ? (size_t)T : TC_MIN_ROWS;
  if (rows < least) rows = least;
  if (rows > (size_t)T) rows = (size_t)T;
  return tc_ptr_bytes(pairs) + rows * row;
}

/* Score floats a pair of nbuf buffers may take, or 0 when the workspace
 * cannot hold one row of T keys (the call then takes the fp32 path). */
static size_t tc_cap(const void *ws, size_t bytes, int B, int T, int NH, int nbuf) {
  const size_t pairs = (size_t)B * NH, ptrs = tc_ptr_bytes(pairs);
  if (!ws || bytes < ptrs) return 0;
  const size_t cap = (bytes - ptrs) / (nbuf * pairs * sizeof(float));
  return cap >= (size_t)T ? cap : 0;
}

/* The next chunk's rows from r0: the most n with n * (r0 + n) <= cap (its
 * scores), a multiple of TC_MIN_ROWS unless it runs to T. cap >= T, so
 * that one row always fits. */
static int tc_rows(int r0, int T, size_t cap) {
  const int left = T - r0;
  if ((size_t)left * T <= cap) return left;
  int n = (int)((sqrt((double)r0 * r0 + 4.0 * (double)cap) - r0) / 2);
  while (n > 1 && (size_t)n * (size_t)(r0 + n) > cap) n--;
  while (n < left && (size_t)(n + 1) * (size_t)(r0 + n + 1) <= cap) n++;
  if (n >= left) return left;
  if (n >= TC_MIN_ROWS) n -= n % TC_MIN_ROWS;
  return n < 1 ? 1 : n;
}

/* One call's shape and its current chunk: rows [r0, r1) of T, n of them,
 * each pair's scores n x r1 (chunk floats) in the workspace. */
typedef struct {
  cuda_backend_t *b;
  const float **arr; /* the workspace's pointer arrays */
  float *S;          /* its score buffers, after them */
  int B, T, NH, NKV, HS, G;
  size_t QD, KVD;
  float scale; /* 1 / sqrt(HS) */
  int r0, n, r1;
  size_t chunk;
} tc_chunk_t;

static tc_chunk_t tc_start(cuda_backend_t *b, void *ws, int B, int T, int NH, int NKV, int HS) {
  tc_chunk_t c;
  memset(&c, 0, sizeof c);
  c.b = b, c.arr = (const float **)ws;
  c.S = (float *)((char *)ws + tc_ptr_bytes((size_t)B * NH));
  c.B = B, c.T = T, c.NH = NH, c.NKV = NKV, c.HS = HS, c.G = NH / NKV;
  c.QD = (size_t)NH * HS, c.KVD = (size_t)NKV * HS;
  c.scale = 1.0f / sqrtf((float)HS);
  return c;
}
/* The next chunk from r0: as many rows as cap (score floats a pair) holds. */
static void tc_next(tc_chunk_t *c, int r0, size_t cap) {
  c->r0 = r0, c->n = tc_rows(r0, c->T, cap), c->r1 = r0 + c->n;
  c->chunk = (size_t)c->n * c->r1;
}
/* The chunk's scores of every pair in S, as an operand. */
static tc_op tc_scores_at(const tc_chunk_t *c, const float *S) {
  return tc_at(S, c->NH * c->chunk, c->chunk, 1);
}

/* S (n, r1) = alpha x[r0:r1] y[0:r1]^T for every pair: x query-side (q or
 * dout), y kv-side (k or v). */
static int tc_rows_by_keys(const tc_chunk_t *c, float alpha, const float *x, const float *y,
                           float *S) {
  return tc_gemm(c->b, c->arr, c->B * c->NH, c->NH, CUBLAS_OP_T, CUBLAS_OP_N, c->r1, c->n, c->HS,
                 alpha, tc_at(y, c->T * c->KVD, c->HS, c->G), (int)c->KVD,
                 tc_at(x + c->r0 * c->QD, c->T * c->QD, c->HS, 1), (int)c->QD, 0.0f,
                 tc_scores_at(c, S), c->r1);
}
/* x[r0:r1] = alpha S y[0:r1] for every pair: out from P and v, dq from dS
 * and k. */
static int tc_scores_by_kv(const tc_chunk_t *c, float alpha, const float *S, const float *y,
                           float *x) {
  return tc_gemm(c->b, c->arr, c->B * c->NH, c->NH, CUBLAS_OP_N, CUBLAS_OP_N, c->HS, c->n, c->r1,
                 alpha, tc_at(y, c->T * c->KVD, c->HS, c->G), (int)c->KVD, tc_scores_at(c, S),
                 c->r1, 0.0f, tc_at(x + c->r0 * c->QD, c->T * c->QD, c->HS, 1), (int)c->QD);
}
/* y[0:r1] += alpha S^T x[r0:r1] for query head i of every (b, kv head), a
 * batch whose results do not overlap: dv from P and dout, dk from dS and q. */
static int tc_scores_t_by_rows(const tc_chunk_t *c, int i, float alpha, const float *S,
                               const float *x, float *y) {
  const size_t off = c->r0 * c->QD + (size_t)i * c->HS;
  return tc_gemm(c->b, c->arr, c->B * c->NKV, c->NKV, CUBLAS_OP_N, CUBLAS_OP_T, c->HS, c->r1, c->n,
                 alpha, tc_at(x + off, c->T * c->QD, (size_t)c->G * c->HS, 1), (int)c->QD,
                 tc_at(S + i * c->chunk, c->NH * c->chunk, c->G * c->chunk, 1), c->r1, 1.0f,
                 tc_at(y, c->T * c->KVD, c->HS, 1), (int)c->KVD);
}

static int tc_forward(cuda_backend_t *b, void *ws, size_t cap, float *out, float *lse,
                      const float *q, const float *k, const float *v, const int *pos, int B, int T,
                      int NH, int NKV, int HS) {
  tc_chunk_t c = tc_start(b, ws, B, T, NH, NKV, HS);
  float *S = c.S;
  int rc = 0;
  for (int r0 = 0; !rc && r0 < T; r0 = c.r1) {
    tc_next(&c, r0, cap);
    rc = tc_rows_by_keys(&c, c.scale, q, k, S);
    if (rc) break;
    TY_LAUNCH(k_tc_softmax, (unsigned)((size_t)B * NH * c.n), 128, 0)
    (S, lse, pos, c.n, c.r1, r0, T, NH);
    rc = tc_scores_by_kv(&c, 1.0f, S, v, out); /* out = P v */
  }
  return rc;
}

static int tc_backward(cuda_backend_t *b, void *ws, size_t cap, float *dq, float *dk, float *dv,
                       float *dsum, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const int *pos, int B, int T,
                       int NH, int NKV, int HS) {
  tc_chunk_t c = tc_start(b, ws, B, T, NH, NKV, HS);
  const size_t count = (size_t)B * NH, rows = count * T;
  const float scale = c.scale;
  float *S = c.S, *dP = S + count * cap;
  if (cudaMemsetAsync(dk, 0, (size_t)B * T * c.KVD * sizeof(float), 0) != cudaSuccess ||
      cudaMemsetAsync(dv, 0, (size_t)B * T * c.KVD * sizeof(float), 0) != cudaSuccess)
    return TY_EINTERNAL;
  TY_LAUNCH(k_tc_dsum, cb_blocks(rows * 32), CB_THREADS, 0)(dsum, dout, out, T, NH, HS, rows);
  int rc = 0;
  for (int r0 = 0; !rc && r0 < T; r0 = c.r1) {
    tc_next(&c, r0, cap);
    rc = tc_rows_by_keys(&c, scale, q, k, S);
    if (!rc) rc = tc_rows_by_keys(&c, 1.0f, dout, v, dP);
    if (rc) break;
    const size_t total = count * c.chunk;
    TY_LAUNCH(k_tc_dsoft, cb_blocks(total), CB_THREADS, 0)
    (S, dP, lse, dsum, pos, c.n, c.r1, r0, T, NH, total);
    rc = tc_scores_by_kv(&c, scale, dP, k, dq); /* dq = scale dS k */
    for (int i = 0; !rc && i < c.G; i++) {
      rc = tc_scores_t_by_rows(&c, i, 1.0f, S, dout, dv);         /* dv += P^T dout */
      if (!rc) rc = tc_scores_t_by_rows(&c, i, scale, dP, q, dk); /* dk += scale dS^T q */
    }
  }
  return rc;
}

static unsigned row_threads(int width) {
  unsigned t = (unsigned)((width + 31) / 32 * 32);
  return t < 64 ? 64 : t > 256 ? 256 : t;
}

extern "C" int cuda_attention_forward(cuda_backend_t *b, void *ws, size_t ws_bytes, float *out,
                                      float *lse, const float *q, const float *k, const float *v,
                                      const int *pos, int B, int T, int NH, int NKV, int HS) {
  size_t rows = (size_t)B * NH * T;
  const size_t cap = rows ? tc_cap(ws, ws_bytes, B, T, NH, 1) : 0;
  CB_PROFILE(b, cap ? CUDA_OP_ATTN_FWD_TF32 : CUDA_OP_ATTN_FWD_F32);
  if (!rows) return 0;
  if (cap) return tc_forward(b, ws, cap, out, lse, q, k, v, pos, B, T, NH, NKV, HS);
#define FLASH_FWD(dpt)                                             \
  case dpt:                                                        \
    flash_forward<dpt>(out, lse, q, k, v, pos, B, T, NH, NKV, HS); \
    return 0
  switch (flash_dpt(b, HS)) {
    FLASH_FWD(2);
    FLASH_FWD(4);
    FLASH_FWD(8);
    FLASH_FWD(16);
    FLASH_FWD(32);
  }
#undef FLASH_FWD
  unsigned nt = row_threads(T);
  TY_LAUNCH(k_attn_fwd, (unsigned)rows, nt, (HS + nt) * sizeof(float))
  (out, lse, q, k, v, pos, T, NH, NKV, HS);
  return 0;
}

extern "C" int cuda_attention_backward(cuda_backend_t *b, void *ws, size_t ws_bytes, float *dq,
                                       float *dk, float *dv, float *scratch, const float *dout,
                                       const float *out, const float *lse, const float *q,
                                       const float *k, const float *v, const int *pos, int B, int T,
                                       int NH, int NKV, int HS) {
  size_t rows = (size_t)B * NH * T, kvrows = (size_t)B * NKV * T;
  const size_t cap = rows ? tc_cap(ws, ws_bytes, B, T, NH, 2) : 0;
  CB_PROFILE(b, cap ? CUDA_OP_ATTN_BWD_TF32 : CUDA_OP_ATTN_BWD_F32);
  if (!rows) return 0;
  if (cap)
    return tc_backward(b, ws, cap, dq, dk, dv, scratch, dout, out, lse, q, k, v, pos, B, T, NH, NKV,
                       HS);
#define FLASH_BWD(dpt)                                                                         \
  case dpt:                                                                                    \
    flash_backward<dpt>(dq, dk, dv, scratch, dout, out, lse, q, k, v, pos, B, T, NH, NKV, HS); \
    return 0
  switch (flash_dpt(b, HS)) {
    FLASH_BWD(2);
    FLASH_BWD(4);
    FLASH_BWD(8);
    FLASH_BWD(16);
    FLASH_BWD(32);
  }
#undef FLASH_BWD
  unsigned nt = row_threads(T);
  TY_LAUNCH(k_attn_bwd_q, (unsigned)rows, nt, (2 * HS + nt) * sizeof(float))
  (dq, scratch, dout, out, lse, q, k, v, pos, T, NH, NKV, HS);
  TY_LAUNCH(k_attn_bwd_kv, (unsigned)kvrows, nt, (2 * HS + 2 * nt) * sizeof(float))
  (dk, dv, dout, scratch, lse, q, k, v, pos, T, NH, NKV, HS);
  return 0;
}
