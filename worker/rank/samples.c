/* samples.c - greedy samples of train.sample_prompts during a run
 * (samples.h). */
#include "worker/rank/samples.h"
#include "worker/rank/worker_env.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/report_wire.h"
#include "common/errors.h"
#include "worker/ckpt/model_io.h"
#include "worker/model/generate.h"
#include "worker/model/generate_text.h"

#define SAMPLES_MAX_EOS 16

struct samples {
  const jobspec_t *s;
  tok_t *tok;
  model_t *base; /* a whole copy of the frozen base (LoRA over shards), or NULL */
  gen_t *g;      /* the CPU decoder */
  gen_t *gpu;    /* on GPU ranks, the GPU decoder once made (NULL: none, or no room) */
  bool gpu_tried;
  model_dims_t d;                       /* for the GPU decoder: the model's shape, */
  const model_weights_t *w;             /* the weights to copy, */
  const lora_t *lo;                     /* the adapters, */
  int window;                           /* Mistral's sliding window */
  int *ids[JOBSPEC_SAMPLE_PROMPTS_MAX]; /* each prompt's ids */
  int n_ids[JOBSPEC_SAMPLE_PROMPTS_MAX];
  int n_prompts, V, S; /* S: the decoder's cache, in tokens */
  int64_t eos[SAMPLES_MAX_EOS];
  int n_eos;
  int64_t last; /* the last step sampled, -1 before any */
};

void samples_free(samples_t *sm) {
  if (!sm) return;
  for (int i = 0; i < sm->n_prompts; i++) free(sm->ids[i]);
  gen_free(sm->g);
  gen_free(sm->gpu);
  model_free(sm->base);
  tok_free(sm->tok);
  free(sm);
}

/* The weights to decode with: m's own, or a whole copy of the base (the
 * base sharded over CPU ranks, or on the GPU). */
static int weights(samples_t *sm, const jobspec_t *s, const llama_config_t *cfg, model_t *m,
                   const fsdp_t *f, const lora_t *lo, const model_weights_t **w, char *err,
                   size_t errlen) {
  const bool gpu = s->device == JOBSPEC_DEVICE_CUDA;
  if (!f && !gpu) {
    *w = &m->w;
    return 0;
  }
  if (!lo)
    return ty_errf(err, errlen, TY_EINVAL,
                   "train.sample_prompts: full training %s; samples need them whole on the host "
                   "(rule sample-prompts)",
                   gpu ? "on GPUs keeps the weights on the device"
                       : "on several ranks holds the weights in shards");
  int rc = model_create_weights(&sm->base, cfg, 1, 1, MODEL_EVAL, err, errlen);
  if (rc) return rc;
  if (s->init_from_scratch)
    model_io_init_scratch(sm->base, s->train.seed);
  else if ((rc = model_io_load(sm->base, s->model_path, NULL, NULL, NULL, err, errlen)))
    return rc;
  /* A QLoRA job over a float checkpoint trains over its projections as 4
   * bits keep them: decode with those (a 4-bit checkpoint's load is
   * dequantized already). */
  if (s->quantization.load_in_4bit && !model_io_quantized(s->model_path)) {
    const ckpt_q4_kind_t k = worker_q4_kind(s);
    for (int i = 0; i < sm->base->n_tensors && !rc; i++) {
      model_tensor_t *t = &sm->base->tensors[i];
      if (ckpt_q4_projection(t->name) && (rc = ckpt_q4_roundtrip(&k, t->data, t->numel)))
        ty_errf(err, errlen, rc, "train.sample_prompts: no memory to quantize %s", t->name);
    }
  }
  *w = &sm->base->w;
  return 0;
}

int samples_open(samples_t **out, const jobspec_t *s, const llama_config_t *cfg, model_t *m,
                 const fsdp_t *f, const lora_t *lo, int rank, char *err, size_t errlen) {
  *out = NULL;
  if (rank != 0 || !s->train.sample_prompts[0][0]) return 0;
  samples_t *sm = calloc(1, sizeof *sm);
  if (!sm) return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for the samples");
  sm->s = s;
  sm->last = -1;
  sm->V = (int)cfg->vocab_size;
  char tokpath[PATH_MAX + 32], why[512];
  int rc = 0;
  if (s->data.tokenizer[0])
    snprintf(tokpath, sizeof tokpath, "%s", s->data.tokenizer);
  else if (!gentext_default_tokenizer(s->model_path, tokpath, sizeof tokpath))
    rc = ty_errf(err, errlen, TY_ENOTFOUND,
                 "train.sample_prompts need a tokenizer, and %s does not exist; set "
                 "data.tokenizer",
                 tokpath);
  if (!rc && (rc = tok_load(tokpath, &sm->tok, why, sizeof why)))
    rc = ty_errf(err, errlen, rc, "train.sample_prompts: tokenizer %s: %s", tokpath, why);
  int longest = 0;
  for (int i = 0; !rc && i < JOBSPEC_SAMPLE_PROMPTS_MAX && s->train.sample_prompts[i][0]; i++) {
    sm->n_prompts = i + 1;
    rc = gentext_encode_prompt(sm->tok, s->train.sample_prompts[i], &sm->ids[i], &sm->n_ids[i], why,
                               sizeof why);
    if (rc) {
      rc = ty_errf(err, errlen, rc, "train.sample_prompts[%d]: %s", i, why);
    } else if (sm->n_ids[i] == 0 || sm->n_ids[i] >= cfg->max_position_embeddings) {
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "train.sample_prompts[%d] is %d tokens; it needs 1 to %lld (the model's "
                   "max_position_embeddings) less one for what it generates",
                   i, sm->n_ids[i], (long long)cfg->max_position_embeddings);
    } else {
      for (int k = 0; k < sm->n_ids[i] && !rc; k++)
        if (sm->ids[i][k] >= sm->V)
          rc = ty_errf(err, errlen, TY_EINVAL,
                       "train.sample_prompts[%d]: token %d is outside the model's vocabulary "
                       "(%d); use the model's own tokenizer",
                       i, sm->ids[i][k], sm->V);
      if (sm->n_ids[i] > longest) longest = sm->n_ids[i];
    }
  }
  if (!rc)
    rc = gentext_eos(s->init_from_scratch ? s->data.tokenizer : s->model_path, sm->tok, sm->eos,
                     SAMPLES_MAX_EOS, &sm->n_eos, err, errlen);
  const model_weights_t *w = NULL;
  if (!rc) rc = weights(sm, s, cfg, m, f, lo, &w, err, errlen);
  if (!rc) {
    int64_t S = (int64_t)longest + s->train.sample_max_new_tokens;
    if (S > cfg->max_position_embeddings) S = cfg->max_position_embeddings;
    sm->S = (int)S;
    sm->d = m->d, sm->w = w, sm->lo = lo, sm->window = (int)cfg->sliding_window;
    rc = gen_create(&sm->g, &m->d, w, lo, (int)S, (int)cfg->sliding_window, err, errlen);
  }
  if (rc) {
    samples_free(sm);
    return rc;
  }
  *out = sm;
  return 0;
}

