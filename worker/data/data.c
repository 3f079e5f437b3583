/* data.c - token windows from a file, shuffled and split per rank; see
 * data.h. */
#include "worker/data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/beneath.h"
#include "common/xalloc.h"
#include "worker/data/data_rows.h"
#include "worker/data/examples.h"

struct data_s {
  data_config_t cfg; /* cfg.path points at path below */
  char *path;        /* owned copy */
  int fd;
  size_t elem;        /* bytes per token: 1, 2 or 4 */
  int64_t num_tokens; /* N */
  int64_t n_train, n_eval;
  int64_t eval_start; /* E, first token of the evaluation tail */
  int64_t global_batch;
  uint8_t *raw;       /* [(T+1) * elem] one window's bytes */
  uint32_t *perm;     /* [n_train] the permutation of perm_epoch */
  int64_t perm_epoch; /* -1: none computed yet */
  /* Format jsonl: the examples and their rows (n_train, n_eval count rows). */
  examples_t *ex;
  data_rows_t *train_rows, *eval_rows;
};

/* The built-in corpus (data.path unset): DATA_BUILTIN_TOKENS u32 ids in an
 * anonymous memory file, so the reading path is the same as for a file.
 * 128 "words" of 2-6 ids over an alphabet of min(V, 64) - 1 ids, separated
 * by id 0, drawn by a seeded generator: spelling is learnable, word order
 * is not, so the loss falls to a known floor. */
#define DATA_BUILTIN_TOKENS (1 << 20)

static int builtin_corpus(int64_t vocab, char *msg, size_t msglen) {
  int fd = memfd_create("trainyard-builtin-corpus", MFD_CLOEXEC);
  if (fd < 0) {
    snprintf(msg, msglen, "cannot create the built-in corpus: %s", strerror(errno));
    return -1;
  }
  const uint32_t A = (uint32_t)(vocab < 64 ? vocab : 64);
  uint32_t words[128][7];
  uint64_t x = 0x5eedc0ffee123457ull;
  for (int w = 0; w < 128; w++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t len = 2 + (uint32_t)(x >> 60) % 5;
    words[w][0] = len;
    for (uint32_t k = 1; k <= len; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      words[w][k] = A > 1 ? 1 + (uint32_t)(x >> 33) % (A - 1) : 0;
    }
  }
  uint32_t *buf = xmalloc((size_t)DATA_BUILTIN_TOKENS * sizeof *buf);
  size_t n = 0;
  while (n < DATA_BUILTIN_TOKENS) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t *w = words[(x >> 33) % 128];
    for (uint32_t k = 1; k <= w[0] && n < DATA_BUILTIN_TOKENS; k++) buf[n++] = w[k];
    if (n < DATA_BUILTIN_TOKENS) buf[n++] = 0;
  }
  /* Little-endian ids, as format u32 states. */
  for (size_t i = 0; i < n; i++) {
    uint8_t *b = (uint8_t *)&buf[i];
    uint32_t v = buf[i];
    b[0] = (uint8_t)v, b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)(v >> 16),
    b[3] = (uint8_t)(v >> 24);
  }
  size_t want = n * sizeof *buf, done = 0;
  while (done < want) {
    ssize_t r = write(fd, (char *)buf + done, want - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      snprintf(msg, msglen, "cannot write the built-in corpus: %s", strerror(errno));
      free(buf);
      close(fd);
      return -1;
    }
    done += (size_t)r;
  }
  free(buf);
  return fd;
}

