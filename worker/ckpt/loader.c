/* loader.c - a rank's dim-0 shards: the shard layout, the standard and the
 * memory-efficient load paths, and from-scratch initialisation. */
#include "worker/ckpt/loader.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/clock.h"
#include "common/xalloc.h"
#include "common/memstat.h"
#include "worker/ckpt/ckpt_q4.h"
#include "worker/ckpt/quant4.h"
#include "worker/model/weightinit.h"

#define LOADER_ALIGN 64
#define LOADER_MIN_BUCKET 64 /* bytes; tests use tiny buckets to exercise chunking */

bool loader_progress_due(double *last, uint64_t done, uint64_t total) {
  double now = ty_mono_s();
  if (now - *last < 1.0 || done >= total) return false;
  *last = now;
  return true;
}

void loader_rows(int64_t R, int rank, int world, int64_t *row0, int64_t *count) {
  int64_t base = R / world, extra = R % world;
  *count = base + (rank < extra ? 1 : 0);
  *row0 = (int64_t)rank * base + (rank < extra ? rank : extra);
}

/* n elements src (type st) -> dst (type dt), through fp32. Every path of the
 * loader converts with this one function, so their shards are identical. */
static void convert(ty_dtype_t st, const void *src, ty_dtype_t dt, void *dst, size_t n) {
  if (st == dt) {
    memcpy(dst, src, n * ty_dtype_size(st));
  } else if (dt == TY_DTYPE_F32) {
    ty_dtype_to_f32(st, src, dst, n);
  } else if (st == TY_DTYPE_F32) {
    ty_dtype_from_f32(dt, src, dst, n);
  } else { /* half <-> half: widening is exact, so this rounds once */
    float tmp[1024];
    const char *s = src;
    char *d = dst;
    for (size_t i = 0; i < n; i += 1024) {
      size_t k = n - i < 1024 ? n - i : 1024;
      ty_dtype_to_f32(st, s + i * 2, tmp, k);
      ty_dtype_from_f32(dt, tmp, d + i * 2, k);
    }
  }
}

bool loader_q4_kind(int k) {
  return k == CKPT_WQ || k == CKPT_WK || k == CKPT_WV || k == CKPT_WO || k == CKPT_WGATE ||
         k == CKPT_WUP || k == CKPT_WDOWN;
}

static size_t pad4(size_t n) {
  return (n + 3) & ~(size_t)3;
}

void loader_q4_piece(int64_t numel, int rank, int world, bool double_quant, loader_q4_piece_t *p) {
  /* Units of whole (nested) blocks split as rows are; the last unit may be short. */
  const int64_t unit = double_quant ? (int64_t)Q4_BLOCK * Q4_NESTED_BLOCK : Q4_BLOCK;
  int64_t u0, nu;
  loader_rows((numel + unit - 1) / unit, rank, world, &u0, &nu);
  memset(p, 0, sizeof *p);
  p->elem0 = u0 * unit < numel ? u0 * unit : numel;
  p->nelem = (u0 + nu) * unit < numel ? nu * unit : numel - p->elem0;
  p->nblocks = q4_blocks((size_t)p->nelem);
  p->stats_off = pad4(q4_code_bytes((size_t)p->nelem));
  if (double_quant) {
    p->nested_off = p->stats_off + pad4(p->nblocks);
    p->record_bytes =
        p->nested_off + sizeof(float) * ((p->nblocks + Q4_NESTED_BLOCK - 1) / Q4_NESTED_BLOCK);
  } else {
    p->record_bytes = p->stats_off + sizeof(float) * p->nblocks;
  }
}

/* The shard layout: views, offsets and the total size; nothing allocated
 * in placement memory yet. */
