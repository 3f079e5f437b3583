/* train_dpo.c - the passes of train.objective dpo; see train_dpo.h. */
#include "worker/rank/train_dpo.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/xalloc.h"
#include "worker/data/examples.h"

#define REF_MAGIC "TYDPORF1"

struct train_dpo {
  const train_args_t *a;
  const train_backend_t *b;
  data_t *d;
  dpo_config_t cfg;
  int P, T; /* pairs a micro-batch, tokens a row */
  /* One micro-batch: rows [2P, T+1], the model's inputs, targets,
   * weights, positions [2P, T], and per row the policy's and the
   * reference's summed losses and the backward's scales. */
  int32_t *rows, *pos;
  int *inputs, *targets;
  float *weights, *scales;
  double *pol, *ref;
  /* Training every weight: the reference's summed losses of every
   * training pair's two rows, then every held-out pair's; NULL under
   * LoRA (the adapters switched off instead). */
  float *table;
  int64_t n_train, n_eval;
};

/* The reference's file: output_dir/tokenized/reference-<key>.bin, the key
 * over what its numbers depend on (the examples, the layout, the base). */
static void table_path(const train_args_t *a, char *path, size_t len) {
  const jobspec_t *s = a->spec;
  uint64_t h = examples_hash(EXAMPLES_HASH_INIT, &a->data->key, sizeof a->data->key);
  const int64_t id[] = {s->data.seq_len, (int64_t)(s->data.eval_fraction * 1e9), s->dtype,
                        s->init_from_scratch, (int64_t)s->train.seed};
  h = examples_hash(h, id, sizeof id);
  h = examples_hash(h, s->model_path, strlen(s->model_path));
  snprintf(path, len, "%s/tokenized/reference-%016llx.bin", s->output_dir, (unsigned long long)h);
}

/* The table from its file: 0, TY_ENOTFOUND, or TY_EDATALOSS for a file
 * that is not this job's whole table. */
static int table_read(train_dpo_t *t, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rbe");
  if (!f) return TY_ENOTFOUND;
  const size_t n = (size_t)(t->n_train + t->n_eval) * 2;
  char magic[8];
  int64_t counts[2];
  const bool ok = fread(magic, 8, 1, f) == 1 && !memcmp(magic, REF_MAGIC, 8) &&
                  fread(counts, sizeof counts, 1, f) == 1 && counts[0] == t->n_train &&
                  counts[1] == t->n_eval && fread(t->table, sizeof *t->table, n, f) == n &&
                  fgetc(f) == EOF;
  fclose(f);
  return ok ? 0
            : ty_errf(err, errlen, TY_EDATALOSS,
                      "%s is not the reference of this job's %lld training and %lld held-out "
                      "pairs; delete it, or start the job in a new output_dir",
                      path, (long long)t->n_train, (long long)t->n_eval);
}

/* The table into its file, written whole under a temporary name. */
static int table_write(const train_dpo_t *t, const char *path, char *err, size_t errlen) {
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%.4200s.tmp-%d", path, (int)getpid());
  const size_t n = (size_t)(t->n_train + t->n_eval) * 2;
  const int64_t counts[2] = {t->n_train, t->n_eval};
  char dir[4300];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  int rc = ty_mkdirs(dir, err, errlen);
  if (rc) return rc;
  FILE *f = fopen(tmp, "wbe");
  bool ok = f && fwrite(REF_MAGIC, 8, 1, f) == 1 && fwrite(counts, sizeof counts, 1, f) == 1 &&
            fwrite(t->table, sizeof *t->table, n, f) == n && fflush(f) == 0 &&
            fsync(fileno(f)) == 0;
  const int e = errno;
  if (f && fclose(f) != 0) ok = false;
  if (ok && rename(tmp, path) == 0) return 0;
  const int e2 = ok ? errno : e;
  unlink(tmp);
  return ty_errf(err, errlen, TY_EUNAVAILABLE,
                 "cannot write the reference's log-probabilities to %s: %s", path, strerror(e2));
}

/* The reference's or the policy's summed losses of the rows in t->inputs
 * (bt), into sums [2P]. */
static int forward_rows(train_dpo_t *t, const model_batch_t *bt, bool adapters, double *sums,
                        char *err, size_t errlen) {
  const train_backend_t *b = t->b;
  if (!adapters && b->adapters_on) b->adapters_on(b->ctx, false);
  double mean;
  int rc = b->forward(b->ctx, bt, &mean, err, errlen);
  if (!rc) rc = b->row_losses(b->ctx, sums, err, errlen);
  if (!adapters && b->adapters_on) b->adapters_on(b->ctx, true);
  return rc;
}

/* Pair p of the training pairs (p < n_train) or the held-out ones (p -
 * n_train) into micro-batch slot k. */