/* The rows of a JSONL file's examples, into d (whose cfg is set). */
static int open_rows(data_t *d, char *msg, size_t msglen) {
  const data_config_t *cfg = &d->cfg;
  int rc = examples_open(&d->ex, cfg->examples_path, cfg->examples_key, msg, msglen);
  if (rc) return rc;
  const int64_t E = examples_count(d->ex);
  /* Pairs: the unit held out, shuffled and batched is a pair of examples. */
  const int per = cfg->pairs ? 2 : 1;
  if (cfg->pairs && E % 2)
    return ty_errf(msg, msglen, TY_EDATALOSS,
                   "data %s: its tokenized pairs hold an odd number of examples (%lld); delete "
                   "output_dir/tokenized to tokenize the file again",
                   cfg->path, (long long)E);
  const int64_t units = E / per;
  int64_t n_eval = cfg->eval_all ? units : 0;
  if (!cfg->eval_all && cfg->eval_fraction > 0 && units > 0) {
    n_eval = (int64_t)((double)units * cfg->eval_fraction);
    if (n_eval < 1) n_eval = 1;
  }
  rc = data_rows_build(&d->train_rows, d->ex, 0, (units - n_eval) * per, cfg->seq_len,
                       cfg->packing, cfg->pairs, msg, msglen);
  if (!rc)
    rc = data_rows_build(&d->eval_rows, d->ex, (units - n_eval) * per, n_eval * per,
                         cfg->seq_len, cfg->packing, cfg->pairs, msg, msglen);
  if (rc) return rc;
  d->num_tokens = examples_tokens(d->ex);
  d->n_train = data_rows_count(d->train_rows) / per;
  d->n_eval = data_rows_count(d->eval_rows) / per;
  if (cfg->eval_all) return 0;
  if (d->n_train < d->global_batch || d->n_train > UINT32_MAX)
    return ty_errf(msg, msglen, TY_EINVAL,
                   "data file %s holds %lld examples: %lld training %s of seq_len+1 = %d tokens "
                   "(%s; after %lld held-out examples, %lld examples with no counted target left "
                   "out), %s one global batch of %lld %s (world_size %d x micro_batch_size %d x "
                   "grad_accum %d); use more data, a smaller batch%s",
                   cfg->path, (long long)E, (long long)d->n_train,
                   cfg->pairs ? "pairs of rows" : "rows", cfg->seq_len + 1,
                   cfg->pairs     ? "a row each response"
                   : cfg->packing ? "examples packed"
                                  : "one example a row",
                   (long long)(n_eval * per),
                   (long long)(data_rows_skipped(d->train_rows) + data_rows_skipped(d->eval_rows)),
                   d->n_train > UINT32_MAX ? "more than 2^32 rows, beyond" : "fewer than",
                   (long long)d->global_batch, cfg->pairs ? "pairs" : "rows", cfg->world_size, cfg->micro_batch_size,
                   cfg->grad_accum,
                   cfg->packing || cfg->pairs ? " or a smaller seq_len" : " or data.packing");
  return 0;
}

