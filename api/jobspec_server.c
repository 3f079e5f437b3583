/* jobspec_server.c - the rules that need the server's configuration or
 * host: paths inside the configured roots, one GPU per rank for device
 * cuda, CPU ranks that fit the host's memory, GPU ranks that fit their GPU
 * (its size, or a cap). They are rows "paths-in-roots", "cuda-gpus",
 * "host-memory" and "device-memory" of the rule table; see jobspec.h. */
#include "api/jobspec.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "api/llama_config.h"
#include "api/model_acts.h"
#include "api/model_acts.h"
#include "common/beneath.h"
#include "common/dtype.h"
#include "common/json_util.h"

/* See jobspec.h. A missing part that holds "." or ".." could still step
 * out once created, hence -1; -2 also covers a link in a loop. */
int jobspec_resolve_path(const char *path, const char *base, char *out) {
  char abs[PATH_MAX * 2], cwd[PATH_MAX];
  if (path[0] == '/') {
    snprintf(abs, sizeof abs, "%s", path);
  } else {
    if (!base) base = getcwd(cwd, sizeof cwd);
    if (!base) return -1;
    snprintf(abs, sizeof abs, "%s/%s", base, path);
  }
  if (realpath(abs, out)) return 0;
  /* Walk up to the nearest existing ancestor. */
  size_t n = strlen(abs);
  while (n > 1) {
    while (n > 1 && abs[n - 1] != '/') n--;
    while (n > 1 && abs[n - 1] == '/') n--;
    char head[PATH_MAX * 2];
    snprintf(head, sizeof head, "%.*s", (int)n, abs);
    if (!realpath(n == 1 && abs[0] == '/' ? "/" : head, out)) continue;
    const char *rest = abs + n;
    /* The first missing component must really be missing: a dangling
     * symbolic link there would let a worker create files wherever it
     * points. */
    struct stat st;
    const char *first = rest + strspn(rest, "/");
    char probe[PATH_MAX * 2 + 2];
    snprintf(probe, sizeof probe, "%s/%.*s", n == 1 ? "" : head, (int)strcspn(first, "/"), first);
    if (lstat(probe, &st) == 0) return -2;
    /* The missing components, one '/' before each (none after the last), so
     * that every spelling of a folder has one form. */
    size_t o = strlen(out);
    if (o == 1) o = 0; /* out is "/" */
    for (const char *p = rest; *p;) {
      p += strspn(p, "/");
      size_t len = strcspn(p, "/");
      if (!len) break;
      if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) return -1;
      if (o + 1 + len >= PATH_MAX) return -1;
      out[o++] = '/';
      memcpy(out + o, p, len);
      o += len;
      p += len;
    }
    if (!o) out[o++] = '/';
    out[o] = '\0';
    return 0;
  }
  return -1;
}

static bool inside_any(const char *resolved, const char *const *roots) {
  for (size_t i = 0; roots && roots[i]; i++) {
    char r[PATH_MAX];
    if (!realpath(roots[i], r)) continue; /* a root that does not exist holds nothing */
    size_t n = strlen(r);
    if (!strcmp(r, "/")) return true;
    if (!strncmp(resolved, r, n) && (resolved[n] == '\0' || resolved[n] == '/')) return true;
  }
  return false;
}

/* Whether item is one of the ", "-separated entries of buf. */
static bool listed(const char *buf, const char *item) {
  size_t n = strlen(item);
  for (const char *p = buf; (p = strstr(p, item)) != NULL; p++)
    if ((p == buf || (p - buf >= 2 && p[-2] == ',' && p[-1] == ' ')) &&
        (p[n] == '\0' || (p[n] == ',' && p[n + 1] == ' ')))
      return true;
  return false;
}

/* The roots of lists a and b as inside_any compares them (resolved), each
 * once, into buf (cap bytes): what a user must move a path under. A root
 * that does not exist holds nothing and is named as configured. */
static void roots_list(char *buf, size_t cap, const char *const *a, const char *const *b) {
  buf[0] = '\0';
  const char *const *lists[2] = {a, b};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; lists[k] && lists[k][i]; i++) {
      char r[PATH_MAX], item[PATH_MAX + 24];
      if (realpath(lists[k][i], r))
        snprintf(item, sizeof item, "%s", r);
      else
        snprintf(item, sizeof item, "%s (does not exist)", lists[k][i]);
      if (listed(buf, item)) continue;
      size_t l = strlen(buf), n = strlen(item);
      if (l + 2 + n >= cap) goto done; /* no room: the roots named so far */
      if (l) memcpy(buf + l, ", ", 2), l += 2;
      memcpy(buf + l, item, n + 1);
    }
