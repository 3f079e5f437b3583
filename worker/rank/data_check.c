/* data_check.c - a job's data checked and prepared before the model is
 * built; see data_check.h. */
#include "worker/rank/data_check.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "common/numbers.h"
#include "worker/ckpt/model_io.h"

/* The data layout of spec s for rank of world over a vocabulary of V. */
data_config_t train_data_config(const jobspec_t *s, const data_prepared_t *prep, int64_t V,
                                int rank, int world) {
  return (data_config_t){.path = s->data.path,
                         .examples_path = prep && prep->path[0] ? prep->path : NULL,
                         .examples_key = prep ? prep->key : 0,
                         .pad_id = prep ? prep->pad_id : 0,
                         .packing = s->data.packing,
                         .pairs = s->train.objective == JOBSPEC_OBJECTIVE_DPO,
                         .format = s->data.format,
                         .vocab_size = V,
                         .seq_len = s->data.seq_len,
                         .eval_fraction = s->data.eval_fraction,
                         .seed = s->train.seed,
                         .world_size = world,
                         .rank = rank,
                         .micro_batch_size = s->train.micro_batch_size,
                         .grad_accum = s->train.grad_accum};
}

/* train_data_prepare with a bound on the bytes read (0: the whole file). */
static int prepare(const jobspec_t *s, int64_t vocab_size, const char *cache_dir,
                   uint64_t max_bytes, data_prepare_progress_fn progress, void *ctx,
                   data_prepared_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (s->data.format != JOBSPEC_DATA_JSONL) return 0;
  const char *tokenizer = s->data.tokenizer[0] ? s->data.tokenizer : s->model_path;
  if (!tokenizer[0])
    return ty_errf(err, errlen, TY_EINVAL,
                   "data.format jsonl needs a tokenizer: set data.tokenizer (a folder with "
                   "tokenizer.json, or the file) or model_path");
  char dir[JOBSPEC_PATH_MAX + 16];
  if (!cache_dir) snprintf(dir, sizeof dir, "%s/tokenized", s->output_dir);
  const data_prepare_t p = {.path = s->data.path,
                            .tokenizer = tokenizer,
                            .kind = s->data.kind,
                            .chat_template = s->data.chat_template,
                            .loss_on = s->data.loss_on,
                            .vocab_size = vocab_size,
                            .max_bytes = max_bytes,
                            .pairs = s->train.objective == JOBSPEC_OBJECTIVE_DPO};
  return data_prepare(&p, cache_dir ? cache_dir : dir, progress, ctx, out, err, errlen);
}

int train_data_prepare(const jobspec_t *s, int64_t vocab_size, const char *cache_dir,
                       data_prepare_progress_fn progress, void *ctx, data_prepared_t *out,
                       char *err, size_t errlen) {
  return prepare(s, vocab_size, cache_dir, 0, progress, ctx, out, err, errlen);
}

void train_jsonl_check(const jobspec_t *s, ty_errlist_t *errs) {
  llama_config_t cfg;
  char err[2048];
  if (s->init_from_scratch)
    cfg = s->model;
  else if (llama_config_init(&cfg), model_io_read_config(s->model_path, &cfg, err, sizeof err))
    return; /* the checkpoint's own rules name what is wrong with it */
  long kib = DATA_CHECK_PREFIX_KIB;
  if (ty_env_long(DATA_CHECK_PREFIX_ENV, 0, 1L << 30,
                  "KiB of a JSONL file's start that validation tokenizes; 0: all of it", &kib, err,
                  sizeof err)) {
    ty_errlist_add(errs, "data.path", "%s", err);
    return;
  }
  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/trainyard-check-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    ty_errlist_add(errs, "data.path", "cannot make a scratch folder to tokenize %s in: %s",
                   s->data.path, strerror(errno));
    return;
  }
  /* The file's start: its bad lines, its tokenizer, and whether its
   * examples already hold a global batch (more examples only add rows). */
  data_prepared_t prep;
  int rc = prepare(s, cfg.vocab_size, dir, (uint64_t)kib << 10, NULL, NULL, &prep, err, sizeof err);
  if (!rc)
    rc = train_data_check(s, &prep, cfg.vocab_size, 0, s->world_size, NULL, 0, err, sizeof err);
  /* Too few there: the whole file decides. */
  if (rc == TY_EINVAL && prep.partial) {
    rc = prepare(s, cfg.vocab_size, dir, 0, NULL, NULL, &prep, err, sizeof err);
    if (!rc)
      rc = train_data_check(s, &prep, cfg.vocab_size, 0, s->world_size, NULL, 0, err, sizeof err);
  }
  if (rc) ty_errlist_add(errs, "data.path", "%s", err);
  ty_rmtree(dir, NULL, 0);
#ifdef __GLIBC__
  /* The tokenizer's tables (tens of MiB for a 128k vocabulary) are freed;
   * a long-lived caller (trainyardd) gives their pages back now rather
   * than keeping them in the allocator's arenas. */
  malloc_trim(0);
#endif
}

int train_data_check(const jobspec_t *s, const data_prepared_t *prep, int64_t vocab_size, int rank,
                     int world, char *note, size_t notelen, char *err, size_t errlen) {
  const data_config_t dc = train_data_config(s, prep, vocab_size, rank, world);
  data_t *d = NULL;
  int rc = data_open(&d, &dc, err, errlen);
  if (note && notelen) note[0] = '\0';
  if (!rc && note && data_masked(d))
    snprintf(note, notelen,
             "%s: %lld examples (%lld tokens) in %lld training and %lld held-out %s of %d "
             "tokens%s; %lld cut to seq_len+1, %lld with no counted token left out",
             s->data.path, (long long)data_num_examples(d), (long long)data_num_tokens(d),
             (long long)data_num_train_windows(d), (long long)data_num_eval_windows(d),
             data_pairs(d) ? "pairs of rows" : "rows", s->data.seq_len + 1,
             s->data.packing ? ", packed" : "",
             (long long)data_num_truncated(d), (long long)data_num_skipped(d));
  data_free(d);
  return rc;
}
