/* checkpoint.c - the Llama tensor table from a config, config.json reading,
 * and the strict match of a checkpoint's tensors against the table. */
#include "worker/ckpt/checkpoint.h"
#include "worker/ckpt/ckpt_q4.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/beneath.h"
#include "common/json_util.h"
#include "common/xalloc.h"

static void set_entry(ckpt_tensor_t *t, ckpt_kind_t kind, int layer, const char *name, int64_t rows,
                      int64_t cols) {
  if (layer >= 0)
    snprintf(t->name, sizeof t->name, "model.layers.%d.%s", layer, name);
  else
    snprintf(t->name, sizeof t->name, "%s", name);
  t->kind = kind;
  t->layer = layer;
  t->ndim = cols ? 2 : 1;
  t->rows = rows;
  t->cols = cols ? cols : 1;
  t->is_norm = kind == CKPT_ATTN_NORM || kind == CKPT_MLP_NORM || kind == CKPT_FINAL_NORM;
}

int ckpt_layout_init(ckpt_layout_t *l, const llama_config_t *cfg) {
  memset(l, 0, sizeof *l);
  l->cfg = *cfg;
  const int64_t C = cfg->hidden_size, FF = cfg->intermediate_size, V = cfg->vocab_size;
  const int64_t NH = cfg->num_attention_heads, NKV = cfg->num_key_value_heads;
  const int64_t HS = cfg->head_dim > 0 ? cfg->head_dim : (NH > 0 ? C / NH : 0);
  const int64_t L = cfg->num_hidden_layers, QB = cfg->qkv_bias ? 1 : 0;
  /* Guard every product against overflow: each dimension is kept below
   * 2^24 and the layer count below 2^16, which bounds tensors at 2^48. */
  const int64_t dims[] = {C, FF, V, NH, NKV, HS};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i] < 1 || dims[i] > (1 << 24)) return TY_EINVAL;
  if (L < 0 || L > (1 << 16)) return TY_EINVAL;
  /* Every kind's name and shape, from the two lists. */
  const char *name[CKPT_KIND_COUNT];
  int64_t rows[CKPT_KIND_COUNT], cols[CKPT_KIND_COUNT];
#define TY_X(id, nm, r, c) name[CKPT_##id] = nm, rows[CKPT_##id] = (r), cols[CKPT_##id] = (c);
  CKPT_LAYER_TENSORS(TY_X)
  CKPT_GLOBAL_TENSORS(TY_X)
#undef TY_X
  l->per_layer = 0;
  while (l->per_layer < CKPT_PER_LAYER && rows[l->per_layer] > 0) l->per_layer++;
  size_t n = 1 + (size_t)L * l->per_layer + 1 + (cfg->tie_word_embeddings ? 0 : 1);
  l->tensors = xcalloc(n, sizeof *l->tensors);
  size_t k = 0;
  set_entry(&l->tensors[k++], CKPT_EMBED, -1, name[CKPT_EMBED], rows[CKPT_EMBED], cols[CKPT_EMBED]);
  for (int layer = 0; layer < L; layer++)
    for (int kind = 0; kind < l->per_layer; kind++)
      set_entry(&l->tensors[k++], (ckpt_kind_t)kind, layer, name[kind], rows[kind], cols[kind]);
  for (int kind = CKPT_FINAL_NORM; kind <= CKPT_LM_HEAD; kind++)
    if (kind != CKPT_LM_HEAD || !cfg->tie_word_embeddings)
      set_entry(&l->tensors[k++], (ckpt_kind_t)kind, -1, name[kind], rows[kind], cols[kind]);
  l->ntensors = k;
  for (size_t i = 0; i < k; i++)
    l->nparams += (uint64_t)l->tensors[i].rows * (uint64_t)l->tensors[i].cols;
  return 0;
}

void ckpt_layout_free(ckpt_layout_t *l) {
  if (!l) return;
  free(l->tensors);
  l->tensors = NULL;
  l->ntensors = 0;
}