done:
  if (!buf[0]) snprintf(buf, cap, "none configured");
}

/* resolved (PATH_MAX bytes) receives path resolved, or "" when it cannot be. */
static void check_one_root(const char *field, const char *path, bool write,
                           const jobspec_roots_t *r, ty_errlist_t *errs, char *res) {
  char list[4096];
  res[0] = '\0';
  if (!path[0]) return;
  int rc = jobspec_resolve_path(path, r->base, res);
  if (rc) res[0] = '\0';
  if (rc == -2) {
    ty_errlist_add(errs, field,
                   "%s passes through a symbolic link that points nowhere; remove the link or "
                   "give a plain path inside the roots",
                   path);
    return;
  }
  if (rc != 0) {
    ty_errlist_add(errs, field,
                   "%s cannot be resolved safely (a part that does not exist yet "
                   "holds '.' or '..'); give a plain path inside the roots",
                   path);
    return;
  }
  bool ok = inside_any(res, r->write) || (!write && inside_any(res, r->read));
  if (ok) {
    /* What the job's ranks will open inside it (a model's files, the
     * checkpoints under an output folder) must not lead out either: they
     * open it beneath the roots, and would fail there. */
    char why[2048];
    if (ty_beneath_confined() &&
        ty_beneath_check_tree(res, write, write ? 3 : 1, why, sizeof why) != 0)
      ty_errlist_add(errs, field, "%s", why);
    return;
  }
  roots_list(list, sizeof list, write ? NULL : r->read, r->write);
  ty_errlist_add(errs, field,
                 "%s resolves to %s, outside the server's %s roots (%s); move it "
                 "under one of them",
                 path, res, write ? "output" : "allowed", list);
}

int jobspec_check_roots(const jobspec_t *s, const jobspec_roots_t *roots, ty_errlist_t *errs) {
  size_t before = errs->len;
  char res[PATH_MAX];
  check_one_root("model_path", s->model_path, false, roots, errs, res);
  check_one_root("data.path", s->data.path, false, roots, errs, res);
  check_one_root("data.tokenizer", s->data.tokenizer, false, roots, errs, res);
  check_one_root("output_dir", s->output_dir, true, roots, errs,
                 roots->output_resolved ? roots->output_resolved : res);
  return errs->len > before ? TY_EINVAL : 0;
}

int jobspec_check_devices(const jobspec_t *s, int gpus_available, ty_errlist_t *errs) {
  if (s->device != JOBSPEC_DEVICE_CUDA) return 0;
  if (gpus_available <= 0) {
    ty_errlist_add(errs, "device",
                   "is cuda but this server has no GPU (it runs with --gpus 0); on a GPU "
                   "host start trainyardd with --gpus N (or TRAINYARD_GPUS=N), else use "
                   "\"auto\" or \"cpu\"");
    return TY_EINVAL;
  }
  if (s->world_size > gpus_available) {
    ty_errlist_add(errs, "device",
                   "cuda with world_size %d needs %d GPUs, this server has %d; "
                   "lower world_size (and allocation_mode) to at most %d, or "
                   "use \"cpu\"",
                   s->world_size, s->world_size, gpus_available, gpus_available);
    return TY_EINVAL;
  }
  return 0;
}

int jobspec_check_nodes(const jobspec_t *s, const char *dispatcher, bool many_nodes,
                        ty_errlist_t *errs) {
  if (s->resources.nodes <= 1 || many_nodes) return 0;
  ty_errlist_add(errs, "resources.nodes",
                 "is %d, and %s runs every rank on one host; set "
                 "resources.nodes to 1, or submit to a trainyardd that dispatches to a "
                 "cluster (trainyardd --dispatcher slurm)",
                 s->resources.nodes, dispatcher);
  return TY_EINVAL;
}

uint64_t jobspec_host_memory(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) break;
  fclose(f);
  return (uint64_t)kib << 10;
}

/* The model's shape into *c: s->model, or model_path's config.json; false
 * where it cannot be known. */
