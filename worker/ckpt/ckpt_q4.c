/* ckpt_q4.c - a bitsandbytes 4-bit checkpoint opened, matched and read as
 * floats or as its statistics; see ckpt_q4.h. */
#include "worker/ckpt/ckpt_q4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"

int ckpt_q4_open(ckpt_t *c, const char *dir, const json_t *qc, char *err, size_t errlen) {
  char msg[768];
  ckpt_q4_t *q = xcalloc(1, sizeof *q);
  c->q4 = q;
  int rc = bnb4_config_parse(qc, &q->cfg, msg, sizeof msg);
  if (rc) return ty_errf(err, errlen, rc, "%s/config.json: quantization_config: %s", dir, msg);
  if ((rc = st_open_flags(dir, ST_OPEN_U8, &c->st, msg, sizeof msg)))
    return ty_errf(err, errlen, rc, "%s", msg);
  c->file_tensor = xcalloc(c->layout.ntensors + 1, sizeof *c->file_tensor);
  q->info = xcalloc(c->layout.ntensors + 1, sizeof *q->info);
  if ((rc = bnb4_match(&c->layout, c->st, c->file_tensor, q->info, &q->nq4, msg, sizeof msg)))
    return ty_errf(err, errlen, rc, "%s: %s", dir, msg);
  for (size_t i = 0; i < c->layout.ntensors; i++) {
    const bnb4_info_t *in = &q->info[i];
    if (in->q4 && (in->state.type != q->cfg.type || in->state.nested != q->cfg.double_quant))
      return ty_errf(err, errlen, TY_EINVAL,
                     "%s: tensor '%s' is stored %s%s, and config.json's quantization_config says "
                     "%s%s",
                     dir, c->layout.tensors[i].name, q4_type_name(in->state.type),
                     in->state.nested ? " with double quantization" : "", q4_type_name(q->cfg.type),
                     q->cfg.double_quant ? " with double quantization" : "");
  }
  return 0;
}

void ckpt_q4_free(ckpt_q4_t *q) {
  if (!q) return;
  free(q->info);
  free(q);
}

const bnb4_info_t *ckpt_q4_info(const ckpt_t *c, size_t i) {
  return c->q4 && i < c->layout.ntensors && c->q4->info[i].q4 ? &c->q4->info[i] : NULL;
}

int ckpt_q4_read_absmax(const ckpt_t *c, size_t i, uint64_t b0, size_t nb, float *absmax, char *err,
                        size_t errlen) {
  const bnb4_info_t *in = ckpt_q4_info(c, i);
  if (!in || b0 + nb > in->nblocks)
    return ty_errf(err, errlen, TY_EINTERNAL, "tensor %zu has no 4-bit blocks [%llu, +%zu)", i,
                   (unsigned long long)b0, nb);
  if (!in->state.nested)
    return st_read(c->st, in->comp[BNB4_ABSMAX], b0 * sizeof(float), absmax, nb * sizeof(float),
                   err, errlen);
  /* Nested: the 8-bit codes of these blocks and the absmax of every nested
   * block they touch, decoded with the file's own map. */
  const uint64_t n0 = b0 / Q4_NESTED_BLOCK;
  const size_t nn = nb ? (size_t)((b0 + nb - 1) / Q4_NESTED_BLOCK - n0 + 1) : 0;
  uint8_t *codes = malloc(nb ? nb : 1);
  float *nested = malloc((nn ? nn : 1) * sizeof(float)), map[256];
  int rc = codes && nested ? 0
                           : ty_errf(err, errlen, TY_EEXHAUSTED,
                                     "cannot allocate the statistics of %zu blocks", nb);
  if (!rc) rc = st_read(c->st, in->comp[BNB4_ABSMAX], b0, codes, nb, err, errlen);
  if (!rc)
    rc = st_read(c->st, in->comp[BNB4_NESTED_ABSMAX], n0 * sizeof(float), nested,
                 nn * sizeof(float), err, errlen);
  if (!rc) rc = st_read(c->st, in->comp[BNB4_NESTED_QUANT_MAP], 0, map, sizeof map, err, errlen);
  for (size_t k = 0; k < nb && !rc; k++) {
    /* Block b0 + k is in nested block (b0 + k) / 256. */
    const size_t j = (size_t)((b0 + k) / Q4_NESTED_BLOCK - n0);
    q4_unnest_with(map, codes + k, nested + j, 1, in->state.offset, absmax + k);
  }
  free(codes);
  free(nested);
  return rc;
}