int ckpt_layout_index(const ckpt_layout_t *l, ckpt_kind_t kind, int layer) {
  const int64_t L = l->cfg.num_hidden_layers;
  const int P = l->per_layer;
  if (kind < CKPT_EMBED) {
    if (layer < 0 || layer >= L || (int)kind >= P) return -1;
    return 1 + layer * P + (int)kind;
  }
  if (kind == CKPT_EMBED) return 0;
  if (kind == CKPT_FINAL_NORM) return (int)(1 + L * P);
  if (kind == CKPT_LM_HEAD && !l->cfg.tie_word_embeddings) return (int)(2 + L * P);
  return -1;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Folds bytes [from, n) of path into *h; 0 or the read's error. */
static int fold_file(uint64_t *h, const char *path, uint64_t from, uint64_t n, char *err,
                     size_t errlen) {
  char why[1024];
  int fd = ty_beneath_open(path, O_RDONLY, 0, why, sizeof why);
  if (fd < 0) return ty_errf(err, errlen, fd, "%s", why);
  char buf[65536];
  int rc = 0;
  for (uint64_t off = from; off < n && !rc;) {
    size_t want = n - off < sizeof buf ? (size_t)(n - off) : sizeof buf;
    ssize_t got = pread(fd, buf, want, (off_t)off);
    if (got <= 0)
      rc = ty_errf(err, errlen, TY_EDATALOSS, "%s: cannot read: %s", path,
                   got < 0 ? strerror(errno) : "shorter than expected");
    else
      *h = fnv1a(*h, buf, (size_t)got), off += (uint64_t)got;
  }
  close(fd);
  return rc;
}

int ckpt_fingerprint(const char *dir, char *out, char *err, size_t errlen) {
  out[0] = '\0';
  uint64_t h = 14695981039346656037ull;
  char path[4096];
  llama_config_path(dir, path, sizeof path);
  struct stat st;
  char why[1024];
  int e = ty_beneath_stat(path, &st, why, sizeof why);
  if (e) return ty_errf(err, errlen, e, "%s", why);
  int rc = fold_file(&h, path, 0, (uint64_t)st.st_size, err, errlen);
  st_ckpt_t *c = NULL;
  /* Bytes only: a 4-bit checkpoint's U8 tensors fold like any. */
  if (!rc) rc = st_open_flags(dir, ST_OPEN_U8, &c, err, errlen);
  for (size_t i = 0; !rc && i < c->nfiles; i++) {
    const st_file_t *f = &c->files[i];
    const char *name = strrchr(f->path, '/');
    name = name ? name + 1 : f->path;
    h = fnv1a(h, name, strlen(name) + 1);
    h = fnv1a(h, &f->size, sizeof f->size);
    uint64_t probe = f->data_start + 4096 < f->size ? f->data_start + 4096 : f->size;
    rc = fold_file(&h, f->path, 0, probe, err, errlen);
    /* A PyTorch file (data_start 0) begins with its pickle, which is the
     * same for every checkpoint of one shape: fold its first tensor's
     * first 4 KiB too. */
    uint64_t first = UINT64_MAX;
    for (size_t k = 0; f->data_start == 0 && k < c->ntensors; k++)
      if (c->tensors[k].file == (int)i && c->tensors[k].begin < first) first = c->tensors[k].begin;
    if (!rc && first < f->size)
      rc = fold_file(&h, f->path, first, first + 4096 < f->size ? first + 4096 : f->size, err,
                     errlen);
  }
  st_close(c);
  if (!rc) snprintf(out, CKPT_FINGERPRINT_LEN, "%016llx", (unsigned long long)h);
  return rc;
}

int ckpt_read_config(const char *dir, llama_config_t *cfg, char *err, size_t errlen) {
  char path[4096];
  llama_config_path(dir, path, sizeof path);
  char why[1024];
  json_t *root = ty_json_load_file(path, JSON_REJECT_DUPLICATES, why, sizeof why);
  if (!root) {
    if (errno == ENOENT)
      return ty_errf(err, errlen, TY_ENOTFOUND,
                     "%s: missing (a checkpoint directory holds config.json beside "
                     "model.safetensors or pytorch_model.bin, or their shards)",
                     path);
    return ty_errf(err, errlen, errno == EINVAL ? TY_EINVAL : TY_EPERM, "%s", why);
  }
  llama_config_init(cfg);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int rc = 0;
  if (!json_is_object(root)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "%s: not a JSON object", path);
  } else if (llama_config_from_json(root, cfg, "", false, &errs) ||
             llama_config_validate(cfg, "", &errs)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "%s: %s: %s", path, errs.len ? errs.items[0].field : "",
                 errs.len ? errs.items[0].message : "invalid");
  }
  ty_errlist_clear(&errs);
  json_decref(root);
  return rc;
}