static int shard_layout(const llama_config_t *cfg, const loader_opts_t *o, loader_shard_t **out,
                        char *err, size_t errlen) {
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return ty_errf(err, errlen, TY_EINVAL, "rank %d outside world size %d", o->rank, o->world_size);
  if ((unsigned)o->dtype >= TY_DTYPE_COUNT)
    return ty_errf(err, errlen, TY_EINVAL, "unknown shard dtype %d", (int)o->dtype);
  loader_shard_t *s = xcalloc(1, sizeof *s);
  if (ckpt_layout_init(&s->layout, cfg)) {
    free(s);
    return ty_errf(err, errlen, TY_EINVAL, "model sizes out of range for this build");
  }
  s->dtype = o->dtype;
  s->rank = o->rank;
  s->world_size = o->world_size;
  s->pl = o->pl;
  if (o->q4) s->has_q4 = true, s->q4 = *o->q4;
  s->views = xcalloc(s->layout.ntensors + 1, sizeof *s->views);
  size_t off = 0, esz = ty_dtype_size(o->dtype);
  for (size_t i = 0; i < s->layout.ntensors; i++) {
    loader_view_t *v = &s->views[i];
    v->t = &s->layout.tensors[i];
    loader_rows(v->t->rows, o->rank, o->world_size, &v->row0, &v->rows);
    v->offset = off;
    v->nbytes = (size_t)v->rows * (size_t)v->t->cols * esz;
    if (o->q4 && loader_q4_kind(v->t->kind)) {
      v->q4 = true;
      loader_q4_piece(v->t->rows * v->t->cols, o->rank, o->world_size, o->q4->double_quant, &v->q);
      v->nbytes = v->q.record_bytes;
    }
    off += (v->nbytes + LOADER_ALIGN - 1) & ~(size_t)(LOADER_ALIGN - 1);
  }
  s->bytes = off;
  *out = s;
  return 0;
}

uint64_t loader_shard_bytes(const llama_config_t *cfg, int rank, int world, ty_dtype_t dtype) {
  return loader_shard_bytes_q4(cfg, rank, world, dtype, NULL);
}

uint64_t loader_shard_bytes_q4(const llama_config_t *cfg, int rank, int world, ty_dtype_t dtype,
                               const loader_q4_t *q4) {
  loader_opts_t o = {.rank = rank, .world_size = world, .dtype = dtype, .q4 = q4};
  loader_shard_t *s = NULL; /* set on success; NULL also quiets -Wmaybe-uninitialized */
  char err[8];
  if (shard_layout(cfg, &o, &s, err, sizeof err)) return 0;
  uint64_t bytes = s->bytes;
  loader_shard_free(s);
  return bytes;
}

/* Allocates the shard's one placement buffer and points the views into it. */
static int shard_alloc(loader_shard_t *s, char *err, size_t errlen) {
  if (placement_alloc(s->pl, s->bytes, &s->base))
    return ty_errf(err, errlen, TY_EEXHAUSTED,
                   "cannot allocate its %.1f MiB shard on %s (use more ranks)",
                   (double)s->bytes / 1048576.0, s->pl->ops->name);
  for (size_t i = 0; i < s->layout.ntensors; i++)
    s->views[i].data = (char *)s->base + s->views[i].offset;
  return 0;
}