int ckpt_read_f32(const ckpt_t *c, size_t i, float *dst, char *err, size_t errlen) {
  const st_tensor_t *ft = c->file_tensor[i];
  const bnb4_info_t *in = ckpt_q4_info(c, i);
  if (!in) {
    if (ft->dtype == TY_DTYPE_F32) return st_read(c->st, ft, 0, dst, ft->nbytes, err, errlen);
    /* A half type fits in the back half of dst, widened from the front. */
    char *half = (char *)dst + ft->nelem * (sizeof(float) - ty_dtype_size(ft->dtype));
    int rc = st_read(c->st, ft, 0, half, ft->nbytes, err, errlen);
    if (rc) return rc;
    float tmp[1024];
    for (uint64_t at = 0; at < ft->nelem; at += 1024) {
      size_t k = ft->nelem - at < 1024 ? (size_t)(ft->nelem - at) : 1024;
      ty_dtype_to_f32(ft->dtype, half + at * ty_dtype_size(ft->dtype), tmp, k);
      memcpy(dst + at, tmp, k * sizeof(float));
    }
    return 0;
  }
  const size_t n = (size_t)in->nelem, cb = q4_code_bytes(n), nb = (size_t)in->nblocks;
  uint8_t *codes = malloc(cb ? cb : 1);
  float *absmax = malloc((nb ? nb : 1) * sizeof(float));
  int rc = codes && absmax ? 0
                           : ty_errf(err, errlen, TY_EEXHAUSTED,
                                     "cannot allocate the codes of '%s' to dequantize", ft->name);
  if (!rc) rc = st_read(c->st, ft, 0, codes, cb, err, errlen);
  if (!rc) rc = ckpt_q4_read_absmax(c, i, 0, nb, absmax, err, errlen);
  if (!rc) {
    q4_dequantize(in->state.type, codes, absmax, n, dst);
    ty_dtype_round(c->q4->cfg.compute_dtype, dst, n);
  }
  free(codes);
  free(absmax);
  return rc;
}

int ckpt_q4_roundtrip(const ckpt_q4_kind_t *k, float *x, size_t n) {
  const size_t nb = q4_blocks(n);
  uint8_t *codes = malloc(q4_code_bytes(n) + 1), *qabs = NULL;
  float *absmax = malloc((nb + 1) * sizeof(float)), *nested = NULL;
  int rc = codes && absmax ? 0 : TY_EEXHAUSTED;
  if (!rc) q4_quantize(k->type, x, n, codes, absmax);
  if (!rc && k->double_quant) {
    qabs = malloc(nb + 1);
    nested = malloc((q4_nested_blocks(nb) + 1) * sizeof(float));
    if (!qabs || !nested) {
      rc = TY_EEXHAUSTED;
    } else {
      const float offset = q4_mean(absmax, nb);
      q4_nest(absmax, nb, offset, qabs, nested);
      q4_unnest(qabs, nested, nb, offset, absmax);
    }
  }
  if (!rc) {
    q4_dequantize(k->type, codes, absmax, n, x);
    ty_dtype_round(k->compute, x, n);
  }
  free(codes), free(absmax), free(qabs), free(nested);
  return rc;
}

bool ckpt_q4_projection(const char *name) {
  static const char *const proj[] = {".q_proj.weight",   ".k_proj.weight",    ".v_proj.weight",
                                     ".o_proj.weight",   ".gate_proj.weight", ".up_proj.weight",
                                     ".down_proj.weight"};
  const size_t len = strlen(name);
  for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
    const size_t k = strlen(proj[i]);
    if (len > k && !strcmp(name + len - k, proj[i])) return true;
  }
  return false;
}
