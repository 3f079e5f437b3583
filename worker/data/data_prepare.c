/* data_prepare.c - a JSONL file tokenized into an examples file, once,
 * under a lock; see data_prepare.h. */
#include "worker/data/data_prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/clock.h"
#include "common/fsutil.h"
#include "common/xalloc.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "worker/data/examples.h"
#include "worker/data/jsonl.h"

#define PREPARE_FORMAT 1 /* bumped when the tokenization rules change */

/* One example's ids and counted marks, grown as segments are added. */
typedef struct {
  uint32_t *ids;
  uint8_t *counted;
  size_t n, cap;
} ex_buf_t;

typedef struct {
  const data_prepare_t *p;
  tok_t *tok;
  tmpl_t *tmpl;     /* NULL until a conversation needs it */
  const char *tsrc; /* the template's text, or NULL when there is none */
  ex_buf_t b;
  uint32_t eos; /* EOS id, or UINT32_MAX */
} prep_t;

static void buf_push(ex_buf_t *b, const uint32_t *ids, size_t n, uint8_t counted) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->ids = xrealloc(b->ids, b->cap * sizeof *b->ids);
    b->counted = xrealloc(b->counted, b->cap);
  }
  memcpy(b->ids + b->n, ids, n * sizeof *ids);
  memset(b->counted + b->n, counted, n);
  b->n += n;
}

/* Encodes len bytes of s and appends them, marked counted or not. */
static int push_text(prep_t *x, const char *s, size_t len, int special, uint8_t counted, char *err,
                     size_t errlen) {
  uint32_t *ids = NULL;
  size_t n = 0;
  int rc = tok_encode(x->tok, s, len, special, &ids, &n, err, errlen);
  if (!rc) buf_push(&x->b, ids, n, counted);
  free(ids);
  return rc;
}

/* The render of messages [0, n) with add_generation_prompt agp, into *out. */
static int render(prep_t *x, json_t *messages, size_t n, int agp, char **out, char *err,
                  size_t errlen) {
  json_t *slice = json_array();
  for (size_t i = 0; i < n; i++) json_array_append(slice, json_array_get(messages, i));
  const char *bos = tok_bos_token(x->tok), *eos = tok_eos_token(x->tok);
  json_t *ctx = json_pack("{s:o, s:s, s:s, s:b}", "messages", slice, "bos_token", bos ? bos : "",
                          "eos_token", eos ? eos : "", "add_generation_prompt", agp);
  int rc = tmpl_render(x->tmpl, ctx, out, err, errlen);
  json_decref(ctx);
  return rc;
}

/* A conversation: the full render, tokenized segment by segment, the
 * assistant turns' spans counted. */
static int push_messages(prep_t *x, json_t *messages, size_t first_counted, const char *path,
                         int64_t lineno, char *err, size_t errlen) {
  char e2[512];
  if (!x->tsrc)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: a conversation needs a chat template, and the tokenizer %s has "
                   "none; set data.chat_template to llama3, llama2, chatml or mistral",
                   path, (long long)lineno, x->p->tokenizer);
  if (!x->tmpl && tmpl_parse(x->tsrc, &x->tmpl, e2, sizeof e2))
    return ty_errf(err, errlen, TY_EINVAL, "%s line %lld: the chat template does not parse: %s",
                   path, (long long)lineno, e2);
  const size_t n = json_array_size(messages);
  char *full = NULL;
  int rc = render(x, messages, n, 0, &full, e2, sizeof e2);
  if (rc) return ty_errf(err, errlen, TY_EINVAL, "%s line %lld: %s", path, (long long)lineno, e2);
  const size_t flen = strlen(full);
  const bool all = x->p->loss_on == JOBSPEC_LOSS_ON_ALL;
  size_t done = 0; /* bytes of full tokenized so far */
  for (size_t i = 0; i < n && !rc; i++) {
    const char *role = json_string_value(json_object_get(json_array_get(messages, i), "role"));
    if (strcmp(role, "assistant") || i < first_counted) continue;
    char *before = NULL, *upto = NULL;
    rc = render(x, messages, i, 1, &before, e2, sizeof e2);
    if (!rc) rc = render(x, messages, i + 1, 0, &upto, e2, sizeof e2);
    if (rc) {
      rc = ty_errf(err, errlen, TY_EINVAL, "%s line %lld: %s", path, (long long)lineno, e2);
    } else {
      const size_t a = strlen(before), b = strlen(upto);
      if (a < done || a > b || b > flen || strncmp(upto, before, a) || strncmp(full, upto, b))
        rc = ty_errf(err, errlen, TY_EINVAL,
                     "%s line %lld: the chat template does not render messages[%zu] (assistant) "
                     "as an extension of the conversation before it (with "
                     "add_generation_prompt), so its tokens cannot be found; name a built-in "
                     "template in data.chat_template (llama3, llama2, chatml, mistral) or set "
                     "data.loss_on all",
                     path, (long long)lineno, i);
      if (!rc && a > done) rc = push_text(x, full + done, a - done, 0, all, err, errlen);
      if (!rc && b > a) rc = push_text(x, full + a, b - a, 0, 1, err, errlen);
      if (!rc) done = b;
    }
    free(before);
    free(upto);
  }
  if (!rc && flen > done) rc = push_text(x, full + done, flen - done, 0, all, err, errlen);
  free(full);
  return rc;
}

