/* cmd_generate.c - trainyard generate: text from a checkpoint (and a LoRA
 * adapter, applied unmerged) on the CPU or a GPU, decoding over a key/value cache
 * (worker/model/generate.h), streamed to stdout as the tokens come.
 *
 * The prompt is text (encoded with the tokenizer's special tokens), a
 * conversation rendered through the chat template with
 * add_generation_prompt, or token ids. Decoding stops at an end id
 * (generation_config.json's or config.json's eos_token_id, else the
 * tokenizer's EOS), after --max_new_tokens, or at max_position_embeddings.
 * Greedy when --temperature is 0, else top-p sampling seeded by --seed.
 * Prompt and generation speeds go to stderr. --device cuda (or auto, where
 * the build has CUDA and a GPU is visible) runs the decoder on GPU 0
 * (worker/cuda/generate_cuda.h); the token choice, stopping and streaming
 * below are the same on either device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli/commands.h"
#include "common/numbers.h"
#include "worker/ckpt/model_io.h"
#include "worker/ckpt/outputs.h"
#include "worker/model/generate.h"
#include "worker/model/generate_text.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

#define MAX_EOS 16

static void generate_usage(FILE *f) {
  fprintf(
      f,
      "usage: trainyard generate --model_path DIR [--adapter DIR]\n"
      "                          (--prompt TEXT | --messages JSON | --prompt_ids JSON)\n"
      "                          [--max_new_tokens N] [--temperature T] [--top_p P]\n"
      "                          [--seed S] [--tokenizer PATH] [--chat_template NAME]\n"
      "                          [--output text|ids] [--device cpu|cuda|auto]\n"
      "                          [--dtype float32|bfloat16] [--no_cache]\n"
      "Decodes on the CPU or a GPU and streams the text to stdout as the tokens come.\n"
      "  --prompt TEXT        encoded with the tokenizer's special tokens (BOS)\n"
      "  --messages JSON      [{\"role\": \"user\", \"content\": \"...\"}, ...] through the chat\n"
      "                       template (the tokenizer's, or --chat_template llama3, llama2,\n"
      "                       chatml, mistral) with add_generation_prompt\n"
      "  --prompt_ids JSON    token ids, [128000, 9906, ...]; no tokenizer needed\n"
      "  --max_new_tokens N   default 64; decoding also stops at an eos_token_id\n"
      "                       (generation_config.json, config.json, or the tokenizer's)\n"
      "  --temperature T      0 (default): greedy; > 0: sampling from softmax(logits / T)\n"
      "  --top_p P            sampling keeps the most probable tokens up to mass P (default 1)\n"
      "  --seed S             the sampling generator's seed (default 0)\n"
      "  --tokenizer PATH     a tokenizer.json or its folder; default DIR/tokenizer.json\n"
      "  --output text|ids    text (default with a tokenizer), or the generated ids as one\n"
      "                       JSON list (default without one)\n"
      "  --device D           cpu (default), cuda (the weights and the key/value cache on\n"
      "                       GPU 0; a build with the CUDA toolkit), or auto (cuda where\n"
      "                       built and a GPU is visible, else cpu)\n"
      "  --dtype T            on cuda, the weight matrices' type: float32 (the CPU's\n"
      "                       logits up to rounding) or bfloat16 (half the memory); default\n"
      "                       bfloat16 for a bfloat16 checkpoint, else float32\n"
      "  --no_cache           recompute the whole sequence each token on the CPU (slow; a\n"
      "                       check)\n"
      "With --adapter DIR (adapter_config.json + adapter_model.safetensors, as a LoRA job\n"
      "writes them) the adapter is applied unmerged. Prompt and generation tokens/s go to\n"
      "stderr.\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
  const char *model_path, *adapter, *prompt, *messages, *prompt_ids, *tokenizer, *chat_template;
  const char *output, *device, *dtype;
  long max_new;
  double temperature, top_p;
  long seed;
  int no_cache;
} gen_opts_t;

/* A number flag in [lo, hi], or -1 after a message. */
static int parse_real(const char *flag, const char *s, double lo, double hi, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (*s && !*end && isfinite(v) && v >= lo && v <= hi) {
    *out = v;
    return 0;
  }
  fprintf(stderr, "trainyard generate: %s wants a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
  return -1;
}

/* argv into o; 0, 1 (--help done) or 2 after a message. */
static int parse_args(int argc, char **argv, gen_opts_t *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      generate_usage(stdout);
      return 1;
    }
    if (!strcmp(a, "--no_cache")) {
      o->no_cache = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "trainyard generate: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--model_path")) {
      o->model_path = v;
    } else if (!strcmp(a, "--adapter")) {
      o->adapter = v;
    } else if (!strcmp(a, "--prompt")) {
      o->prompt = v;
    } else if (!strcmp(a, "--messages")) {
      o->messages = v;
    } else if (!strcmp(a, "--prompt_ids")) {
      o->prompt_ids = v;
    } else if (!strcmp(a, "--tokenizer")) {
      o->tokenizer = v;
    } else if (!strcmp(a, "--device")) {
      o->device = v;
    } else if (!strcmp(a, "--dtype")) {
      if (strcmp(v, "float32") && strcmp(v, "bfloat16")) {
        fprintf(stderr, "trainyard generate: --dtype %s: use float32 or bfloat16\n", v);
        return 2;
      }
      o->dtype = v;
    } else if (!strcmp(a, "--chat_template")) {
      o->chat_template = v;
    } else if (!strcmp(a, "--output")) {
      if (strcmp(v, "text") && strcmp(v, "ids")) {
        fprintf(stderr, "trainyard generate: --output %s: use text or ids\n", v);
        return 2;
      }
      o->output = v;
    } else if (!strcmp(a, "--max_new_tokens")) {
      if (!ty_parse_long(v, 1, 1L << 24, &o->max_new)) {
        fprintf(stderr, "trainyard generate: --max_new_tokens wants a whole number in 1..%ld\n",
                1L << 24);
        return 2;
      }
    } else if (!strcmp(a, "--seed")) {
      if (!ty_parse_long(v, 0, 0x7fffffffffffffffL, &o->seed)) {
        fprintf(stderr, "trainyard generate: --seed wants a whole number >= 0\n");
        return 2;
      }
    } else if (!strcmp(a, "--temperature")) {
      if (parse_real(a, v, 0, 100, &o->temperature)) return 2;
    } else if (!strcmp(a, "--top_p")) {
      if (parse_real(a, v, 0, 1, &o->top_p)) return 2;
      if (o->top_p <= 0) {
        fprintf(stderr, "trainyard generate: --top_p must be above 0 (1 keeps every token)\n");
        return 2;
      }
    } else {
      fprintf(stderr, "trainyard generate: unknown option %s\n", a);
      generate_usage(stderr);
      return 2;
    }
  }
  const int given = !!o->prompt + !!o->messages + !!o->prompt_ids;
  if (!o->model_path || given != 1) {
    fprintf(stderr,
            "trainyard generate: --model_path and one of --prompt, --messages or "
            "--prompt_ids are required\n");
    generate_usage(stderr);
    return 2;
  }
  return 0;
}

