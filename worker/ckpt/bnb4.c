/* bnb4.c - bitsandbytes' 4-bit checkpoint layout: component names, the
 * quant_state JSON written and read, a weight's components found and
 * checked, config.json's quantization_config; see bnb4.h. */
#include "worker/ckpt/bnb4.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/xalloc.h"

/* The suffix each component adds to the weight's name ("" for the codes;
 * the quant_state's ends with the type's name). */
static const char *const g_suffix[BNB4_NCOMP] = {
    [BNB4_CODES] = "",
    [BNB4_ABSMAX] = ".absmax",
    [BNB4_QUANT_MAP] = ".quant_map",
    [BNB4_NESTED_ABSMAX] = ".nested_absmax",
    [BNB4_NESTED_QUANT_MAP] = ".nested_quant_map",
    [BNB4_QUANT_STATE] = ".quant_state.bitsandbytes__",
};

bool bnb4_quantized_kind(ckpt_kind_t k) {
  return k == CKPT_WQ || k == CKPT_WK || k == CKPT_WV || k == CKPT_WO || k == CKPT_WGATE ||
         k == CKPT_WUP || k == CKPT_WDOWN;
}

bool bnb4_name(char *buf, size_t n, const char *weight, bnb4_comp_t c, q4_type_t t) {
  const char *type = c == BNB4_QUANT_STATE ? q4_type_name(t) : "";
  int k = snprintf(buf, n, "%s%s%s", weight, g_suffix[c], type);
  return k >= 0 && (size_t)k < n;
}

/* Python's repr of a finite double x (what json.dumps writes for a float):
 * the shortest digits that read back as x, in exponent form when the
 * decimal point falls 4 or more places before the first digit or more than
 * 16 after it, else positional with at least one digit after the point. */
static void py_repr(double x, char *out, size_t n) {
  if (isnan(x)) {
    snprintf(out, n, "NaN");
    return;
  }
  if (isinf(x)) {
    snprintf(out, n, "%sInfinity", x < 0 ? "-" : "");
    return;
  }
  char digits[32] = "0";
  int exp10 = 0; /* x = 0.d1d2... * 10^exp10 */
  if (x != 0) {
    /* The shortest p whose nearest p-digit decimal, or one of its two
     * neighbours (a power of two's interval is lopsided), reads back. */
    for (int p = 1; p <= 17; p++) {
      char s[40];
      snprintf(s, sizeof s, "%.*e", p - 1, fabs(x));
      unsigned long long m = 0;
      for (const char *c = s; *c != 'e'; c++)
        if (*c >= '0' && *c <= '9') m = m * 10 + (unsigned)(*c - '0');
      int e = atoi(strchr(s, 'e') + 1);
      bool found = false;
      for (int d = 0; d < 3 && !found; d++) {
        unsigned long long cand = d == 0 ? m : d == 1 ? m + 1 : m - 1;
        char t[48];
        snprintf(t, sizeof t, "%llue%d", cand, e - (p - 1));
        if (strtod(t, NULL) != fabs(x)) continue;
        int len = snprintf(digits, sizeof digits, "%llu", cand);
        exp10 = e + 1 + (len - p); /* m + 1 may carry into one more digit */
        found = true;
      }
      if (found) break;
    }
  }
  size_t nd = strlen(digits);
  while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = '\0';
  char b[64];
  size_t k = 0;
  if (signbit(x)) b[k++] = '-';
  if (x != 0 && (exp10 <= -4 || exp10 > 16)) { /* d[.ddd]e[+-]XX */
    b[k++] = digits[0];
    if (nd > 1) b[k++] = '.';
    memcpy(b + k, digits + 1, nd - 1), k += nd - 1;
    snprintf(b + k, sizeof b - k, "e%c%02d", exp10 - 1 < 0 ? '-' : '+', abs(exp10 - 1));
  } else if (x == 0 || exp10 >= (int)nd) { /* "1200.0" (and "0.0") */
    memcpy(b + k, digits, nd), k += nd;
    for (int j = (int)nd; x != 0 && j < exp10; j++) b[k++] = '0';
    memcpy(b + k, ".0", 3);
  } else if (exp10 > 0) { /* "12.5" */
    memcpy(b + k, digits, (size_t)exp10), k += (size_t)exp10;
    b[k++] = '.';
    memcpy(b + k, digits + exp10, nd - (size_t)exp10 + 1);
  } else { /* "0.0125" */
    b[k++] = '0', b[k++] = '.';
    for (int j = exp10; j < 0; j++) b[k++] = '0';
    memcpy(b + k, digits, nd + 1);
  }
  snprintf(out, n, "%s", b);
}