int data_open(data_t **out, const data_config_t *cfg_in, char *msg, size_t msglen) {
  *out = NULL;
  data_config_t builtin;
  const data_config_t *cfg = cfg_in;
  if (!cfg_in->path || !cfg_in->path[0]) {
    builtin = *cfg_in;
    builtin.path = DATA_BUILTIN_NAME;
    builtin.format = JOBSPEC_DATA_U32;
    cfg = &builtin;
  }
  const int64_t T = cfg->seq_len;
  if (T < 1 || cfg->micro_batch_size < 1 || cfg->grad_accum < 1 || cfg->world_size < 1 ||
      cfg->rank < 0 || cfg->rank >= cfg->world_size || !(cfg->eval_fraction >= 0) ||
      !(cfg->eval_fraction < 1)) {
    snprintf(msg, msglen,
             "data layout out of range: seq_len %d, micro_batch_size %d, grad_accum %d, rank %d "
             "of %d, eval_fraction %g (need seq_len, batch sizes >= 1 and eval_fraction in "
             "[0, 1))",
             cfg->seq_len, cfg->micro_batch_size, cfg->grad_accum, cfg->rank, cfg->world_size,
             cfg->eval_fraction);
    return TY_EINVAL;
  }
  if (cfg->pairs && cfg->format != JOBSPEC_DATA_JSONL)
    return ty_errf(msg, msglen, TY_EINVAL,
                   "preference pairs come from a JSONL file's lines (data.format jsonl and "
                   "data.path), not from %s",
                   cfg != cfg_in ? "the built-in corpus" : "a token file");
  if (cfg->format == JOBSPEC_DATA_JSONL) {
    data_t *d = xcalloc(1, sizeof *d);
    d->cfg = *cfg;
    d->path = xstrdup(cfg->path);
    d->cfg.path = d->path;
    d->fd = -1;
    d->global_batch = (int64_t)cfg->world_size * cfg->micro_batch_size * cfg->grad_accum;
    d->perm_epoch = -1;
    int rc = cfg->examples_path ? open_rows(d, msg, msglen)
                                : ty_errf(msg, msglen, TY_EINTERNAL,
                                          "data %s: its examples were not tokenized", cfg->path);
    d->cfg.examples_path = NULL; /* borrowed only for the open */
    if (!rc && !(d->perm = malloc((size_t)(d->n_train ? d->n_train : 1) * sizeof *d->perm)))
      rc = ty_errf(msg, msglen, TY_EEXHAUSTED, "cannot allocate the shuffle order of %lld rows",
                   (long long)d->n_train);
    if (rc) {
      data_free(d);
      return rc;
    }
    *out = d;
    return 0;
  }
  if (cfg->format == JOBSPEC_DATA_TEXT && cfg->vocab_size < 256) {
    snprintf(msg, msglen,
             "data.format text makes every byte a token, which needs vocab_size >= 256 (the "
             "model has %lld); use format u16 or u32 with ids below the vocabulary",
             (long long)cfg->vocab_size);
    return TY_EINVAL;
  }
  char why[1024];
  int fd = cfg != cfg_in ? builtin_corpus(cfg->vocab_size, msg, msglen)
                         : ty_beneath_open(cfg->path, O_RDONLY, 0, why, sizeof why);
  if (fd < 0 && cfg != cfg_in) return TY_EUNAVAILABLE;
  if (fd < 0) {
    snprintf(msg, msglen, "cannot open the data file: %s", why);
    return fd == TY_ENOTFOUND ? TY_ENOTFOUND : TY_EPERM;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(msg, msglen, "data file %s is not a regular file", cfg->path);
    close(fd);
    return TY_EINVAL;
  }
  const jobspec_data_layout_t layout = {cfg->format,     cfg->seq_len,          cfg->eval_fraction,
                                        cfg->world_size, cfg->micro_batch_size, cfg->grad_accum};
  jobspec_data_split_t split;
  int rc = jobspec_data_split(&layout, cfg->path, (uint64_t)st.st_size, &split, msg, msglen);
  if (rc) {
    close(fd);
    return rc;
  }
  data_t *d = xcalloc(1, sizeof *d);
  d->cfg = *cfg;
  d->path = xstrdup(cfg->path);
  d->cfg.path = d->path;
  d->fd = fd;
  d->elem = jobspec_data_token_bytes(cfg->format);
  d->num_tokens = split.tokens;
  d->n_train = split.train;
  d->n_eval = split.eval;
  d->eval_start = split.eval_start;
  d->global_batch = (int64_t)cfg->world_size * cfg->micro_batch_size * cfg->grad_accum;
  d->raw = xmalloc((size_t)(T + 1) * d->elem);
  d->perm = malloc((size_t)split.train * sizeof *d->perm);
  if (!d->perm) {
    snprintf(msg, msglen, "cannot allocate the shuffle order of %lld windows",
             (long long)split.train);
    data_free(d);
    return TY_EEXHAUSTED;
  }
  d->perm_epoch = -1;
  *out = d;
  return 0;
}

void data_free(data_t *d) {
  if (!d) return;
  if (d->fd >= 0) close(d->fd);
  free(d->path);
  free(d->raw);
  free(d->perm);
  data_rows_free(d->train_rows);
  data_rows_free(d->eval_rows);
  examples_close(d->ex);
  free(d);
}