/* --prompt_ids: a JSON list of whole numbers. */
static int parse_ids(const char *s, int **ids, int *n, char *err, size_t errlen) {
  json_error_t je;
  json_t *j = json_loads(s, JSON_DECODE_ANY, &je);
  int rc = 0;
  if (!j || !json_is_array(j) || json_array_size(j) == 0 || json_array_size(j) > (1u << 24)) {
    rc =
        ty_errf(err, errlen, TY_EINVAL,
                "--prompt_ids must be a non-empty JSON list of token ids, such as [1, 22, 333]%s%s",
                j ? "" : ": ", j ? "" : je.text);
  } else {
    *n = (int)json_array_size(j);
    *ids = malloc(sizeof(int) * *n);
    for (int i = 0; i < *n && !rc; i++) {
      const json_t *x = json_array_get(j, i);
      if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 0x7fffffff)
        rc = ty_errf(err, errlen, TY_EINVAL,
                     "--prompt_ids[%d] is not a token id (a whole number >= 0)", i);
      else
        (*ids)[i] = (int)json_integer_value(x);
    }
  }
  json_decref(j);
  return rc;
}

/* The prompt's ids from whichever of the three flags was given. */
static int prompt_ids(const gen_opts_t *o, const tok_t *tok, int **ids, int *n, char *err,
                      size_t errlen) {
  *ids = NULL;
  *n = 0;
  if (o->prompt_ids) return parse_ids(o->prompt_ids, ids, n, err, errlen);
  if (o->prompt) return gentext_encode_prompt(tok, o->prompt, ids, n, err, errlen);
  json_error_t je;
  json_t *msgs = json_loads(o->messages, 0, &je);
  if (!msgs)
    return ty_errf(err, errlen, TY_EINVAL,
                   "--messages is not valid JSON (%s at column %d); give a list such as "
                   "[{\"role\": \"user\", \"content\": \"Hello\"}]",
                   je.text, je.column);
  char why[512];
  int rc = gentext_encode_messages(tok, msgs, o->chat_template, ids, n, why, sizeof why);
  json_decref(msgs);
  if (rc) return ty_errf(err, errlen, rc, "--messages: %s", why);
  return 0;
}