size_t bnb4_state_json(const bnb4_state_t *s, char *buf, size_t n) {
  char shape[ST_MAX_DIMS * 24 + 4] = "[";
  size_t k = 1;
  for (int d = 0; d < s->ndim; d++)
    k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? ", " : "",
                          (long long)s->shape[d]);
  snprintf(shape + k, sizeof shape - k, "]");
  int w = snprintf(buf, n,
                   "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", "
                   "\"shape\": %s",
                   q4_type_name(s->type), s->blocksize, ty_dtype_name(s->dtype), shape);
  if (w < 0 || (size_t)w >= n) return 0;
  if (s->nested) {
    char off[40];
    py_repr((double)s->offset, off, sizeof off);
    w += snprintf(buf + w, n - (size_t)w,
                  ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", "
                  "\"nested_offset\": %s",
                  s->nested_blocksize, off);
    if ((size_t)w >= n) return 0;
  }
  w += snprintf(buf + w, n - (size_t)w, "}");
  return (size_t)w < n ? (size_t)w : 0;
}

#define NOT_BNB "a quant_state that is not the JSON transformers writes"

/* A float dtype by its config.json spelling only ("float32", ...). */
static bool dtype_by_name(const json_t *v, ty_dtype_t *out) {
  for (int k = 0; json_is_string(v) && k < TY_DTYPE_COUNT; k++)
    if (!strcmp(json_string_value(v), ty_dtype_name((ty_dtype_t)k))) {
      *out = (ty_dtype_t)k;
      return true;
    }
  return false;
}

int bnb4_state_parse(const char *tensor, const char *json, size_t len, bnb4_state_t *s, char *err,
                     size_t errlen) {
  static const char *const keys[] = {"quant_type",       "blocksize",    "dtype",        "shape",
                                     "nested_blocksize", "nested_dtype", "nested_offset"};
  memset(s, 0, sizeof *s);
  json_error_t jerr;
  json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  int rc = 0;
  const char *key;
  json_t *v;
  if (!json_is_object(o)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "tensor '%s': %s (not a JSON object: %s)", tensor, NOT_BNB,
                 o ? "another kind of value" : jerr.text);
    goto out;
  }
  json_object_foreach(o, key, v) {
    bool known = false;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) known |= !strcmp(key, keys[i]);
    if (!known) {
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s': %s (key '%.64s' is not one bitsandbytes "
                   "writes)",
                   tensor, NOT_BNB, key);
      goto out;
    }
  }
  const char *tail = strrchr(tensor, '_'); /* "...bitsandbytes__nf4" */
  const json_t *qt = json_object_get(o, "quant_type"), *bs = json_object_get(o, "blocksize");
  const json_t *dt = json_object_get(o, "dtype"), *sh = json_object_get(o, "shape");
  const json_t *nb = json_object_get(o, "nested_blocksize");
  const json_t *nd = json_object_get(o, "nested_dtype"), *no = json_object_get(o, "nested_offset");
  const char *bad = NULL, *why = "missing or of the wrong kind";
  if (!json_is_string(qt) || q4_type_parse(json_string_value(qt), &s->type))
    bad = "quant_type", why = "must be \"nf4\" or \"fp4\"";
  else if (!tail || strcmp(tail + 1, json_string_value(qt)))
    bad = "quant_type", why = "differs from the type the tensor's name ends with";
  else if (!json_is_integer(bs) || json_integer_value(bs) != Q4_BLOCK)
    bad = "blocksize", why = "must be 64 (the only block size trainyard reads)";
  else if (!dtype_by_name(dt, &s->dtype))
    bad = "dtype", why = "must be \"float32\", \"bfloat16\" or \"float16\"";
  else if (!json_is_array(sh) || json_array_size(sh) < 1 || json_array_size(sh) > ST_MAX_DIMS)
    bad = "shape", why = "must be a list of 1 to 8 sizes";
  if (bad) goto refuse;
  s->blocksize = Q4_BLOCK;
  s->ndim = (int)json_array_size(sh);
  for (int d = 0; d < s->ndim; d++) {
    const json_t *x = json_array_get(sh, (size_t)d);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1ll << 40)) {
      bad = "shape", why = "must hold sizes in [0, 2^40]";
      goto refuse;
    }
    s->shape[d] = (int64_t)json_integer_value(x);
  }
  s->nested = nb || nd || no;
  if (!s->nested) goto out;
  s->nested_blocksize = Q4_NESTED_BLOCK;
  if (!json_is_integer(nb) || json_integer_value(nb) != Q4_NESTED_BLOCK)
    bad = "nested_blocksize", why = "must be 256 with the other nested keys";
  else if (!json_is_string(nd) || strcmp(json_string_value(nd), "float32"))
    bad = "nested_dtype", why = "must be \"float32\" with the other nested keys";
  else if (!json_is_number(no) || !isfinite((float)json_number_value(no)))
    /* A float32 mean: a number past float32's range (found by fuzzing) is
     * none, and would make every block's absmax infinite. */
    bad = "nested_offset", why = "must be a finite float32 number with the other nested keys";
  else
    s->offset = (float)json_number_value(no);