static bool model_config(const jobspec_t *s, llama_config_t *c) {
  if (s->has_model) {
    *c = s->model;
    return true;
  }
  if (!s->model_path[0]) return false;
  char path[JOBSPEC_PATH_MAX + 16];
  llama_config_path(s->model_path, path, sizeof path);
  json_t *root = ty_json_load_file(path, 0, NULL, 0);
  llama_config_init(c);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  bool ok = root && !llama_config_from_json(root, c, "", false, &errs) &&
            !llama_config_validate(c, "", &errs);
  ty_errlist_clear(&errs);
  json_decref(root);
  return ok;
}

int64_t jobspec_param_count(const jobspec_t *s) {
  llama_config_t c;
  return model_config(s, &c) ? llama_config_num_params(&c) : 0;
}

/* QLoRA (quantization.load_in_4bit): the bytes of the whole model as CPU
 * ranks hold it for training: the seven linear projections of each layer
 * in 4 bits (half a byte an element, and a block of 64's absmax: a float,
 * or with double quantization a byte and a float per 256 blocks, as
 * worker/ckpt/loader.h lays a rank's record out), the rest in float32; 0
 * without it. */
static double q4_model_bytes(const jobspec_t *s, const llama_config_t *c, int64_t params) {
  if (!s->quantization.load_in_4bit) return 0.0;
  const double C = (double)c->hidden_size, NH = (double)c->num_attention_heads;
  const double NKV = (double)(c->num_key_value_heads ? c->num_key_value_heads : NH);
  const double HS = (double)(c->head_dim ? c->head_dim : c->hidden_size / c->num_attention_heads);
  const double lin = (double)c->num_hidden_layers * (2.0 * C * NH * HS + 2.0 * C * NKV * HS +
                                                     3.0 * C * (double)c->intermediate_size);
  const double per = s->quantization.bnb_4bit_use_double_quant
                         ? 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0)
                         : 0.5 + 4.0 / 64.0;
  return lin * per + ((double)params - lin) * 4.0;
}

/* Bytes that all of s's ranks hold at least, loading on the standard path
 * (standard) or each its own shard, elem bytes a weight (q4 > 0: a 4-bit
 * base's bytes, q4_model_bytes, once loaded); with training, every
 * weight's gradients and AdamW moments too, act bytes of activations a
 * rank, and rank 0's whole copy of a sharded LoRA base for samples. */
static double ranks_bytes(const jobspec_t *s, int64_t params, double elem, bool training,
                          bool standard, double act, double q4) {
  const double whole = (double)params * elem, W = s->world_size;
  const double shard =
      q4 > 0.0 ? q4 / W : (double)((params + s->world_size - 1) / s->world_size) * elem;
  /* Loading: the standard path places the whole model, then copies out the
   * rank's shard (one rank keeps the whole model as its own). */
  double load = standard ? whole + (W > 1 || q4 > 0.0 ? shard : 0.0) : shard;
  /* Training: the shard, for every weight its gradients and AdamW's two
   * moments, and the activations. */
  double train = training ? (!s->use_lora ? 4.0 * shard : shard) + act : shard;
  /* train.sample_prompts under LoRA on several ranks (or over a 4-bit
   * base): rank 0 also reads the whole frozen base to decode with
   * (worker/rank/samples.h). */
  const double samples =
      training && s->use_lora && (W > 1 || q4 > 0.0) && s->train.sample_prompts[0][0] ? whole : 0.0;
  return W * (load > train ? load : train) + samples;
}

uint64_t jobspec_activation_bytes(const jobspec_t *s, const llama_config_t *c, bool recompute) {
  return llama_activation_bytes(c, jobspec_micro_batch_rows(s), s->data.seq_len, true, recompute, 0);
}

uint64_t jobspec_rank_host_bytes(const jobspec_t *s) {
  llama_config_t c;
  if (s->world_size < 1 || !model_config(s, &c)) return 0;
  const int64_t params = llama_config_num_params(&c);
  if (params <= 0) return 0;
  const bool standard = !s->fsdp.memory_efficient_load && !s->init_from_scratch;
  const double act = (double)jobspec_activation_bytes(s, &c, s->gradient_checkpointing);
  const double q4 = q4_model_bytes(s, &c, params);
  return (uint64_t)(ranks_bytes(s, params, (double)ty_dtype_size(TY_DTYPE_F32), true, standard, act,
                                q4) /
                    s->world_size);
}