static int is_eos(const int64_t *eos, int n_eos, int id) {
  for (int i = 0; i < n_eos; i++)
    if (eos[i] == id) return 1;
  return 0;
}

/* The decoding loop: the prompt, then one token at a time. */
typedef struct {
  gen_t *g;   /* with the cache */
  model_t *m; /* without (--no_cache): the whole sequence each token */
  lora_t *lo;
  int *seq, len, S; /* prompt and generated ids (S of room) */
} runner_t;

static int run_feed(runner_t *r, int from, char *err, size_t errlen) {
  if (r->g) return gen_feed(r->g, r->seq + from, r->len - from, err, errlen);
  return model_forward(r->m, r->seq, NULL, 1, r->len, r->lo, NULL, err, errlen);
}

static const float *run_logits(const runner_t *r) {
  if (r->g) return gen_logits(r->g);
  return r->m->logits + (size_t)(r->len - 1) * r->m->d.V;
}

int cmd_generate(int argc, char **argv) {
  gen_opts_t o = {.max_new = 64, .temperature = 0, .top_p = 1};
  int prc = parse_args(argc, argv, &o);
  if (prc) return prc == 1 ? 0 : 2;

  char err[1024] = "", tokpath[4096] = "";
  int rc = 0;
  tok_t *tok = NULL;
  if (o.tokenizer)
    snprintf(tokpath, sizeof tokpath, "%s", o.tokenizer);
  else if (!gentext_default_tokenizer(o.model_path, tokpath, sizeof tokpath))
    tokpath[0] = '\0';
  if (!tokpath[0] && !o.prompt_ids) {
    fprintf(stderr,
            "trainyard generate: %s needs a tokenizer, and %s has no tokenizer.json; pass "
            "--tokenizer PATH, or token ids with --prompt_ids\n",
            o.prompt ? "--prompt" : "--messages", o.model_path);
    return 2;
  }
  if (!o.output) o.output = tokpath[0] ? "text" : "ids";
  gen_device_t dev = GEN_DEVICE_CPU;
  if (o.no_cache && o.device && !strcmp(o.device, "cuda")) {
    fprintf(stderr, "trainyard generate: --no_cache recomputes on the CPU; drop --device cuda\n");
    return 2;
  }
  if (o.dtype && (!o.device || strcmp(o.device, "cuda"))) {
    fprintf(stderr,
            "trainyard generate: --dtype sets the GPU's weights; use it with --device "
            "cuda (the CPU decodes in float32)\n");
    return 2;
  }
  if (!o.no_cache && o.device && (rc = gen_device_pick(o.device, &dev, err, sizeof err))) {
    fprintf(stderr, "trainyard generate: %s\n", err);
    return rc == TY_EINVAL ? 2 : 1;
  }
  const int text_out = !strcmp(o.output, "text");
  if (text_out && !tokpath[0]) {
    fprintf(stderr, "trainyard generate: --output text needs a tokenizer (--tokenizer PATH)\n");
    return 2;
  }
  if (tokpath[0] && (rc = tok_load(tokpath, &tok, err, sizeof err))) {
    fprintf(stderr, "trainyard generate: tokenizer %s: %s\n", tokpath, err);
    return 1;
  }

  llama_config_t cfg;
  llama_config_init(&cfg);
  model_t *m = NULL;
  lora_t *lo = NULL;
  gen_t *g = NULL;
  int *prompt = NULL, n_prompt = 0, *seq = NULL, *generated = NULL, n_gen = 0;
  float *scratch = NULL;
  int *idx = NULL;
  int64_t eos[MAX_EOS];
  int n_eos = 0, S = 0;
  gentext_stream_t stream = {0};
  rc = model_io_read_config(o.model_path, &cfg, err, sizeof err);
  if (!rc) rc = prompt_ids(&o, tok, &prompt, &n_prompt, err, sizeof err);
  if (!rc && n_prompt == 0)
    rc = ty_errf(err, sizeof err, TY_EINVAL, "the prompt encodes to no tokens; give some text");
  if (!rc && n_prompt > cfg.max_position_embeddings)
    rc = ty_errf(err, sizeof err, TY_EINVAL,
                 "the prompt is %d tokens, longer than the model's max_position_embeddings "
                 "(%lld); shorten it",
                 n_prompt, (long long)cfg.max_position_embeddings);
  if (!rc) {
    const long room = cfg.max_position_embeddings - n_prompt;
    S = n_prompt + (int)(o.max_new < room ? o.max_new : room);
    if (o.max_new > room + 1)
      fprintf(stderr,
              "trainyard generate: at most %ld new tokens fit in max_position_embeddings "
              "(%lld)\n",
              room + 1, (long long)cfg.max_position_embeddings);
  }
  if (!rc)
    rc = o.no_cache ? model_create(&m, &cfg, 1, S, MODEL_EVAL, err, sizeof err)
                    : model_create_weights(&m, &cfg, 1, 1, MODEL_EVAL, err, sizeof err);
  if (!rc) rc = model_io_load(m, o.model_path, NULL, NULL, NULL, err, sizeof err);
  /* On a GPU: the matrices as --dtype, else as a bf16 checkpoint lies. */
  const ty_dtype_t wdt = o.dtype ? (strcmp(o.dtype, "bfloat16") ? TY_DTYPE_F32 : TY_DTYPE_BF16)
                         : cfg.torch_dtype == TY_DTYPE_BF16 ? TY_DTYPE_BF16
                                                            : TY_DTYPE_F32;
  if (!rc && o.adapter) rc = outputs_read_adapter(o.adapter, m, &lo, err, sizeof err);
  if (!rc && !o.no_cache)
    rc = gen_create_on(&g, dev, &m->d, &m->w, lo, S, (int)cfg.sliding_window, wdt, err, sizeof err);
  if (!rc) rc = gentext_eos(o.model_path, tok, eos, MAX_EOS, &n_eos, err, sizeof err);
  if (!rc) {
    seq = malloc(sizeof(int) * (S + 1));
    generated = malloc(sizeof(int) * (S + 1));
    scratch = malloc(sizeof(float) * cfg.vocab_size);
    idx = malloc(sizeof(int) * cfg.vocab_size);
    if (!seq || !generated || !scratch || !idx)
      rc = ty_errf(err, sizeof err, TY_EEXHAUSTED, "no memory for the sequence");
  }
  const char *why = "max_new_tokens";
  double t0 = now_s(), t_prompt = 0, t_gen = 0;
  if (!rc) {
    memcpy(seq, prompt, sizeof(int) * n_prompt);
    runner_t r = {g, m, lo, seq, n_prompt, S};
    uint64_t rng = (uint64_t)o.seed;
    rc = run_feed(&r, 0, err, sizeof err);
    t_prompt = now_s() - t0;
    const double t1 = now_s();
    while (!rc) {
      const int next = gen_sample(run_logits(&r), (int)cfg.vocab_size, (float)o.temperature,
                                  (float)o.top_p, &rng, scratch, idx);
      if (is_eos(eos, n_eos, next)) {
        why = "eos";
        break;
      }
      generated[n_gen++] = next;
      if (text_out) {
        char *piece = NULL;
        rc = gentext_stream_push(&stream, tok, (uint32_t)next, false, &piece, err, sizeof err);
        if (!rc && piece[0]) {
          fputs(piece, stdout);
          fflush(stdout);
        }
        free(piece);
      }
      if (rc || n_gen >= o.max_new) break;
      if (r.len >= S) { /* no position left to run the token at */
        why = "max_position_embeddings";
        break;
      }
      seq[r.len++] = next;
      rc = run_feed(&r, r.len - 1, err, sizeof err);
    }
    t_gen = now_s() - t1;
  }
  if (!rc && text_out) {
    char *piece = NULL;
    rc = gentext_stream_flush(&stream, tok, &piece, err, sizeof err);
    if (!rc) printf("%s\n", piece);
    free(piece);
  } else if (!rc) {
    printf("[");
    for (int i = 0; i < n_gen; i++) printf(i ? ", %d" : "%d", generated[i]);
    printf("]\n");
  }
  fflush(stdout);
  if (!rc)
    fprintf(stderr,
            "trainyard generate: prompt %d tokens in %.3f s (%.1f tokens/s); generated %d "
            "tokens in %.3f s (%.1f tokens/s); stopped at %s; device %s%s\n",
            n_prompt, t_prompt, t_prompt > 0 ? n_prompt / t_prompt : 0.0, n_gen, t_gen,
            t_gen > 0 ? n_gen / t_gen : 0.0, why, gen_device_name(dev),
            dev == GEN_DEVICE_CUDA && wdt == TY_DTYPE_BF16 ? " (bfloat16 weights)" : "");
  else
    fprintf(stderr, "trainyard generate: %s\n", err);
  gentext_stream_free(&stream);
  free(seq);
  free(generated);
  free(scratch);
  free(idx);
  free(prompt);
  gen_free(g);
  lora_free(lo);
  model_free(m);
  tok_free(tok);
  return rc ? 1 : 0;
}