int64_t data_num_tokens(const data_t *d) {
  return d->num_tokens;
}
int64_t data_num_examples(const data_t *d) {
  return d->ex ? examples_count(d->ex) : 0;
}
int64_t data_num_truncated(const data_t *d) {
  return d->ex ? data_rows_truncated(d->train_rows) + data_rows_truncated(d->eval_rows) : 0;
}
int64_t data_num_skipped(const data_t *d) {
  return d->ex ? data_rows_skipped(d->train_rows) + data_rows_skipped(d->eval_rows) : 0;
}
int64_t data_num_train_windows(const data_t *d) {
  return d->n_train;
}
int64_t data_num_eval_windows(const data_t *d) {
  return d->n_eval;
}
int64_t data_global_batch(const data_t *d) {
  return d->global_batch;
}

/* splitmix64: a full-period 64-bit generator whose every output is a good
 * hash of its counter, so (seed, epoch) pairs give independent streams. */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A uniform integer in [0, bound) without modulo bias (rejection). */
static uint64_t uniform_below(uint64_t *state, uint64_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t r;
  do r = splitmix64(state);
  while (r >= limit);
  return r % bound;
}

/* Fisher-Yates shuffle of [0, n_train) for one epoch, into the buffer made
 * at open (no allocation during training). */
static void make_perm(data_t *d, int64_t epoch) {
  uint64_t state = d->cfg.seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(epoch + 1));
  for (int64_t i = 0; i < d->n_train; i++) d->perm[i] = (uint32_t)i;
  for (int64_t i = d->n_train - 1; i > 0; i--) {
    int64_t j = (int64_t)uniform_below(&state, (uint64_t)i + 1);
    uint32_t t = d->perm[i];
    d->perm[i] = d->perm[j];
    d->perm[j] = t;
  }
  d->perm_epoch = epoch;
}

int data_read_window(data_t *d, int64_t first, int32_t *tokens, char *msg, size_t msglen) {
  const int64_t n = (int64_t)d->cfg.seq_len + 1;
  if (first < 0 || first + n > d->num_tokens) {
    snprintf(msg, msglen, "window of %lld tokens at token %lld is past the end of %s (%lld tokens)",
             (long long)n, (long long)first, d->path, (long long)d->num_tokens);
    return TY_ERANGE;
  }
  size_t want = (size_t)n * d->elem, got = 0;
  off_t off = (off_t)first * (off_t)d->elem;
  while (got < want) {
    ssize_t r = pread(d->fd, d->raw + got, want - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      snprintf(msg, msglen, "reading %s at byte offset %lld: %s", d->path,
               (long long)(off + (off_t)got), r < 0 ? strerror(errno) : "the file shrank");
      return TY_EDATALOSS;
    }
    got += (size_t)r;
  }
  const uint8_t *b = d->raw;
  for (int64_t i = 0; i < n; i++) {
    uint32_t id;
    if (d->elem == 1)
      id = b[i];
    else if (d->elem == 2)
      id = (uint32_t)b[2 * i] | (uint32_t)b[2 * i + 1] << 8;
    else
      id = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
           (uint32_t)b[4 * i + 3] << 24;
    if ((int64_t)id >= d->cfg.vocab_size) {
      snprintf(msg, msglen,
               "token id %u at byte offset %lld of %s (token %lld) is outside the vocabulary "
               "(vocab_size %lld); check data.format or the tokenizer",
               id, (long long)(off + (off_t)(i * (int64_t)d->elem)), d->path,
               (long long)(first + i), (long long)d->cfg.vocab_size);
      return TY_EINVAL;
    }
    tokens[i] = (int32_t)id;
  }
  return 0;
}

/* The training window (row) at place g of the run's sequence. */
static int64_t window_at(data_t *d, int64_t g) {
  int64_t epoch = g / d->n_train;
  if (epoch != d->perm_epoch) make_perm(d, epoch);
  return d->perm[g % d->n_train];
}