int loader_shard_upload(const loader_shard_t *src, placement_t *pl, loader_shard_t **out, char *err,
                        size_t errlen) {
  *out = NULL;
  if (strcmp(src->pl->ops->name, "cpu"))
    return ty_errf(err, errlen, TY_EINVAL, "a shard on %s is not in host memory",
                   src->pl->ops->name);
  loader_opts_t o = {
      .rank = src->rank, .world_size = src->world_size, .dtype = src->dtype, .pl = pl};
  loader_shard_t *s;
  int rc = shard_layout(&src->layout.cfg, &o, &s, err, errlen);
  if (rc) return rc;
  if (s->bytes != src->bytes) /* cannot happen: one layout rule */
    rc = ty_errf(err, errlen, TY_EINTERNAL, "the copy's layout differs");
  if (!rc) rc = shard_alloc(s, err, errlen);
  if (!rc && s->bytes) {
    int crc = pl->ops->copy_in(pl, s->base, 0, src->base, s->bytes);
    if (placement_finish(pl) || crc) /* the completion point, after a failed copy too */
      rc = ty_errf(err, errlen, TY_EINTERNAL, "copying its shard onto %s failed", pl->ops->name);
  }
  if (rc) {
    loader_shard_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void loader_shard_free(loader_shard_t *s) {
  if (!s) return;
  if (s->base) placement_release(s->pl, s->base, s->bytes);
  ckpt_layout_free(&s->layout);
  free(s->views);
  free(s->q4_maps);
  free(s);
}

const loader_view_t *loader_view(const loader_shard_t *s, ckpt_kind_t kind, int layer) {
  int i = ckpt_layout_index(&s->layout, kind, layer);
  return i < 0 ? NULL : &s->views[i];
}

const loader_view_t *loader_view_by_name(const loader_shard_t *s, const char *name) {
  for (size_t i = 0; i < s->layout.ntensors; i++)
    if (!strcmp(s->views[i].t->name, name)) return &s->views[i];
  return NULL;
}

static void finish_stats(loader_stats_t *st, const loader_shard_t *s, double t0) {
  memstat_t m;
  memstat_read(&m);
  st->host_peak_bytes = m.hwm_bytes;
  st->device_peak_bytes = s->pl->peak;
  st->shard_bytes = s->bytes;
  st->load_seconds = ty_mono_s() - t0;
}

/* The completion point (placement.h), before placement memory is handed
 * on or freed: every copy queued on pl done. rc, the first error so far,
 * is kept; a copy that failed in flight is the error when there was none. */
static int copies_done(placement_t *pl, int rc, const char *what, char *err, size_t errlen) {
  int frc = placement_finish(pl);
  if (frc && !rc) rc = ty_errf(err, errlen, frc, "copying %s to %s failed", what, pl->ops->name);
  return rc;
}

/* --- The staging bucket every path converts through on the host (the
 * placement may be a device): one allocation of fsdp.bucket_mb (at least
 * LOADER_MIN_BUCKET bytes), refused with TY_EEXHAUSTED naming its size. */

typedef struct {
  char *buf;
  size_t bytes;
} bucket_t;

static int bucket_open(bucket_t *b, const loader_opts_t *o, char *err, size_t errlen) {
  b->bytes = o->bucket_bytes < LOADER_MIN_BUCKET ? LOADER_MIN_BUCKET : o->bucket_bytes;
  b->buf = malloc(b->bytes);
  return b->buf ? 0
                : ty_errf(err, errlen, TY_EEXHAUSTED, "cannot allocate a %zu-byte staging bucket",
                          b->bytes);
}

/* Source elements [done, done + m) of one tensor: written into raw (room
 * for m elements of the source dtype), or *src pointed at them elsewhere. */
typedef int (*bucket_src_fn)(void *ctx, size_t done, size_t m, void *raw, const void **src,
                             char *err, size_t errlen);

/* bucket_stream where pl lends its staging buffers (pinned memory on a
 * GPU): each chunk is read, or converted from the bucket, straight into a
 * lent buffer, whose copy is then queued while the next chunk is read. The
 * bucket holds only the raw elements a conversion reads: k x source size
 * <= bucket and k x shard size <= the buffer (k a multiple of 8). */
static int bucket_stream_lent(const bucket_t *b, placement_t *pl, void *dst, size_t off, size_t n,
                              ty_dtype_t sdt, ty_dtype_t ddt, bucket_src_fn fill, void *ctx,
                              const char *what, char *err, size_t errlen) {
  const size_t ssz = ty_dtype_size(sdt), dsz = ty_dtype_size(ddt);
  const bool same = sdt == ddt;
  size_t k = 0;
  int rc = 0;
  for (size_t done = 0; done < n && !rc; done += k) {
    void *buf;
    size_t cap;
    if ((rc = pl->ops->stage(pl, &buf, &cap))) {
      ty_errf(err, errlen, rc, "copying %s to %s failed", what, pl->ops->name);
      break;
    }
    if (!done) {
      k = b->bytes / (same ? dsz : ssz);
      if (cap / dsz < k) k = cap / dsz;
      if (!(k &= ~(size_t)7)) /* cannot happen: both are at least 64 bytes */
        return ty_errf(err, errlen, TY_EINTERNAL, "a %zu-byte staging buffer holds no chunk", cap);
    }
    const size_t m = n - done < k ? n - done : k;
    const void *src;
    if ((rc = fill(ctx, done, m, same ? buf : b->buf, &src, err, errlen))) break;
    if (!same)
      convert(sdt, src, ddt, buf, m);
    else if (src != buf) /* a source already in host memory: the one copy */
      memcpy(buf, src, m * dsz);
    rc = pl->ops->stage_in(pl, dst, off + done * dsz, m * dsz);
    if (rc) ty_errf(err, errlen, rc, "copying %s to %s failed", what, pl->ops->name);
  }
  return rc;
}

/* n elements of dtype sdt from fill, converted to ddt, into dst at byte
 * offset off on placement pl, a bucket at a time: [converted | raw], both
 * k elements (k a multiple of 8, so raw stays aligned; one half when the
 * dtypes are the same), or through pl's own staging buffers where it lends
 * them (bucket_stream_lent). A failed copy says "copying <what> to <pl>
 * failed"; fill's failures keep their own message. The copies may still be
 * queued when it returns (placement.h: the caller's finish). */
static int bucket_stream(const bucket_t *b, placement_t *pl, void *dst, size_t off, size_t n,
                         ty_dtype_t sdt, ty_dtype_t ddt, bucket_src_fn fill, void *ctx,
                         const char *what, char *err, size_t errlen) {
  if (pl->ops->stage)
    return bucket_stream_lent(b, pl, dst, off, n, sdt, ddt, fill, ctx, what, err, errlen);
  const size_t ssz = ty_dtype_size(sdt), dsz = ty_dtype_size(ddt);
  const bool same = sdt == ddt;
  const size_t k = (same ? b->bytes / dsz : b->bytes / (ssz + dsz)) & ~(size_t)7;
  char *conv = b->buf, *raw = same ? b->buf : b->buf + k * dsz;
  int rc = 0;
  for (size_t done = 0; done < n && !rc; done += k) {
    const size_t m = n - done < k ? n - done : k;
    const void *src = raw;
    if ((rc = fill(ctx, done, m, raw, &src, err, errlen))) break;
    const void *out = src;
    if (!same) convert(sdt, src, ddt, conv, m), out = conv;
    rc = pl->ops->copy_in(pl, dst, off + done * dsz, out, m * dsz);
    if (rc) ty_errf(err, errlen, rc, "copying %s to %s failed", what, pl->ops->name);
  }
  return rc;
}

/* One tensor's rows from the checkpoint file. */
typedef struct {
  const ckpt_t *ck;
  const st_tensor_t *ft;
  uint64_t first; /* element of the file tensor where the rows start */
  loader_stats_t *st;
} file_src_t;

static int file_fill(void *ctx, size_t done, size_t m, void *raw, const void **src, char *err,
                     size_t errlen) {
  file_src_t *f = ctx;
  const size_t ssz = ty_dtype_size(f->ft->dtype);
  *src = raw;
  int rc = st_read(f->ck->st, f->ft, (f->first + done) * ssz, raw, m * ssz, err, errlen);
  if (!rc) f->st->bytes_read += m * ssz;
  return rc;
}

/* A tensor already in host memory. */
typedef struct {
  const char *bytes;
  size_t ssz; /* bytes of one element */
} mem_src_t;

static int mem_fill(void *ctx, size_t done, size_t m, void *raw, const void **src, char *err,
                    size_t errlen) {
  (void)m, (void)raw, (void)err, (void)errlen;
  const mem_src_t *t = ctx;
  *src = t->bytes + done * t->ssz;
  return 0;
}

/* Seeded initial weights of one tensor's rows, in float32. */
typedef struct {
  uint64_t stream, first;
  bool is_norm;
} init_src_t;

static int init_fill(void *ctx, size_t done, size_t m, void *raw, const void **src, char *err,
                     size_t errlen) {
  (void)err, (void)errlen;
  const init_src_t *w = ctx;
  winit_fill(w->stream, w->is_norm, w->first + done, raw, m);
  *src = raw;
  return 0;
}

/* A 4-bit piece (v->q) from fill (source dtype sdt) through the bucket:
 * [float32 | raw], a chunk of whole blocks at a time, each quantized
 * straight into v's record (host memory). With double quantization the
 * piece's absmax stay in float32 (a float per 64 elements) until q4->mean
 * gives the tensor-wide mean, then are nested into 8 bits. */
static int quantize_stream(const bucket_t *b, const loader_q4_t *q4, loader_view_t *v,
                           ty_dtype_t sdt, bucket_src_fn fill, void *ctx, char *err,
                           size_t errlen) {
  const size_t ssz = ty_dtype_size(sdt), n = (size_t)v->q.nelem, nb = v->q.nblocks;
  const size_t k = (b->bytes / (ssz + sizeof(float))) & ~(size_t)(Q4_BLOCK - 1);
  if (!k)
    return ty_errf(err, errlen, TY_EINVAL,
                   "fsdp.bucket_mb: a %zu-byte staging bucket holds no block of %d values to "
                   "quantize; give it at least %zu bytes",
                   b->bytes, Q4_BLOCK, (size_t)Q4_BLOCK * (ssz + sizeof(float)));
  uint8_t *rec = v->data;
  memset(rec, 0, v->nbytes); /* the parts' padding too: a record's bytes are all defined */
  float *absmax = q4->double_quant ? malloc((nb ? nb : 1) * sizeof(float))
                                   : (float *)(void *)(rec + v->q.stats_off);
  if (!absmax)
    return ty_errf(err, errlen, TY_EEXHAUSTED, "cannot allocate %zu absmax floats of '%s'", nb,
                   v->t->name);
  float *conv = (float *)(void *)b->buf;
  char *raw = b->buf + k * sizeof(float);
  int rc = 0;
  for (size_t done = 0; done < n && !rc; done += k) {
    const size_t m = n - done < k ? n - done : k;
    const void *src = raw;
    if ((rc = fill(ctx, done, m, raw, &src, err, errlen))) break;
    const float *x = src;
    if (sdt != TY_DTYPE_F32) convert(sdt, src, TY_DTYPE_F32, conv, m), x = conv;
    q4_quantize((q4_type_t)q4->type, x, m, rec + done / 2, absmax + done / Q4_BLOCK);
  }
  /* Every rank asks for every tensor's mean, whatever its share of it. */
  if (!rc && q4->double_quant) {
    float mean = 0.0f;
    rc = q4->mean(q4->mean_ctx, v->t->rows * v->t->cols, absmax, nb, &mean, err, errlen);
    if (!rc) {
      v->q4_offset = mean;
      q4_nest(absmax, nb, mean, rec + v->q.stats_off, (float *)(void *)(rec + v->q.nested_off));
    }
  }
  if (q4->double_quant) free(absmax);
  return rc;
}

/* Bytes [off, off + n) of component c of a 4-bit weight into dst: a
 * pread of that range, or (whole, the standard path) the component read
 * whole into host memory first and the range copied from it. */
static int q4_comp_read(const ckpt_t *ck, const bnb4_info_t *in, bnb4_comp_t c, uint64_t off,
                        void *dst, size_t n, bool whole, loader_stats_t *st, char *err,
                        size_t errlen) {
  const st_tensor_t *t = in->comp[c];
  if (!whole) {
    int rc = st_read(ck->st, t, off, dst, n, err, errlen);
    if (!rc) st->bytes_read += n;
    return rc;
  }
  char *all = malloc(t->nbytes ? t->nbytes : 1);
  if (!all)
    return ty_errf(err, errlen, TY_EEXHAUSTED,
                   "standard load: cannot hold '%s' (%llu bytes) in host memory (try "
                   "fsdp.memory_efficient_load)",
                   t->name, (unsigned long long)t->nbytes);
  int rc = st_read(ck->st, t, 0, all, t->nbytes, err, errlen);
  if (!rc) memcpy(dst, all + off, n), st->bytes_read += t->nbytes;
  free(all);
  return rc;
}

/* The file bytes q4_read_piece reads of a piece: its codes and
 * statistics, and with double quantization the tensor's nested code. */
static uint64_t q4_piece_file_bytes(const loader_q4_piece_t *p, bool double_quant) {
  const uint64_t codes = q4_code_bytes((size_t)p->nelem);
  if (!double_quant) return codes + p->nblocks * sizeof(float);
  return codes + p->nblocks + q4_nested_blocks(p->nblocks) * sizeof(float) + 256 * sizeof(float);
}

/* A rank's piece of a weight a bitsandbytes checkpoint stores in 4 bits,
 * read as it is: its codes, and its blocks' statistics in the file's form
 * (the job's quantization must be the checkpoint's, loader_load checks). */
static int q4_read_piece(const ckpt_t *ck, size_t i, loader_shard_t *s, loader_view_t *v,
                         bool whole, loader_stats_t *st, char *err, size_t errlen) {
  const bnb4_info_t *in = ckpt_q4_info(ck, i);
  const loader_q4_piece_t *p = &v->q;
  const uint64_t b0 = (uint64_t)p->elem0 / Q4_BLOCK;
  char *rec = v->data;
  memset(rec, 0, v->nbytes); /* the parts' padding too: a record's bytes are all defined */
  int rc = q4_comp_read(ck, in, BNB4_CODES, (uint64_t)p->elem0 / 2, rec,
                        q4_code_bytes((size_t)p->nelem), whole, st, err, errlen);
  if (rc || !s->q4.double_quant)
    return rc ? rc
              : q4_comp_read(ck, in, BNB4_ABSMAX, b0 * sizeof(float), rec + p->stats_off,
                             p->nblocks * sizeof(float), whole, st, err, errlen);
  /* The tensor's offset and nested code, on every rank: each dequantizes
   * every rank's piece, its own share empty or not. */
  float *map = s->q4_maps + i * 256;
  v->q4_offset = in->state.offset;
  v->q4_map = map;
  rc = q4_comp_read(ck, in, BNB4_NESTED_QUANT_MAP, 0, map, 256 * sizeof(float), whole, st, err,
                    errlen);
  if (!rc)
    rc = q4_comp_read(ck, in, BNB4_ABSMAX, b0, rec + p->stats_off, p->nblocks, whole, st, err,
                      errlen);
  if (!rc)
    rc = q4_comp_read(ck, in, BNB4_NESTED_ABSMAX, b0 / Q4_NESTED_BLOCK * sizeof(float),
                      rec + p->nested_off, q4_nested_blocks(p->nblocks) * sizeof(float), whole, st,
                      err, errlen);
  return rc;
}

/* A job over a bitsandbytes 4-bit checkpoint keeps its codes as they are:
 * its quantization must be the checkpoint's. */
static int q4_check_ckpt(const ckpt_t *ck, const char *dir, const loader_opts_t *o, char *err,
                         size_t errlen) {
  const bnb4_config_t *c = &ck->q4->cfg;
  const char *type = q4_type_name(c->type);
  if (!o->q4)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s is a bitsandbytes 4-bit checkpoint (%s%s): train adapters over it with "
                   "quantization.load_in_4bit true and use_lora true (QLoRA), or write a float "
                   "copy of it first (trainyard convert --dequantize)",
                   dir, type, c->double_quant ? ", double quantization" : "");
  if ((int)c->type != o->q4->type)
    return ty_errf(err, errlen, TY_EINVAL,
                   "quantization.bnb_4bit_quant_type: %s stores %s codes; set "
                   "bnb_4bit_quant_type to \"%s\"",
                   dir, type, type);
  if (c->double_quant != o->q4->double_quant)
    return ty_errf(err, errlen, TY_EINVAL,
                   "quantization.bnb_4bit_use_double_quant: %s stores its statistics %s; set "
                   "bnb_4bit_use_double_quant to %s",
                   dir, c->double_quant ? "double-quantized" : "in float32",
                   c->double_quant ? "true" : "false");
  return 0;
}

/* Memory-efficient path: this rank's byte range of each tensor, through one
 * bucket: [raw | converted], sized so both halves fit. */
static int load_efficient(const ckpt_t *ck, loader_shard_t *s, const loader_opts_t *o,
                          loader_stats_t *st, char *err, size_t errlen) {
  bucket_t b;
  int rc = bucket_open(&b, o, err, errlen);
  for (size_t i = 0; i < s->layout.ntensors && !rc; i++) {
    loader_view_t *v = &s->views[i];
    const st_tensor_t *ft = ck->file_tensor[i];
    file_src_t f = {ck, ft, (uint64_t)v->row0 * (uint64_t)v->t->cols, st};
    char what[160];
    snprintf(what, sizeof what, "'%s'", v->t->name);
    if (v->q4 && ckpt_q4_info(ck, i)) {
      rc = q4_read_piece(ck, i, s, v, false, st, err, errlen);
    } else if (v->q4) {
      f.first = (uint64_t)v->q.elem0;
      rc = quantize_stream(&b, o->q4, v, ft->dtype, file_fill, &f, err, errlen);
    } else {
      rc = bucket_stream(&b, s->pl, s->base, v->offset, (size_t)v->rows * (size_t)v->t->cols,
                         ft->dtype, s->dtype, file_fill, &f, what, err, errlen);
    }
    if (!rc && o->progress) o->progress(o->progress_ctx, st->bytes_read, st->bytes_total);
  }
  free(b.buf);
  return rc;
}

/* Standard path: the whole checkpoint into host memory, the whole model
 * into placement memory, then this rank's rows into its shard. */
static int load_standard(const ckpt_t *ck, loader_shard_t *s, const loader_opts_t *o,
                         loader_stats_t *st, char *err, size_t errlen) {
  const size_t dsz = ty_dtype_size(s->dtype);
  const size_t nt = s->layout.ntensors;
  size_t *raw_off = xcalloc(nt + 1, sizeof *raw_off), raw_bytes = 0;
  size_t *full_off = xcalloc(nt + 1, sizeof *full_off), full_bytes = 0;
  for (size_t i = 0; i < nt; i++) {
    raw_off[i] = raw_bytes;
    full_off[i] = full_bytes;
    if (ckpt_q4_info(ck, i)) continue; /* a 4-bit weight: read as it is (q4_read_piece) */
    /* Aligned, so that fp32 tensors can be read as floats. */
    raw_bytes += (ck->file_tensor[i]->nbytes + LOADER_ALIGN - 1) & ~(size_t)(LOADER_ALIGN - 1);
    full_bytes += (size_t)ck->file_tensor[i]->nelem * dsz;
  }
  int rc = 0;
  char *raw = malloc(raw_bytes ? raw_bytes : 1);
  void *full = NULL;
  bucket_t stage = {0};
  if (!raw) {
    rc = ty_errf(err, errlen, TY_EEXHAUSTED,
                 "standard load: cannot hold the %.1f MiB checkpoint in host memory (try "
                 "fsdp.memory_efficient_load)",
                 (double)raw_bytes / 1048576.0);
    goto out;
  }
  for (size_t i = 0; i < nt && !rc; i++) {
    const st_tensor_t *ft = ck->file_tensor[i];
    if (ckpt_q4_info(ck, i)) continue;
    rc = st_read(ck->st, ft, 0, raw + raw_off[i], ft->nbytes, err, errlen);
    st->bytes_read += rc ? 0 : ft->nbytes;
    if (!rc && o->progress) o->progress(o->progress_ctx, st->bytes_read, st->bytes_total);
  }
  if (rc) goto out;
  if (placement_alloc(s->pl, full_bytes, &full)) {
    full = NULL;
    rc = ty_errf(err, errlen, TY_EEXHAUSTED,
                 "standard load: cannot place the whole %.1f MiB model on %s (try "
                 "fsdp.memory_efficient_load)",
                 (double)full_bytes / 1048576.0, s->pl->ops->name);
    goto out;
  }
  /* Converted through the bucket. */
  rc = bucket_open(&stage, o, err, errlen);
  for (size_t i = 0; i < nt && !rc; i++) {
    const st_tensor_t *ft = ck->file_tensor[i];
    if (ckpt_q4_info(ck, i)) continue;
    mem_src_t t = {raw + raw_off[i], ty_dtype_size(ft->dtype)};
    rc = bucket_stream(&stage, s->pl, full, full_off[i], ft->nelem, ft->dtype, s->dtype, mem_fill,
                       &t, "the model", err, errlen);
  }
  free(raw);
  raw = NULL;
  if (rc) goto out;
  if ((rc = shard_alloc(s, err, errlen))) {
    ty_errf(err, errlen, rc,
            "cannot allocate its %.1f MiB shard on %s beside the whole %.1f MiB model "
            "that the standard load placed first (set fsdp.memory_efficient_load true: only "
            "the shard is placed; or use more ranks)",
            (double)s->bytes / 1048576.0, s->pl->ops->name, (double)full_bytes / 1048576.0);
    goto out;
  }
  for (size_t i = 0; i < nt && !rc; i++) {
    loader_view_t *v = &s->views[i];
    if (v->q4 && ckpt_q4_info(ck, i)) {
      rc = q4_read_piece(ck, i, s, v, true, st, err, errlen);
      continue;
    }
    if (v->q4) { /* quantized from the whole model, which is in host memory */
      mem_src_t t = {(const char *)full + full_off[i] + (size_t)v->q.elem0 * dsz, dsz};
      rc = quantize_stream(&stage, o->q4, v, s->dtype, mem_fill, &t, err, errlen);
      continue;
    }
    size_t src = full_off[i] + (size_t)v->row0 * (size_t)v->t->cols * dsz;
    rc = s->pl->ops->copy_within(s->pl, s->base, v->offset, full, src, v->nbytes);
    if (rc) ty_errf(err, errlen, rc, "copying the shard on %s failed", s->pl->ops->name);
  }
out:
  rc = copies_done(s->pl, rc, "the model", err, errlen); /* before `full` goes */
  free(stage.buf);
  if (full) placement_release(s->pl, full, full_bytes);
  free(raw);
  free(raw_off);
  free(full_off);
  return rc;
}

int loader_load(const char *dir, const loader_opts_t *o, loader_shard_t **out,
                loader_stats_t *stats, char *err, size_t errlen) {
  *out = NULL;
  loader_stats_t local = {0}, *st = stats ? stats : &local;
  memset(st, 0, sizeof *st);
  double t0 = ty_mono_s();
  ckpt_t *ck;
  int rc = ckpt_open(dir, &ck, err, errlen);
  if (rc) return rc;
  loader_shard_t *s = NULL;
  if (o->q4 && strcmp(o->pl->ops->name, "cpu")) {
    rc = ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                 "4-bit shards are kept in host memory (CPU ranks), not on %s", o->pl->ops->name);
    goto out;
  }
  if (ck->q4 && (rc = q4_check_ckpt(ck, dir, o, err, errlen))) goto out;
  if ((rc = shard_layout(&ck->layout.cfg, o, &s, err, errlen))) goto out;
  if (ck->q4) s->q4_maps = xcalloc(s->layout.ntensors * 256 + 1, sizeof(float));
  if (o->memory_efficient) {
    for (size_t i = 0; i < s->layout.ntensors; i++) {
      const loader_view_t *v = &s->views[i];
      const uint64_t elems =
          v->q4 ? (uint64_t)v->q.nelem : (uint64_t)v->rows * (uint64_t)v->t->cols;
      st->bytes_total += ckpt_q4_info(ck, i) ? q4_piece_file_bytes(&v->q, o->q4->double_quant)
                                             : elems * ty_dtype_size(ck->file_tensor[i]->dtype);
    }
    rc = shard_alloc(s, err, errlen);
    if (!rc) rc = load_efficient(ck, s, o, st, err, errlen);
  } else {
    for (size_t i = 0; i < s->layout.ntensors; i++) {
      const bnb4_info_t *in = ckpt_q4_info(ck, i);
      /* What q4_read_piece reads whole: all but the 4-bit code and the
       * quant_state, which ckpt_open read and checked. */
      for (int c = 0; in && c < BNB4_NCOMP; c++)
        if (c != BNB4_QUANT_MAP && c != BNB4_QUANT_STATE && in->comp[c])
          st->bytes_total += in->comp[c]->nbytes;
      st->bytes_total += in ? 0 : ck->file_tensor[i]->nbytes;
    }
    rc = load_standard(ck, s, o, st, err, errlen);
  }
out:
  ckpt_close(ck);
  if (s) rc = copies_done(s->pl, rc, "the shard", err, errlen);
  if (rc) {
    loader_shard_free(s);
    return rc;
  }
  finish_stats(st, s, t0);
  *out = s;
  return 0;
}