refuse:
  if (bad)
    rc =
        ty_errf(err, errlen, TY_EINVAL, "tensor '%s': %s (key '%s' %s)", tensor, NOT_BNB, bad, why);
out:
  json_decref(o);
  return rc;
}

/* The first tensor of ck whose name is >= key (ck->tensors is sorted). */
static size_t lower_bound(const st_ckpt_t *ck, const char *key) {
  size_t lo = 0, hi = ck->ntensors;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(ck->tensors[mid].name, key) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Component c of w: dtype dt, 1-D [count] (or the codes' [count, 1]). */
static int check_comp(const char *w, const bnb4_info_t *in, bnb4_comp_t c, ty_dtype_t dt,
                      uint64_t count, char *err, size_t errlen) {
  const st_tensor_t *t = in->comp[c];
  char want[64], have[64], wshape[128];
  ckpt_shape_str(wshape, sizeof wshape, in->state.ndim, in->state.shape);
  if (!t)
    return ty_errf(err, errlen, TY_EINVAL,
                   "weight '%s' is stored 4-bit but its statistics are "
                   "missing: no tensor '%s%s'",
                   w, w, g_suffix[c]);
  const int64_t shape[2] = {(int64_t)count, 1};
  const int ndim = c == BNB4_CODES ? 2 : 1;
  if (t->dtype == dt && t->ndim == ndim && (uint64_t)t->shape[0] == count &&
      (ndim == 1 || t->shape[1] == 1))
    return 0;
  ckpt_shape_str(want, sizeof want, ndim, shape);
  ckpt_shape_str(have, sizeof have, t->ndim, t->shape);
  return ty_errf(err, errlen, TY_EINVAL,
                 "tensor '%s' is %s %s but a 4-bit weight of shape %s "
                 "needs %s %s: sizes disagree with the shape %s",
                 t->name, ty_dtype_st_name(t->dtype), have, wshape, ty_dtype_st_name(dt), want,
                 wshape);
}

/* Component c (a code book of n floats) holds want, within 1e-6. */
static int check_map(const st_ckpt_t *ck, const bnb4_info_t *in, bnb4_comp_t c, const float *want,
                     size_t n, char *err, size_t errlen) {
  float got[256];
  int rc = st_read(ck, in->comp[c], 0, got, n * sizeof(float), err, errlen);
  for (size_t i = 0; !rc && i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= 1e-6f))
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s': entry %zu is %g, not bitsandbytes' %s "
                   "code (%g)",
                   in->comp[c]->name, i, (double)got[i],
                   c == BNB4_QUANT_MAP ? q4_type_name(in->state.type) : "dynamic", (double)want[i]);
  return rc;
}