int jobspec_check_host_memory(const jobspec_t *s, bool training, uint64_t host_bytes,
                              const char *host_what, ty_errlist_t *errs) {
  llama_config_t c;
  if (!host_bytes || !model_config(s, &c)) return 0;
  const int64_t params = llama_config_num_params(&c);
  if (params <= 0) return 0;
  /* Training computes in float32 on the CPU; a load holds the job's dtype. */
  const ty_dtype_t dtype = training ? TY_DTYPE_F32 : s->dtype;
  const double elem = (double)ty_dtype_size(dtype);
  const double gib = 1024.0 * 1024.0 * 1024.0, host = (double)host_bytes;
  /* From scratch each rank initialises only its shard. */
  const bool standard = !s->fsdp.memory_efficient_load && !s->init_from_scratch;
  const bool ckpt = s->gradient_checkpointing;
  const double act = training ? (double)jobspec_activation_bytes(s, &c, ckpt) : 0.0;
  const double q4 = training ? q4_model_bytes(s, &c, params) : 0.0;
  const double need = ranks_bytes(s, params, elem, training, standard, act, q4);
  if (need <= host) return 0;
  const double efficient = ranks_bytes(s, params, elem, training, false, act, q4);
  const double act1 = training ? (double)jobspec_activation_bytes(s, &c, true) : 0.0;
  const double recompute = ranks_bytes(s, params, elem, training, false, act1, q4);
  const bool full = training && !s->use_lora;
  if (standard && efficient <= host) {
    ty_errlist_add(errs, "fsdp.memory_efficient_load",
                   "is false: on the standard path each of the %d ranks places the whole model "
                   "(%lld parameters, %.2f GiB in %s) before it keeps its shard, at least "
                   "%.2f GiB in all on a host of %.2f GiB (%s); set it true: each rank then "
                   "reads only its shard, at least %.2f GiB in all",
                   s->world_size, (long long)params, (double)params * elem / gib,
                   ty_dtype_name(dtype), need / gib, host / gib, host_what, efficient / gib);
  } else if (training && !ckpt && recompute <= host) {
    ty_errlist_add(errs, "gradient_checkpointing",
                   "is false: each of the %d ranks keeps every layer's activations for its "
                   "micro-batch of %d x %d tokens, %.2f GiB a rank, at least %.2f GiB in all "
                   "on a host of %.2f GiB (%s); set it true: a rank then keeps one layer's "
                   "and each layer's input, %.2f GiB a rank (or lower "
                   "train.micro_batch_size or data.seq_len)",
                   s->world_size, s->train.micro_batch_size, s->data.seq_len, act / gib,
                   efficient / gib, host / gib, host_what, act1 / gib);
  } else {
    ty_errlist_add(errs, s->init_from_scratch ? "model" : "model_path",
                   "the model (%lld parameters) needs at least %.2f GiB of this host's memory "
                   "for its %s in %s over %d rank%s%s, more than the host's %.2f GiB (%s): "
                   "%suse device cuda, or a host with more memory",
                   (long long)params, need / gib,
                   full ? "weights, gradients and AdamW moments" : "weights",
                   q4 > 0.0 ? "4 bits (the linear projections) and float32" : ty_dtype_name(dtype),
                   s->world_size, s->world_size == 1 ? "" : "s",
                   training ? " and their activations" : "", host / gib, host_what,
                   full && !s->init_from_scratch ? "train LoRA adapters (use_lora), " : "");
  }
  return TY_EINVAL;
}

/* Bytes one GPU rank of s holds at least: its shard in the job's dtype,
 * beside the whole model while the standard path loads (a full-training
 * rank of several loads on the host and copies only its shard up; from
 * scratch a rank initialises only its shard); then for training the shard,
 * every weight's gradients and AdamW's two moments when training every
 * weight, act (the model's buffers: llama_device_activation_bytes) and,
 * over several ranks, the slots units are gathered into (two, each the
 * largest unit: the embedding, a layer, or the final norm and the head;
 * training every weight one more in float32 for its gradients). */
static double rank_device_bytes(const jobspec_t *s, const llama_config_t *c, int64_t params,
                                bool standard, double act) {
  const bool full = !s->use_lora, span = full && s->world_size > 1;
  const double elem = (double)ty_dtype_size(s->dtype);
  const double whole = (double)params * elem;
  const double shard = (double)((params + s->world_size - 1) / s->world_size) * elem;
  const double load = standard && !s->init_from_scratch && !span ? whole + shard : shard;
  double slots = 0.0;
  if (s->world_size > 1) {
    const double L = c->num_hidden_layers, head = (double)c->vocab_size * c->hidden_size;
    const double layer =
        ((double)params - head * (c->tie_word_embeddings ? 1 : 2) - c->hidden_size) / L;
    const double unit = (layer > head + c->hidden_size ? layer : head + c->hidden_size) * elem;
    slots = (full ? 3.0 : 2.0) * unit;
  }
  const double train = (full ? 4.0 * shard : shard) + act + slots;
  return load > train ? load : train;
}