int loader_init_scratch(const llama_config_t *cfg, const loader_opts_t *o, loader_shard_t **out,
                        loader_stats_t *stats, char *err, size_t errlen) {
  *out = NULL;
  loader_stats_t local = {0}, *st = stats ? stats : &local;
  memset(st, 0, sizeof *st);
  double t0 = ty_mono_s();
  loader_shard_t *s;
  if (o->q4)
    return ty_errf(err, errlen, TY_EINVAL,
                   "a 4-bit base is quantized from a pretrained checkpoint, and from scratch there "
                   "is none");
  int rc = shard_layout(cfg, o, &s, err, errlen);
  if (rc) return rc;
  if ((rc = shard_alloc(s, err, errlen))) {
    loader_shard_free(s);
    return rc;
  }
  bucket_t b;
  rc = bucket_open(&b, o, err, errlen);
  for (size_t i = 0; i < s->layout.ntensors && !rc; i++) {
    const loader_view_t *v = &s->views[i];
    init_src_t w = {winit_stream(o->seed, v->t->name), (uint64_t)v->row0 * (uint64_t)v->t->cols,
                    v->t->is_norm};
    rc = bucket_stream(&b, s->pl, s->base, v->offset, (size_t)v->rows * (size_t)v->t->cols,
                       TY_DTYPE_F32, s->dtype, init_fill, &w, "initial weights", err, errlen);
  }
  rc = copies_done(s->pl, rc, "initial weights", err, errlen);
  free(b.buf);
  if (rc) {
    loader_shard_free(s);
    return rc;
  }
  finish_stats(st, s, t0);
  *out = s;
  return 0;
}