/* Sorts the tensors named "w.*" into in->comp; refuses any other. */
static int collect(const st_ckpt_t *ck, const char *w, bnb4_info_t *in, const st_tensor_t **qs,
                   int *nqs, char *err, size_t errlen) {
  char prefix[BNB4_NAME_MAX];
  snprintf(prefix, sizeof prefix, "%s.", w);
  const size_t pl = strlen(prefix);
  for (size_t i = lower_bound(ck, prefix);
       i < ck->ntensors && !strncmp(ck->tensors[i].name, prefix, pl); i++) {
    const st_tensor_t *t = &ck->tensors[i];
    const char *sfx = t->name + pl - 1; /* from the dot */
    int c = -1;
    for (int k = BNB4_ABSMAX; k < BNB4_QUANT_STATE && c < 0; k++)
      if (!strcmp(sfx, g_suffix[k])) c = k;
    if (c >= 0) {
      in->comp[c] = t;
    } else if (!strcmp(sfx, ".quant_state.bitsandbytes__nf4") ||
               !strcmp(sfx, ".quant_state.bitsandbytes__fp4")) {
      *qs = t, ++*nqs;
    } else {
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s' is not a bitsandbytes 4-bit component of "
                     "'%s' (absmax, quant_map, nested_absmax, nested_quant_map, "
                     "quant_state.bitsandbytes__nf4|fp4)",
                     t->name, w);
    }
    in->q4 = true;
  }
  return 0;
}

int bnb4_find(const st_ckpt_t *ck, const char *w, bnb4_info_t *in, char *err, size_t errlen) {
  memset(in, 0, sizeof *in);
  const st_tensor_t *qs = NULL;
  int nqs = 0, rc = collect(ck, w, in, &qs, &nqs, err, errlen);
  if (rc) return rc;
  in->comp[BNB4_CODES] = st_find(ck, w);
  if (!in->q4) {
    if (in->comp[BNB4_CODES] && in->comp[BNB4_CODES]->dtype == TY_DTYPE_U8)
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s' is U8, 4-bit codes, but its statistics "
                     "are missing: no '%s.absmax', '%s.quant_map' or "
                     "'%s.quant_state.bitsandbytes__nf4|fp4'",
                     w, w, w, w);
    in->comp[BNB4_CODES] = NULL;
    return 0;
  }
  if (nqs != 1)
    return ty_errf(err, errlen, TY_EINVAL, "weight '%s' is stored 4-bit but has %s", w,
                   nqs ? "both an nf4 and an fp4 quant_state"
                       : "no '.quant_state.bitsandbytes__nf4|fp4' tensor: statistics missing");
  if (!in->comp[BNB4_CODES])
    return ty_errf(err, errlen, TY_EINVAL,
                   "weight '%s': its 4-bit codes (the tensor '%s' itself) "
                   "are missing, though its statistics are there",
                   w, w);
  if (qs->dtype != TY_DTYPE_U8 || qs->ndim != 1 || !qs->nelem || qs->nbytes > BNB4_STATE_MAX)
    return ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s': %s (must be U8 [length], at most %d "
                   "bytes of UTF-8)",
                   qs->name, NOT_BNB, BNB4_STATE_MAX);
  char json[BNB4_STATE_MAX];
  if ((rc = st_read(ck, qs, 0, json, (size_t)qs->nbytes, err, errlen)) ||
      (rc = bnb4_state_parse(qs->name, json, (size_t)qs->nbytes, &in->state, err, errlen)))
    return rc;
  in->comp[BNB4_QUANT_STATE] = qs;
  const bnb4_state_t *s = &in->state;
  in->nelem = 1;
  for (int d = 0; d < s->ndim; d++) {
    if (s->shape[d] && in->nelem > (1ull << 50) / (uint64_t)s->shape[d])
      return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': shape has more than 2^50 elements",
                     qs->name);
    in->nelem *= (uint64_t)s->shape[d];
  }
  in->nblocks = q4_blocks((size_t)in->nelem);
  in->nnested = s->nested ? q4_nested_blocks((size_t)in->nblocks) : 0;
  const ty_dtype_t am = s->nested ? TY_DTYPE_U8 : TY_DTYPE_F32;
  if ((rc = check_comp(w, in, BNB4_CODES, TY_DTYPE_U8, q4_code_bytes((size_t)in->nelem), err,
                       errlen)) ||
      (rc = check_comp(w, in, BNB4_ABSMAX, am, in->nblocks, err, errlen)) ||
      (rc = check_comp(w, in, BNB4_QUANT_MAP, TY_DTYPE_F32, 16, err, errlen)) ||
      (rc = check_map(ck, in, BNB4_QUANT_MAP, q4_code(s->type), 16, err, errlen)))
    return rc;
  if (!s->nested) {
    for (int c = BNB4_NESTED_ABSMAX; c <= BNB4_NESTED_QUANT_MAP; c++)
      if (in->comp[c])
        return ty_errf(err, errlen, TY_EINVAL, "tensor '%s' is there but '%s' has no nested keys",
                       in->comp[c]->name, qs->name);
    return 0;
  }
  if ((rc = check_comp(w, in, BNB4_NESTED_ABSMAX, TY_DTYPE_F32, in->nnested, err, errlen)) ||
      (rc = check_comp(w, in, BNB4_NESTED_QUANT_MAP, TY_DTYPE_F32, 256, err, errlen)))
    return rc;
  return check_map(ck, in, BNB4_NESTED_QUANT_MAP, q4_dynamic_code(), 256, err, errlen);
}