/* Checks a row's ids against the vocabulary. */
static int check_row(const data_t *d, const char *what, int64_t i, const int32_t *tokens, char *msg,
                     size_t msglen) {
  for (int t = 0; t <= d->cfg.seq_len; t++)
    if (tokens[t] >= d->cfg.vocab_size)
      return ty_errf(msg, msglen, TY_EINVAL,
                     "token id %d in %s row %lld of %s is outside the vocabulary (vocab_size "
                     "%lld); use the model's own tokenizer",
                     tokens[t], what, (long long)i, d->path, (long long)d->cfg.vocab_size);
  return 0;
}

/* Pair p of rows into two rows of tokens [2, T+1], weights and pos [2, T]. */
static int fill_pair(const data_t *d, const data_rows_t *rows, const char *what, int64_t p,
                     int32_t *tokens, float *weights, int32_t *pos, char *msg, size_t msglen) {
  const int T = d->cfg.seq_len;
  int rc = 0;
  for (int k = 0; k < 2 && !rc; k++) {
    data_rows_fill(rows, 2 * p + k, d->cfg.pad_id, tokens + k * (T + 1),
                   weights ? weights + k * T : NULL, pos ? pos + k * T : NULL);
    rc = check_row(d, what, 2 * p + k, tokens + k * (T + 1), msg, msglen);
  }
  return rc;
}

int data_train_row(data_t *d, int64_t i, int32_t *tokens, float *weights, int32_t *pos,
                   char *msg, size_t msglen) {
  if (i < 0 || i >= d->n_train || !d->ex)
    return ty_errf(msg, msglen, TY_ERANGE, "training item %lld of %lld %s does not exist",
                   (long long)i, (long long)d->n_train, d->ex ? "" : "(examples only)");
  if (d->cfg.pairs) return fill_pair(d, d->train_rows, "training", i, tokens, weights, pos, msg,
                                     msglen);
  data_rows_fill(d->train_rows, i, d->cfg.pad_id, tokens, weights, pos);
  return check_row(d, "training", i, tokens, msg, msglen);
}

int64_t data_train_item(data_t *d, int64_t step, int micro, int b) {
  return window_at(d, step * d->global_batch +
                          ((int64_t)micro * d->cfg.world_size + d->cfg.rank) *
                              d->cfg.micro_batch_size +
                          b);
}

bool data_pairs(const data_t *d) {
  return d->cfg.pairs;
}

int data_train_batch(data_t *d, int64_t step, int micro, int32_t *tokens, float *weights,
                     int32_t *pos, char *msg, size_t msglen) {
  const int64_t T = d->cfg.seq_len, B = d->cfg.micro_batch_size;
  int64_t base = step * d->global_batch + ((int64_t)micro * d->cfg.world_size + d->cfg.rank) * B;
  for (int64_t b = 0; b < B; b++) {
    int64_t w = window_at(d, base + b);
    int32_t *row = tokens + b * (T + 1);
    int rc = 0;
    if (d->cfg.pairs) {
      rc = fill_pair(d, d->train_rows, "training", w, tokens + 2 * b * (T + 1),
                     weights ? weights + 2 * b * T : NULL, pos ? pos + 2 * b * T : NULL, msg,
                     msglen);
    } else if (d->ex) {
      data_rows_fill(d->train_rows, w, d->cfg.pad_id, row, weights ? weights + b * T : NULL,
                     pos ? pos + b * T : NULL);
      rc = check_row(d, "training", w, row, msg, msglen);
    } else {
      rc = data_read_window(d, w * d->cfg.seq_len, row, msg, msglen);
    }
    if (rc) return rc;
  }
  return 0;
}

int data_train_micro_batch(data_t *d, int64_t step, int micro, int32_t *tokens, char *msg,
                           size_t msglen) {
  return data_train_batch(d, step, micro, tokens, NULL, NULL, msg, msglen);
}