static int fill_slot(train_dpo_t *t, int64_t p, int k, char *err, size_t errlen) {
  const int T = t->T;
  int32_t *rows = t->rows + (size_t)2 * k * (T + 1);
  float *w = t->weights + (size_t)2 * k * T;
  int32_t *pos = t->pos + (size_t)2 * k * T;
  return p < t->n_train ? data_train_row(t->d, p, rows, w, pos, err, errlen)
                        : data_eval_row(t->d, p - t->n_train, rows, w, pos, err, errlen);
}

/* Every pair's reference, each rank scoring pairs r, r + world, ... and
 * the ranks summing the table (each pair's numbers come from one rank). */
static int table_score(train_dpo_t *t, char *err, size_t errlen) {
  const train_args_t *a = t->a;
  const int rank = comm_rank(a->comm), world = comm_world_size(a->comm);
  const int64_t total = t->n_train + t->n_eval, per = (int64_t)world * t->P;
  const int64_t rounds = (total + per - 1) / per;
  memset(t->table, 0, (size_t)total * 2 * sizeof *t->table);
  double last = 0;
  int rc = 0;
  for (int64_t i = 0; i < rounds && !rc; i++) {
    /* Slot k of this rank takes pair (i P + k) world + rank; past the end,
     * pair 0 again (every rank runs every round's collectives), unkept. */
    for (int k = 0; k < t->P && !rc; k++) {
      const int64_t p = (i * t->P + k) * world + rank;
      rc = fill_slot(t, p < total ? p : 0, k, err, errlen);
    }
    if (rc) break;
    data_split_rows(t->rows, 2 * t->P, t->T, t->inputs, t->targets);
    const model_batch_t bt = {t->inputs, t->targets, t->weights, t->pos, 2 * t->P, t->T};
    rc = forward_rows(t, &bt, true, t->ref, err, errlen);
    for (int k = 0; k < t->P && !rc; k++) {
      const int64_t p = (i * t->P + k) * world + rank;
      if (p >= total) continue;
      t->table[2 * p] = (float)t->ref[2 * k];
      t->table[2 * p + 1] = (float)t->ref[2 * k + 1];
    }
    const double now = ty_mono_s();
    if (!rc && (now - last >= 1.0 || i + 1 == rounds) && a->progress) {
      last = now;
      int64_t done = (i + 1) * per < total ? (i + 1) * per : total;
      train_progress_t pr = {.phase = REPORT_PHASE_REFERENCE,
                             .loss = NAN,
                             .lr = NAN,
                             .grad_norm = NAN,
                             .eval_loss = NAN,
                             .message = "",
                             .done = done,
                             .total = total};
      if (a->progress(a->progress_ctx, &pr))
        rc = ty_errf(err, errlen, TY_ECANCELLED,
                     "stopped while scoring the reference: the attempt was ended from outside");
    }
  }
  if (!rc && world > 1 && comm_all_reduce(a->comm, t->table, (size_t)total * 2))
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "summing the reference's table: %s",
                 comm_error(a->comm));
  return rc;
}

int train_dpo_open(train_dpo_t **out, const train_args_t *a, data_t *d, int64_t start, char *err,
                   size_t errlen) {
  *out = NULL;
  const train_backend_t *b = a->backend;
  if (!b->row_losses || !b->row_scales || (b->span.adapters && !b->adapters_on) ||
      (b->span.n > 0 && !b->backward))
    return ty_errf(err, errlen, TY_EINTERNAL,
                   "train.objective dpo: these passes give no per-row losses (device cuda?)");
  if (!data_pairs(d))
    return ty_errf(err, errlen, TY_EINTERNAL, "train.objective dpo needs the data as pairs");
  train_dpo_t *t = xcalloc(1, sizeof *t);
  t->a = a, t->b = b, t->d = d;
  t->cfg = dpo_config(a->spec);
  t->P = a->spec->train.micro_batch_size;
  t->T = a->spec->data.seq_len;
  const size_t R = (size_t)2 * t->P, T = (size_t)t->T;
  t->rows = xmalloc(R * (T + 1) * sizeof *t->rows);
  t->pos = xmalloc(R * T * sizeof *t->pos);
  t->inputs = xmalloc(R * T * sizeof *t->inputs);
  t->targets = xmalloc(R * T * sizeof *t->targets);
  t->weights = xmalloc(R * T * sizeof *t->weights);
  t->scales = xmalloc(R * sizeof *t->scales);
  t->pol = xmalloc(R * sizeof *t->pol);
  t->ref = xmalloc(R * sizeof *t->ref);
  t->n_train = data_num_train_windows(d);
  t->n_eval = data_num_eval_windows(d);
  *out = t;
  /* The table only where the trained weights are the model's own. */
  if (b->span.adapters || b->span.n == 0) return 0;
  t->table = xmalloc((size_t)(t->n_train + t->n_eval) * 2 * sizeof *t->table);
  char path[4200];
  table_path(a, path, sizeof path);
  int rc = table_read(t, path, err, errlen);
  if (rc != TY_ENOTFOUND) return rc;
  if (start > 0)
    return ty_errf(err, errlen, TY_EPRECONDITION,
                   "the run resumes at step %lld, and the reference's log-probabilities (%s), "
                   "scored before its first step, are gone: they cannot be scored again from "
                   "weights that have moved; start the job in a new output_dir",
                   (long long)start, path);
  rc = table_score(t, err, errlen);
  if (!rc && comm_rank(a->comm) == 0) rc = table_write(t, path, err, errlen);
  return rc;
}

