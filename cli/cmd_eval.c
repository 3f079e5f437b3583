/* cmd_eval.c - trainyard eval: the mean next-token loss of a checkpoint
 * (optionally with a LoRA adapter) over the first N windows of a file.
 *
 * Window i is tokens [i*T, (i+1)*T] (T+1 tokens: inputs, then the same
 * shifted by one as targets), in order from the start of the file. Prints
 * {"loss": L, "tokens": K}, K = N*T predicted tokens. With --format jsonl
 * the file's examples are tokenized as a job's (data.* options) into a
 * scratch folder removed afterwards, and the first N rows are evaluated:
 * L is the mean over the counted targets (completions, assistant turns),
 * K their number. With --objective dpo the file's lines are preference
 * pairs and the first N pairs are scored as train.objective dpo scores
 * them (the base, its adapter off, the reference): prints the mean DPO
 * loss, TRL's metrics (rewards/accuracies, rewards/margins, ...) and the
 * number of pairs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/fsutil.h"
#include "common/numbers.h"
#include "worker/data/data.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/ckpt/model_io.h"
#include "worker/ckpt/outputs.h"
#include "worker/rank/train.h"
#include "worker/rank/train_dpo.h"

static void eval_usage(FILE *f) {
  fprintf(f,
          "usage: trainyard eval --model_path DIR [--adapter DIR] --data FILE\n"
          "                      [--format text|u16|u32|jsonl] --seq_len T --batches N\n"
          "                      [--tokenizer PATH] [--kind K] [--chat_template NAME]\n"
          "                      [--loss_on completion|all] [--packing true|false]\n"
          "                      [--objective sft|dpo] [--beta B] [--loss_type sigmoid|ipo|hinge]\n"
          "                      [--label_smoothing S]\n"
          "Prints {\"loss\": L, \"tokens\": K}: the mean next-token loss over N windows of T+1\n"
          "tokens taken in order from the start of FILE (window i = tokens [i*T, (i+1)*T]).\n"
          "With --format jsonl: over the first N rows of FILE's examples, tokenized as a job's\n"
          "data.* options say (tokenizer: --tokenizer, else the model's); L is the mean loss\n"
          "over the counted targets (the completions and assistant turns, or all with\n"
          "--loss_on all) and K their number.\n"
          "With --objective dpo (--format jsonl): over the first N preference pairs, the\n"
          "reference the base (its adapter off): prints {\"loss\": L, \"pairs\": N,\n"
          "\"rewards/accuracies\": A, \"rewards/margins\": M, ...} as TRL names them.\n");
}

/* A positive int flag value, or -1 after an error naming the flag. */
static long parse_positive(const char *flag, const char *s) {
  long v;
  if (ty_parse_long(s, 1, 1L << 30, &v)) return v;
  fprintf(stderr, "trainyard eval: %s wants a whole number in 1..%ld, got '%s'\n", flag, 1L << 30,
          s);
  return -1;
}

typedef struct {
  data_t *d;
  int T;
} window_ctx_t;

static int window_at(void *vctx, int64_t i, int32_t *tokens, char *err, size_t errlen) {
  window_ctx_t *c = vctx;
  return data_read_window(c->d, i * c->T, tokens, err, errlen);
}

/* The first n pairs of d scored as train.objective dpo does (the model's
 * passes, the base the reference): one JSON line of the loss, TRL's
 * metrics and the pairs. */