int data_eval_window(data_t *d, int64_t i, int32_t *tokens, char *msg, size_t msglen) {
  return data_eval_row(d, i, tokens, NULL, NULL, msg, msglen);
}

int data_seq_len(const data_t *d) {
  return d->cfg.seq_len;
}

bool data_masked(const data_t *d) {
  return d->ex != NULL;
}

int64_t data_step_count(data_t *d, int64_t step) {
  if (!d->ex) return d->global_batch * d->cfg.seq_len;
  int64_t n = 0;
  const int per = d->cfg.pairs ? 2 : 1;
  for (int64_t j = 0; j < d->global_batch; j++)
    for (int k = 0; k < per; k++)
      n += data_rows_counted(d->train_rows,
                             per * window_at(d, step * d->global_batch + j) + k);
  return n;
}

int data_eval_row(data_t *d, int64_t i, int32_t *tokens, float *weights, int32_t *pos, char *msg,
                  size_t msglen) {
  if (i < 0 || i >= d->n_eval)
    return ty_errf(msg, msglen, TY_ERANGE, "evaluation window %lld of %lld does not exist",
                   (long long)i, (long long)d->n_eval);
  if (d->cfg.pairs) return fill_pair(d, d->eval_rows, "evaluation", i, tokens, weights, pos, msg,
                                     msglen);
  if (d->ex) {
    data_rows_fill(d->eval_rows, i, d->cfg.pad_id, tokens, weights, pos);
    return check_row(d, "evaluation", i, tokens, msg, msglen);
  }
  for (int t = 0; t < d->cfg.seq_len; t++) {
    if (weights) weights[t] = 1.0f;
    if (pos) pos[t] = t;
  }
  return data_read_window(d, d->eval_start + i * d->cfg.seq_len, tokens, msg, msglen);
}

void data_position_at(const data_t *d, int64_t step, data_position_t *pos) {
  pos->step = step;
  pos->seed = d->cfg.seed;
  pos->num_tokens = d->num_tokens;
  pos->num_train_windows = d->n_train;
  pos->global_batch = d->global_batch;
  pos->seq_len = d->cfg.seq_len;
}

int data_position_check(const data_t *d, const data_position_t *pos, char *msg, size_t msglen) {
  data_position_t now;
  data_position_at(d, pos->step, &now);
  const char *what = NULL;
  long long was = 0, is = 0;
  if (pos->seed != now.seed)
    what = "train.seed", was = (long long)pos->seed, is = (long long)now.seed;
  else if (pos->num_tokens != now.num_tokens)
    what = "the data file's token count", was = pos->num_tokens, is = now.num_tokens;
  else if (pos->seq_len != now.seq_len)
    what = "data.seq_len", was = pos->seq_len, is = now.seq_len;
  else if (pos->global_batch != now.global_batch)
    what = "the global batch (world_size x micro_batch_size x grad_accum)", was = pos->global_batch,
    is = now.global_batch;
  else if (pos->num_train_windows != now.num_train_windows)
    what = "the number of training windows (data.eval_fraction)", was = pos->num_train_windows,
    is = now.num_train_windows;
  if (!what) return 0;
  snprintf(msg, msglen,
           "cannot resume: %s was %lld when the checkpoint was written and is %lld now; resume "
           "with the same data and batch settings or start a new run",
           what, was, is);
  return TY_EPRECONDITION;
}

void data_text_tokens(const char *s, size_t n, int32_t *out) {
  for (size_t i = 0; i < n; i++) out[i] = (unsigned char)s[i];
}

void data_split_rows(const int32_t *rows, int b, int T, int *inputs, int *targets) {
  for (int i = 0; i < b; i++)
    for (int t = 0; t < T; t++) {
      inputs[i * T + t] = rows[i * (T + 1) + t];
      targets[i * T + t] = rows[i * (T + 1) + t + 1];
    }
}