/* A prompt with the special tokens, then its completion and EOS, counted. */
static int push_completion(prep_t *x, const char *prompt, size_t prompt_len,
                           const char *completion, size_t completion_len, char *err,
                           size_t errlen) {
  const bool all = x->p->loss_on == JOBSPEC_LOSS_ON_ALL;
  int rc = push_text(x, prompt, prompt_len, 1, all, err, errlen);
  /* The prompt is no end: an EOS the configuration appends goes. */
  if (!rc && x->b.n && x->b.ids[x->b.n - 1] == x->eos) x->b.n--;
  if (!rc) rc = push_text(x, completion, completion_len, 0, 1, err, errlen);
  if (!rc && x->eos != UINT32_MAX) buf_push(&x->b, &x->eos, 1, 1);
  return rc;
}

/* One parsed example into x->b: of a preference pair, side 0 (the prompt
 * and the chosen response) or 1 (the rejected); of any other, side 0. */
static int tokenize(prep_t *x, const jsonl_example_t *ex, int side, const char *path,
                    int64_t lineno, char *err, size_t errlen) {
  x->b.n = 0;
  char e2[512];
  int rc = 0;
  if (ex->kind == JOBSPEC_KIND_PREFERENCE && !x->p->pairs)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s line %lld: a preference pair (\"chosen\", \"rejected\") is for "
                   "train.objective \"dpo\"; set it, or give examples of one text each",
                   path, (long long)lineno);
  if (ex->kind == JOBSPEC_KIND_TEXT) {
    rc = push_text(x, ex->text, ex->text_len, 1, 1, e2, sizeof e2);
  } else if (ex->kind == JOBSPEC_KIND_PROMPT_COMPLETION) {
    rc = push_completion(x, ex->prompt, ex->prompt_len, ex->completion, ex->completion_len, e2,
                         sizeof e2);
  } else if (ex->kind == JOBSPEC_KIND_PREFERENCE && !ex->conv_form) {
    rc = push_completion(x, ex->prompt, ex->prompt_len, ex->side[side], ex->side_len[side], e2,
                         sizeof e2);
  } else if (ex->kind == JOBSPEC_KIND_PREFERENCE) {
    return push_messages(x, ex->conv[side], ex->prompt_turns, path, lineno, err, errlen);
  } else {
    return push_messages(x, ex->messages, 0, path, lineno, err, errlen);
  }
  if (rc) return ty_errf(err, errlen, rc, "%s line %lld: %s", path, (long long)lineno, e2);
  return 0;
}

/* The key: the data file's identity, the tokenizer files, the template's
 * text, the options. */