static int eval_dpo(const jobspec_t *js, model_t *m, lora_t *lo, data_t *d, int64_t n, char *err,
                    size_t errlen) {
  jobspec_t s = *js;
  s.train.micro_batch_size = m->B / 2;
  s.data.seq_len = m->T;
  train_backend_t b;
  comm_t *comm = NULL;
  train_dpo_t *t = NULL;
  dpo_sums_t sums = {0};
  int rc = train_backend_passes(&b, m, lo, err, errlen);
  if (!rc) rc = comm_open(&comm, "self", 0, 1, err, errlen);
  const train_args_t a = {.spec = &s, .comm = comm, .backend = &b};
  if (!rc) rc = train_dpo_open(&t, &a, d, 0, err, errlen);
  if (!rc) rc = train_dpo_eval(t, n, &sums, err, errlen);
  if (!rc) {
    const dpo_sums_t mean = dpo_mean(&sums);
    double metrics[REPORT_DPO_N];
    dpo_report(&mean, metrics);
    printf("{\"loss\": %.9g, \"pairs\": %lld", mean.loss, (long long)n);
#define EVAL_DPO_PRINT(name, trl) printf(", \"" trl "\": %.9g", metrics[REPORT_DPO_##name]);
    REPORT_DPO_METRICS(EVAL_DPO_PRINT)
#undef EVAL_DPO_PRINT
    printf("}\n");
  }
  train_dpo_free(t);
  comm_close(comm);
  train_backend_free(&b);
  return rc;
}