void ckpt_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

int ckpt_match(const ckpt_layout_t *l, const st_ckpt_t *st, const st_tensor_t **map, char *err,
               size_t errlen) {
  char want[64], have[64];
  for (size_t i = 0; i < l->ntensors; i++) {
    const ckpt_tensor_t *t = &l->tensors[i];
    int64_t shape[2] = {t->rows, t->cols};
    ckpt_shape_str(want, sizeof want, t->ndim, shape);
    const st_tensor_t *f = st_find(st, t->name);
    if (!f)
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s' (shape %s from config.json) is missing from the checkpoint",
                     t->name, want);
    if (f->ndim != t->ndim || f->shape[0] != t->rows || (t->ndim == 2 && f->shape[1] != t->cols)) {
      ckpt_shape_str(have, sizeof have, f->ndim, f->shape);
      return ty_errf(err, errlen, TY_EINVAL, "tensor '%s' has shape %s but config.json implies %s",
                     t->name, have, want);
    }
    map[i] = f;
  }
  /* torch.save of a tied model's state dict keeps lm_head.weight as a
   * second view of the embedding's storage: the same bytes, nothing more.
   * Any other lm_head of a tied model is an extra tensor, named below. */
  const st_tensor_t *embed = map[0], *alias = NULL;
  if (l->cfg.tie_word_embeddings && (alias = st_find(st, "lm_head.weight")) &&
      !(alias->file == embed->file && alias->begin == embed->begin &&
        alias->nbytes == embed->nbytes && alias->dtype == embed->dtype &&
        alias->ndim == embed->ndim && alias->shape[0] == embed->shape[0] &&
        alias->shape[1] == embed->shape[1]))
    alias = NULL;
  if (st->ntensors != l->ntensors + (alias ? 1 : 0)) {
    for (size_t i = 0; i < st->ntensors; i++) {
      bool known = &st->tensors[i] == alias;
      for (size_t j = 0; j < l->ntensors && !known; j++) known = map[j] == &st->tensors[i];
      if (!known)
        return ty_errf(err, errlen, TY_EINVAL,
                       "tensor '%s' is not part of the Llama layout that config.json describes "
                       "(num_hidden_layers %lld, tie_word_embeddings %s, q/k/v biases %s)",
                       st->tensors[i].name, (long long)l->cfg.num_hidden_layers,
                       l->cfg.tie_word_embeddings ? "true" : "false",
                       l->cfg.qkv_bias ? "yes: model_type qwen2" : "no");
    }
  }
  return 0;
}

void ckpt_close(ckpt_t *c) {
  if (!c) return;
  ckpt_layout_free(&c->layout);
  st_close(c->st);
  free(c->file_tensor);
  ckpt_q4_free(c->q4);
  free(c);
}

int ckpt_open(const char *dir, ckpt_t **out, char *err, size_t errlen) {
  *out = NULL;
  llama_config_t cfg;
  int rc = ckpt_read_config(dir, &cfg, err, errlen);
  if (rc) return rc;
  ckpt_t *c = xcalloc(1, sizeof *c);
  if ((rc = ckpt_layout_init(&c->layout, &cfg))) {
    ty_errf(err, errlen, rc, "%s/config.json: sizes too large for this build", dir);
    goto fail;
  }
  char msg[768], path[4096];
  llama_config_path(dir, path, sizeof path);
  json_t *root = ty_json_load_file(path, JSON_REJECT_DUPLICATES, NULL, 0);
  const json_t *qc = json_object_get(root, "quantization_config");
  if (qc && !json_is_null(qc)) {
    rc = ckpt_q4_open(c, dir, qc, err, errlen);
    json_decref(root);
    if (rc) goto fail;
    *out = c;
    return 0;
  }
  json_decref(root);
  if ((rc = st_open(dir, &c->st, msg, sizeof msg))) {
    ty_errf(err, errlen, rc, "%s", msg);
    goto fail;
  }
  c->file_tensor = xcalloc(c->layout.ntensors + 1, sizeof *c->file_tensor);
  if ((rc = ckpt_match(&c->layout, c->st, c->file_tensor, msg, sizeof msg))) {
    ty_errf(err, errlen, rc, "%s: %s", dir, msg);
    goto fail;
  }
  *out = c;
  return 0;
fail:
  ckpt_close(c);
  return rc;
}