int bnb4_match(const ckpt_layout_t *l, const st_ckpt_t *ck, const st_tensor_t **map,
               bnb4_info_t *info, size_t *nq4, char *err, size_t errlen) {
  char want[64], have[64];
  size_t used = 0, q = 0;
  int rc = 0;
  for (size_t i = 0; i < l->ntensors && !rc; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    const int64_t shape[2] = {t->rows, t->cols};
    ckpt_shape_str(want, sizeof want, t->ndim, shape);
    if ((rc = bnb4_find(ck, t->name, &info[i], err, errlen))) break;
    const bnb4_state_t *s = &info[i].state;
    const st_tensor_t *f = info[i].q4 ? info[i].comp[BNB4_CODES] : st_find(ck, t->name);
    const int ndim = info[i].q4 ? s->ndim : f ? f->ndim : 0;
    const int64_t *fs = info[i].q4 ? s->shape : f ? f->shape : NULL;
    if (!f) {
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s' (shape %s from config.json) is missing from the checkpoint",
                   t->name, want);
    } else if (ndim != t->ndim || fs[0] != t->rows || (t->ndim == 2 && fs[1] != t->cols)) {
      ckpt_shape_str(have, sizeof have, ndim, fs);
      rc = ty_errf(err, errlen, TY_EINVAL, "tensor '%s' has shape %s%s but config.json implies %s",
                   t->name, have, info[i].q4 ? " (its quant_state's)" : "", want);
    }
    map[i] = f;
    for (int c = 0; c < BNB4_NCOMP && info[i].q4; c++) used += info[i].comp[c] != NULL;
    used += !info[i].q4;
    q += info[i].q4;
  }
  if (!rc && used != ck->ntensors) {
    /* Each tensor counted above is one of ck's, each once: name one that is not. */
    bool *seen = xcalloc(ck->ntensors + 1, sizeof *seen);
    for (size_t i = 0; i < l->ntensors; i++)
      for (int c = 0; c < BNB4_NCOMP; c++) {
        const st_tensor_t *t = info[i].q4 ? info[i].comp[c] : c ? NULL : map[i];
        if (t) seen[t - ck->tensors] = true;
      }
    for (size_t k = 0; k < ck->ntensors && !rc; k++)
      if (!seen[k])
        rc = ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s' is not part of the Llama layout that "
                     "config.json describes (nor a bitsandbytes component of one of its weights)",
                     ck->tensors[k].name);
    free(seen);
  }
  if (nq4) *nq4 = q;
  return rc;
}

/* BitsAndBytesConfig's keys, sorted as config.json has them. */
static const char *const g_cfg_keys[] = {
    "_load_in_4bit",
    "_load_in_8bit",
    "bnb_4bit_compute_dtype",
    "bnb_4bit_quant_storage",
    "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
    "llm_int8_enable_fp32_cpu_offload",
    "llm_int8_has_fp16_weight",
    "llm_int8_skip_modules",
    "llm_int8_threshold",
    "load_in_4bit",
    "load_in_8bit",
    "quant_method",
};
#define CFG_KEYS_N (sizeof g_cfg_keys / sizeof g_cfg_keys[0])