static int make_key(const data_prepare_t *p, const char *tsrc, uint64_t *key, char *err,
                    size_t errlen) {
  struct stat st;
  if (stat(p->path, &st))
    return ty_errf(err, errlen, TY_ENOTFOUND, "cannot read data file %s: %s", p->path,
                   strerror(errno));
  uint64_t h = EXAMPLES_HASH_INIT;
  const int64_t id[] = {PREPARE_FORMAT,     (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                        st.st_mtim.tv_nsec, (int64_t)st.st_ino,  (int64_t)st.st_dev,
                        (int64_t)p->kind,   (int64_t)p->loss_on, (int64_t)p->max_bytes,
                        (int64_t)p->pairs};
  h = examples_hash(h, id, sizeof id);
  h = examples_hash(h, tsrc ? tsrc : "", tsrc ? strlen(tsrc) + 1 : 1);
  /* The tokenizer's files: tokenizer.json (the path or in the folder) and
   * tokenizer_config.json beside it. */
  char files[2][4096];
  struct stat ts;
  bool dir = !stat(p->tokenizer, &ts) && S_ISDIR(ts.st_mode);
  snprintf(files[0], sizeof files[0], dir ? "%s/tokenizer.json" : "%s", p->tokenizer);
  snprintf(files[1], sizeof files[1], "%s", files[0]);
  char *slash = strrchr(files[1], '/');
  snprintf(slash ? slash + 1 : files[1],
           sizeof files[1] - (slash ? (size_t)(slash + 1 - files[1]) : 0), "tokenizer_config.json");
  char buf[65536];
  for (int f = 0; f < 2; f++) {
    int fd = open(files[f], O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue; /* tok_load has said what is missing */
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) h = examples_hash(h, buf, (size_t)r);
    close(fd);
  }
  *key = h;
  return 0;
}

/* The progress the building rank leaves in the lock file. */
static void lock_note(int fd, uint64_t done, uint64_t total) {
  char s[64];
  int n = snprintf(s, sizeof s, "%llu %llu\n", (unsigned long long)done, (unsigned long long)total);
  if (pwrite(fd, s, (size_t)n, 0) == n) (void)ftruncate(fd, n);
}

/* Tokenizes every line into a new examples file at out->path. */
static int build(prep_t *x, const data_prepare_t *p, int lockfd, data_prepare_progress_fn progress,
                 void *ctx, data_prepared_t *out, char *err, size_t errlen) {
  jsonl_reader_t *r = NULL;
  examples_writer_t *w = NULL;
  int rc = jsonl_open(&r, p->path, err, errlen);
  if (!rc) rc = examples_writer_open(&w, out->path, err, errlen);
  double last = 0;
  const char *line;
  size_t len;
  int64_t lineno;
  while (!rc && !(rc = jsonl_next(r, &line, &len, &lineno, err, errlen))) {
    if (p->max_bytes && jsonl_offset(r) - len > p->max_bytes) {
      out->partial = true; /* this line starts past the bound */
      rc = 1;
      break;
    }
    jsonl_example_t ex;
    int prc = jsonl_parse(line, len, p->pairs ? JOBSPEC_KIND_PREFERENCE : p->kind, p->path,
                          lineno, &ex, err, errlen);
    if (prc == 1) continue;
    if ((rc = prc)) break;
    /* A pair is two examples, chosen then rejected. */
    for (int side = 0; side < (p->pairs ? 2 : 1) && !rc; side++) {
      rc = tokenize(x, &ex, side, p->path, lineno, err, errlen);
      for (size_t i = 0; !rc && p->vocab_size > 0 && i < x->b.n; i++)
        if (x->b.ids[i] >= (uint64_t)p->vocab_size)
          rc = ty_errf(err, errlen, TY_EINVAL,
                       "%s line %lld: token id %u is outside the model's vocabulary (vocab_size "
                       "%lld); use the model's own tokenizer",
                       p->path, (long long)lineno, x->b.ids[i], (long long)p->vocab_size);
      if (!rc) rc = examples_add(w, x->b.ids, x->b.counted, x->b.n, err, errlen);
    }
    json_decref(ex.root);
    const double now = ty_mono_s();
    if (!rc && now - last >= 0.5) {
      last = now;
      lock_note(lockfd, jsonl_offset(r), jsonl_size(r));
      if (progress && progress(ctx, jsonl_offset(r), jsonl_size(r)))
        rc = ty_errf(err, errlen, TY_ECANCELLED, "stopped while tokenizing %s", p->path);
    }
  }
  if (rc == 1) rc = 0; /* the end of the file */
  if (!rc && examples_written(w) == 0)
    rc = ty_errf(err, errlen, TY_EINVAL, "%s holds no example (every line is blank)", p->path);
  if (!rc) {
    out->examples = examples_written(w);
    rc = examples_commit(w, out->key, jsonl_size(r), err, errlen);
    w = NULL;
  }
  examples_abort(w);
  if (!rc && progress) progress(ctx, jsonl_size(r), jsonl_size(r));
  jsonl_close(r);
  return rc;
}

int data_prepare(const data_prepare_t *p, const char *cache_dir, data_prepare_progress_fn progress,
                 void *ctx, data_prepared_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  prep_t x = {.p = p, .eos = UINT32_MAX};
  char e2[512];
  int rc = tok_load(p->tokenizer, &x.tok, e2, sizeof e2);
  if (rc)
    return ty_errf(err, errlen, rc, "data.tokenizer %s: %s (a JSONL file is tokenized with it)",
                   p->tokenizer, e2);
  if (p->vocab_size > 0 && tok_vocab_size(x.tok) > p->vocab_size) {
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "the tokenizer %s has %lld tokens, more than the model's vocab_size %lld; use "
                 "the model's own tokenizer",
                 p->tokenizer, (long long)tok_vocab_size(x.tok), (long long)p->vocab_size);
    goto out;
  }
  if (tok_eos_id(x.tok) >= 0) x.eos = (uint32_t)tok_eos_id(x.tok);
  out->pad_id = x.eos != UINT32_MAX ? x.eos : 0;
  x.tsrc = p->chat_template && p->chat_template[0] ? tmpl_builtin(p->chat_template)
                                                   : tok_chat_template(x.tok);
  if (p->chat_template && p->chat_template[0] && !x.tsrc) {
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "data.chat_template \"%s\" is not built in; use llama3, llama2, chatml or "
                 "mistral",
                 p->chat_template);
    goto out;
  }
  if ((rc = make_key(p, x.tsrc, &out->key, err, errlen))) goto out;
  if ((rc = ty_mkdirs(cache_dir, err, errlen))) goto out;
  snprintf(out->path, sizeof out->path, "%s/examples-%016llx.bin", cache_dir,
           (unsigned long long)out->key);
  char lock[4200];
  snprintf(lock, sizeof lock, "%s.lock", out->path);
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot open %s: %s", lock, strerror(errno));
    goto out;
  }
  /* Take the lock, or wait for the rank that holds it, showing its progress. */
  while ((rc = ty_flock_try(fd)) == TY_EPRECONDITION) {
    char s[64] = "";
    unsigned long long done = 0, total = 0;
    ssize_t n = pread(fd, s, sizeof s - 1, 0);
    if (n > 0) s[n] = '\0', sscanf(s, "%llu %llu", &done, &total);
    if (progress && progress(ctx, done, total)) {
      close(fd);
      rc = ty_errf(err, errlen, TY_ECANCELLED, "stopped while waiting for %s", out->path);
      goto out;
    }
    nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
  }
  if (rc) {
    close(fd);
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot lock %s: %s", lock, strerror(errno));
    goto out;
  }
  examples_t *have = NULL;
  if (examples_open(&have, out->path, out->key, e2, sizeof e2) == 0) {
    out->examples = examples_count(have);
    examples_close(have);
  } else {
    rc = build(&x, p, fd, progress, ctx, out, err, errlen);
    if (rc) unlink(lock); /* nothing of a refused file stays; a waiter builds anew */
  }
  close(fd); /* releases the lock */
out:
  tmpl_free(x.tmpl);
  tok_free(x.tok);
  free(x.b.ids);
  free(x.b.counted);
  return rc;
}