void train_dpo_free(train_dpo_t *t) {
  if (!t) return;
  free(t->rows);
  free(t->pos);
  free(t->inputs);
  free(t->targets);
  free(t->weights);
  free(t->scales);
  free(t->pol);
  free(t->ref);
  free(t->table);
  free(t);
}

/* Counted targets of row r of bt. */
static int64_t row_count(const model_batch_t *bt, int r) {
  int64_t n = 0;
  for (int j = 0; j < bt->t; j++) n += bt->weights[(size_t)r * bt->t + j] != 0.0f;
  return n;
}

/* The pairs of bt whose reference is in t->ref: losses and metrics into
 * sums, and with pair_weight > 0 the backward pass. */
static int score(train_dpo_t *t, const model_batch_t *bt, double pair_weight, dpo_sums_t *sums,
                 char *err, size_t errlen) {
  int rc = forward_rows(t, bt, true, t->pol, err, errlen);
  if (rc) return rc;
  for (int k = 0; k < bt->b / 2; k++) {
    /* Log-probabilities are minus the summed losses. */
    const dpo_pair_t p = {.pc = -t->pol[2 * k],
                          .pr = -t->pol[2 * k + 1],
                          .refc = -t->ref[2 * k],
                          .refr = -t->ref[2 * k + 1],
                          .nc = row_count(bt, 2 * k),
                          .nr = row_count(bt, 2 * k + 1)};
    double d_pc, d_pr;
    dpo_pair(&t->cfg, &p, &d_pc, &d_pr, sums);
    /* d(loss)/d(row loss) = -d(loss)/d(log-probability). */
    t->scales[2 * k] = (float)(-d_pc * pair_weight);
    t->scales[2 * k + 1] = (float)(-d_pr * pair_weight);
  }
  if (pair_weight <= 0) return 0;
  const train_backend_t *b = t->b;
  rc = b->row_scales(b->ctx, t->scales, err, errlen);
  return rc ? rc : b->backward(b->ctx, 1.0f, err, errlen);
}

/* The reference of bt's pairs into t->ref: the table's rows of items (its
 * training or held-out pairs), or under LoRA a forward without adapters. */
static int reference(train_dpo_t *t, const model_batch_t *bt, const int64_t *items, char *err,
                     size_t errlen) {
  if (!t->table) return forward_rows(t, bt, false, t->ref, err, errlen);
  for (int k = 0; k < bt->b / 2; k++) {
    t->ref[2 * k] = t->table[2 * items[k]];
    t->ref[2 * k + 1] = t->table[2 * items[k] + 1];
  }
  return 0;
}

int train_dpo_step(train_dpo_t *t, const model_batch_t *bt, int64_t step, int micro,
                   double pair_weight, dpo_sums_t *sums, char *err, size_t errlen) {
  int64_t items[bt->b / 2 + 1];
  for (int k = 0; k < bt->b / 2; k++) items[k] = data_train_item(t->d, step, micro, k);
  int rc = reference(t, bt, items, err, errlen);
  return rc ? rc : score(t, bt, pair_weight, sums, err, errlen);
}

int train_dpo_eval(train_dpo_t *t, int64_t n, dpo_sums_t *sums, char *err, size_t errlen) {
  int rc = 0;
  int64_t items[t->P + 1];
  for (int64_t i = 0; i < n && !rc; i += t->P) {
    const int P = (int)(n - i < t->P ? n - i : t->P);
    for (int k = 0; k < P && !rc; k++) {
      items[k] = t->n_train + i + k; /* held-out pairs follow the training ones */
      rc = fill_slot(t, items[k], k, err, errlen);
    }
    if (rc) break;
    data_split_rows(t->rows, 2 * P, t->T, t->inputs, t->targets);
    const model_batch_t bt = {t->inputs, t->targets, t->weights, t->pos, 2 * P, t->T};
    rc = reference(t, &bt, items, err, errlen);
    if (!rc) rc = score(t, &bt, 0, sums, err, errlen);
  }
  return rc;
}