json_t *bnb4_config_json(const bnb4_config_t *c) {
  json_t *v[CFG_KEYS_N] = {
      json_true(),
      json_false(),
      json_string(ty_dtype_name(c->compute_dtype)),
      json_string("uint8"),
      json_string(q4_type_name(c->type)),
      json_boolean(c->double_quant),
      json_false(),
      json_false(),
      json_null(),
      json_real(6.0),
      json_true(),
      json_false(),
      json_string("bitsandbytes"),
  };
  json_t *o = json_object();
  for (size_t i = 0; i < CFG_KEYS_N; i++) json_object_set_new(o, g_cfg_keys[i], v[i]);
  return o;
}

static bool names_list(const json_t *v) {
  if (!json_is_array(v)) return false;
  for (size_t i = 0; i < json_array_size(v); i++)
    if (!json_is_string(json_array_get(v, i))) return false;
  return true;
}

int bnb4_config_parse(const json_t *qc, bnb4_config_t *c, char *err, size_t errlen) {
  c->type = Q4_FP4; /* BitsAndBytesConfig's defaults */
  c->double_quant = false;
  c->compute_dtype = TY_DTYPE_F32;
  if (!json_is_object(qc))
    return ty_errf(err, errlen, TY_EINVAL, "config.json: quantization_config is not an object");
  const json_t *m = json_object_get(qc, "quant_method");
  if (!json_is_string(m) || strcmp(json_string_value(m), "bitsandbytes"))
    return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                   "config.json: quantization_config.quant_method "
                   "is not \"bitsandbytes\" (trainyard reads bitsandbytes 4-bit checkpoints only)");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)qc, key, v) {
    size_t k = 0;
    while (k < CFG_KEYS_N && strcmp(key, g_cfg_keys[k])) k++;
    const char *why = NULL;
    int code = TY_EINVAL;
    if (k == CFG_KEYS_N)
      why = "is not a key BitsAndBytesConfig writes";
    else if (strstr(key, "load_in_8bit") && !json_is_false(v))
      why = "is not false (8-bit bitsandbytes checkpoints are not read)", code = TY_EUNIMPLEMENTED;
    else if (strstr(key, "load_in_4bit") && !json_is_true(v))
      why = "is not true (the checkpoint is not 4-bit)";
    else if (!strcmp(key, "bnb_4bit_quant_type") &&
             (!json_is_string(v) || q4_type_parse(json_string_value(v), &c->type)))
      why = "must be \"nf4\" or \"fp4\"";
    else if (!strcmp(key, "bnb_4bit_use_double_quant") && !json_is_boolean(v))
      why = "must be true or false";
    else if (!strcmp(key, "bnb_4bit_compute_dtype") && !json_is_null(v) &&
             !dtype_by_name(v, &c->compute_dtype))
      why = "must be \"float32\", \"bfloat16\" or \"float16\"";
    else if (!strcmp(key, "bnb_4bit_quant_storage") && !json_is_null(v) &&
             !(json_is_string(v) && !strcmp(json_string_value(v), "uint8")))
      why = "is not \"uint8\" (the only storage trainyard reads)", code = TY_EUNIMPLEMENTED;
    else if (!strcmp(key, "llm_int8_skip_modules") && !json_is_null(v) && !names_list(v))
      why = "must be null or a list of module names";
    else if ((!strcmp(key, "llm_int8_enable_fp32_cpu_offload") ||
              !strcmp(key, "llm_int8_has_fp16_weight")) &&
             !json_is_boolean(v))
      why = "must be true or false";
    else if (!strcmp(key, "llm_int8_threshold") && !json_is_number(v))
      why = "must be a number";
    if (why) return ty_errf(err, errlen, code, "config.json: quantization_config.%s %s", key, why);
    if (!strcmp(key, "bnb_4bit_use_double_quant")) c->double_quant = json_is_true(v);
  }
  if (!json_is_true(json_object_get(qc, "load_in_4bit")) &&
      !json_is_true(json_object_get(qc, "_load_in_4bit")))
    return ty_errf(err, errlen, TY_EINVAL,
                   "config.json: quantization_config has no load_in_4bit true: not a 4-bit model");
  return 0;
}