/* The GPU model's buffers for s (see rank_device_bytes), with one layer's
 * activations (recompute) or every layer's. */
static double device_act_bytes(const jobspec_t *s, const llama_config_t *c, bool recompute) {
  const int64_t R = s->use_lora ? s->lora_rank : 0;
  const uint64_t np = s->use_lora ? llama_lora_params(c, R, s->target_modules) : 0;
  return (double)llama_device_activation_bytes(c, jobspec_micro_batch_rows(s), s->data.seq_len,
                                               recompute, R, np, 0);
}

/* bytes as "%.1f MiB" under a GiB, else "%.2f GiB": device caps are given
 * in MiB, and a small model's sizes read as nothing in GiB. */
static const char *mem_str(double bytes, char buf[32]) {
  const double mib = 1024.0 * 1024.0;
  if (bytes < 1024.0 * mib)
    snprintf(buf, 32, "%.1f MiB", bytes / mib);
  else
    snprintf(buf, 32, "%.2f GiB", bytes / (1024.0 * mib));
  return buf;
}

int jobspec_check_device_memory(const jobspec_t *s, uint64_t device_bytes, const char *device_what,
                                const char *more, ty_errlist_t *errs) {
  llama_config_t c;
  if (!device_bytes || !model_config(s, &c)) return 0;
  const int64_t params = llama_config_num_params(&c);
  if (params <= 0) return 0;
  const double cap = (double)device_bytes;
  const bool standard = !s->fsdp.memory_efficient_load, ckpt = s->gradient_checkpointing;
  const double act = device_act_bytes(s, &c, ckpt);
  const double need = rank_device_bytes(s, &c, params, standard, act);
  if (need <= cap) return 0;
  const double efficient = rank_device_bytes(s, &c, params, false, act);
  const double act1 = device_act_bytes(s, &c, true);
  const double recompute = rank_device_bytes(s, &c, params, false, act1);
  const bool full = !s->use_lora;
  char a[32], b[32], c1[32], d[32]; /* one buffer for each size in a message */
  if (standard && efficient <= cap) {
    ty_errlist_add(errs, "fsdp.memory_efficient_load",
                   "is false: on the standard path each GPU rank places the whole model "
                   "(%lld parameters, %s in %s) on its device beside its shard, at least %s, more "
                   "than the %s %s; set it true: each rank then places only its shard, at least %s "
                   "with its training buffers",
                   (long long)params, mem_str((double)params * ty_dtype_size(s->dtype), a),
                   ty_dtype_name(s->dtype), mem_str(need, b), mem_str(cap, c1), device_what,
                   mem_str(efficient, d));
  } else if (!ckpt && recompute <= cap) {
    ty_errlist_add(errs, "gradient_checkpointing",
                   "is false: each GPU rank keeps every layer's activations for its micro-batch "
                   "of %d x %d tokens, %s, at least %s in all, more than the %s %s; set it true: "
                   "a rank then keeps one layer's and each layer's input, %s (or lower "
                   "train.micro_batch_size or data.seq_len)",
                   s->train.micro_batch_size, s->data.seq_len, mem_str(act, a),
                   mem_str(efficient < need ? efficient : need, b), mem_str(cap, c1), device_what,
                   mem_str(act1, d));
  } else {
    const bool halve = !full && s->dtype == TY_DTYPE_F32;
    ty_errlist_add(errs, s->init_from_scratch ? "model" : "model_path",
                   "the model (%lld parameters) needs at least %s on each GPU for its %s in %s "
                   "and the activations of micro-batches of %d x %d tokens over %d rank%s, more "
                   "than the %s %s: %s%suse more ranks (world_size, one GPU each), %s",
                   (long long)params, mem_str(efficient < need ? efficient : need, a),
                   full ? "weights, gradients and AdamW moments" : "weights",
                   ty_dtype_name(s->dtype), s->train.micro_batch_size, s->data.seq_len,
                   s->world_size, s->world_size == 1 ? "" : "s", mem_str(cap, b), device_what,
                   full && !s->init_from_scratch ? "train LoRA adapters (use_lora), " : "",
                   halve ? "load the base in bfloat16 (dtype), " : "", more);
  }
  return TY_EINVAL;
}