int cmd_eval(int argc, char **argv) {
  const char *model_path = NULL, *adapter = NULL, *data_path = NULL, *format = "text";
  long T = -1, N = -1;
  jobspec_t js; /* the data.* options of --format jsonl, as a job's */
  jobspec_init(&js);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      eval_usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "trainyard eval: %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--model_path")) {
      model_path = v;
    } else if (!strcmp(a, "--adapter")) {
      adapter = v;
    } else if (!strcmp(a, "--data")) {
      data_path = v;
    } else if (!strcmp(a, "--format")) {
      format = v;
    } else if (!strcmp(a, "--seq_len")) {
      if ((T = parse_positive(a, v)) < 0) return 2;
    } else if (!strcmp(a, "--batches")) {
      if ((N = parse_positive(a, v)) < 0) return 2;
    } else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--kind") || !strcmp(a, "--chat_template") ||
               !strcmp(a, "--loss_on") || !strcmp(a, "--packing") || !strcmp(a, "--objective") ||
               !strcmp(a, "--beta") || !strcmp(a, "--loss_type") ||
               !strcmp(a, "--label_smoothing")) {
      char path[64];
      snprintf(
          path, sizeof path, "%s.%s",
          !strcmp(a, "--objective") ? "train"
          : !strcmp(a, "--beta") || !strcmp(a, "--loss_type") || !strcmp(a, "--label_smoothing")
              ? "dpo"
              : "data",
          a + 2);
      ty_errlist_t errs = TY_ERRLIST_INIT;
      if (jobspec_set_flag(&js, path, v, &errs)) {
        for (size_t k = 0; k < errs.len; k++)
          fprintf(stderr, "trainyard eval: %s: %s\n", a, errs.items[k].message);
        ty_errlist_clear(&errs);
        return 2;
      }
    } else {
      fprintf(stderr, "trainyard eval: unknown option %s\n", a);
      eval_usage(stderr);
      return 2;
    }
  }
  jobspec_data_format_t fmt;
  if (!strcmp(format, "text"))
    fmt = JOBSPEC_DATA_TEXT;
  else if (!strcmp(format, "u16"))
    fmt = JOBSPEC_DATA_U16;
  else if (!strcmp(format, "u32"))
    fmt = JOBSPEC_DATA_U32;
  else if (!strcmp(format, "jsonl"))
    fmt = JOBSPEC_DATA_JSONL;
  else {
    fprintf(stderr, "trainyard eval: --format %s: use text, u16, u32 or jsonl\n", format);
    return 2;
  }
  const bool dpo = js.train.objective == JOBSPEC_OBJECTIVE_DPO;
  if (dpo && fmt != JOBSPEC_DATA_JSONL) {
    fprintf(stderr,
            "trainyard eval: --objective dpo scores the pairs of a JSONL file; add "
            "--format jsonl\n");
    return 2;
  }
  if (!model_path || !data_path || T < 1 || N < 1) {
    fprintf(stderr,
            "trainyard eval: --model_path, --data, --seq_len (>= 1) and --batches "
            "(>= 1) are required\n");
    eval_usage(stderr);
    return 2;
  }

  char err[1024] = "";
  llama_config_t cfg;
  llama_config_init(&cfg);
  model_t *m = NULL;
  lora_t *lo = NULL;
  data_t *d = NULL;
  /* Rows of a micro-batch: up to 4 examples, or 4 pairs of two. */
  int B = (N < 4 ? (int)N : 4) * (js.train.objective == JOBSPEC_OBJECTIVE_DPO ? 2 : 1);
  int rc = model_io_read_config(model_path, &cfg, err, sizeof err);
  if (!rc) rc = model_create(&m, &cfg, B, (int)T, MODEL_EVAL, err, sizeof err);
  if (!rc) rc = model_io_load(m, model_path, NULL, NULL, NULL, err, sizeof err);
  if (!rc && adapter) rc = outputs_read_adapter(adapter, m, &lo, err, sizeof err);
  char scratch[4096] = "";
  data_prepared_t prep = {0};
  if (!rc && fmt == JOBSPEC_DATA_JSONL) {
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof scratch, "%s/trainyard-eval-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(scratch)) {
      snprintf(err, sizeof err, "cannot make a scratch folder to tokenize %s in", data_path);
      scratch[0] = '\0';
      rc = -1;
    }
    snprintf(js.data.path, sizeof js.data.path, "%s", data_path);
    snprintf(js.model_path, sizeof js.model_path, "%s", model_path);
    js.data.format = fmt;
    if (!rc)
      rc = train_data_prepare(&js, cfg.vocab_size, scratch, NULL, NULL, &prep, err, sizeof err);
  }
  if (!rc) {
    data_config_t dc = {.path = data_path,
                        .examples_path = prep.path[0] ? prep.path : NULL,
                        .examples_key = prep.key,
                        .pad_id = prep.pad_id,
                        .packing = js.data.packing,
                        .pairs = dpo,
                        .eval_all = true,
                        .format = fmt,
                        .vocab_size = cfg.vocab_size,
                        .seq_len = (int)T,
                        .eval_fraction = 0,
                        .seed = 0,
                        .world_size = 1,
                        .rank = 0,
                        .micro_batch_size = 1,
                        .grad_accum = 1};
    rc = data_open(&d, &dc, err, sizeof err);
  }
  if (!rc && fmt == JOBSPEC_DATA_JSONL && data_num_eval_windows(d) < N) {
    snprintf(err, sizeof err, "%s holds %lld %s of seq_len %ld; --batches asks for %ld", data_path,
             (long long)data_num_eval_windows(d), dpo ? "pairs" : "rows", T, N);
    rc = -1;
  }
  if (!rc && fmt != JOBSPEC_DATA_JSONL && data_num_tokens(d) < N * T + 1) {
    snprintf(err, sizeof err, "%s holds %lld tokens; %ld windows of seq_len %ld need %ld",
             data_path, (long long)data_num_tokens(d), N, T, N * T + 1);
    rc = -1;
  }
  double loss = 0;
  int64_t tokens = 0;
  if (!rc && dpo) {
    rc = eval_dpo(&js, m, lo, d, N, err, sizeof err);
    N = -1; /* printed */
  } else if (!rc && fmt == JOBSPEC_DATA_JSONL) {
    rc = train_eval_data(m, lo, d, N, &loss, &tokens, err, sizeof err);
  } else if (!rc) {
    window_ctx_t ctx = {d, (int)T};
    rc = train_eval(m, lo, (int)T, N, window_at, &ctx, &loss, &tokens, err, sizeof err);
  }
  if (rc)
    fprintf(stderr, "trainyard eval: %s\n", err);
  else if (N > 0)
    printf("{\"loss\": %.9g, \"tokens\": %lld}\n", loss, (long long)tokens);
  data_free(d);
  if (scratch[0]) ty_rmtree(scratch, NULL, 0);
  lora_free(lo);
  model_free(m);
  return rc ? 1 : 0;
}