/* The decoder of a sampling: on GPU ranks, the first time, a GPU decoder
 * over a copy of the base in the job's dtype, where the device has room
 * beside training's buffers (made by then; a step allocates nothing);
 * where it has not, the CPU's, said once on stderr. Its adapter as the
 * optimizer left it. */
static gen_t *decoder(samples_t *sm, char *err, size_t errlen, int *rc) {
  const jobspec_t *s = sm->s;
  if (s->device == JOBSPEC_DEVICE_CUDA && !sm->gpu_tried) {
    sm->gpu_tried = true;
    char why[512];
    const ty_dtype_t wdt = s->dtype == TY_DTYPE_BF16 ? TY_DTYPE_BF16 : TY_DTYPE_F32;
    if (gen_create_on(&sm->gpu, GEN_DEVICE_CUDA, &sm->d, sm->w, sm->lo, sm->S, sm->window, wdt, why,
                      sizeof why))
      fprintf(stderr,
              "[rank 0] samples decode on the CPU: the GPU has no room for a copy of the "
              "base beside training's buffers (%s)\n",
              why);
    else
      fprintf(stderr, "[rank 0] samples decode on the GPU (the base copied in %s)\n",
              ty_dtype_name(wdt));
  }
  *rc = sm->gpu ? gen_refresh_adapter(sm->gpu, err, errlen) : 0;
  return sm->gpu ? sm->gpu : sm->g;
}

/* Prompt i greedily with g; its text (special tokens skipped) into *text. */
static int one(samples_t *sm, gen_t *g, int i, char **text, char *err, size_t errlen) {
  const int max_new = sm->s->train.sample_max_new_tokens;
  uint32_t *out = malloc(sizeof *out * (size_t)max_new);
  if (!out) return ty_errf(err, errlen, TY_EEXHAUSTED, "no memory for a sample");
  gen_reset(g);
  int rc = gen_feed(g, sm->ids[i], sm->n_ids[i], err, errlen), n = 0;
  while (!rc) {
    const int next = gen_sample(gen_logits(g), sm->V, 0.0f, 1.0f, NULL, NULL, NULL);
    bool end = false;
    for (int e = 0; e < sm->n_eos; e++) end |= sm->eos[e] == next;
    if (end) break;
    out[n++] = (uint32_t)next;
    /* Done, or no position left (max_position_embeddings) to run it at. */
    if (n == max_new || gen_len(g) >= sm->S) break;
    rc = gen_feed(g, &next, 1, err, errlen);
  }
  size_t len = 0;
  if (!rc) rc = tok_decode(sm->tok, out, (size_t)n, 1, text, &len, err, errlen);
  free(out);
  return rc;
}

/* text cut to fit a report, at a character boundary. */
static void fit(char *text) {
  size_t n = strlen(text);
  if (n < REPORT_SAMPLE_TEXT_MAX) return;
  n = REPORT_SAMPLE_TEXT_MAX - 1;
  while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) n--;
  text[n] = '\0';
}

int samples_at_step(samples_t *sm, int64_t step, bool final, samples_fn fn, void *ctx, char *err,
                    size_t errlen) {
  if (!sm || step == sm->last) return 0;
  const int every = sm->s->train.sample_every;
  if (!final && (every <= 0 || step % every != 0)) return 0;
  sm->last = step;
  int rc;
  gen_t *g = decoder(sm, err, errlen, &rc);
  if (rc) return rc;
  for (int i = 0; i < sm->n_prompts; i++) {
    char *text = NULL;
    rc = one(sm, g, i, &text, err, errlen);
    if (rc) return rc;
    fit(text);
    fn(ctx, step, sm->s->train.sample_prompts[i], text);
    free(text);
  }
  return 0;
}
