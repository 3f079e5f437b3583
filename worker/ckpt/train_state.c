/* train_state.c - periodic training checkpoints; see train_state.h. */
#include "worker/ckpt/train_state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errors.h"
#include "common/beneath.h"
#include "common/json_util.h"
#include "worker/ckpt/safetensors.h"

#define STATE_TENSORS "state.safetensors"
#define STATE_JSON "state.json"

/* snprintf into a PATH_MAX buffer; paths come from output_dir, which the
 * spec bounds well below PATH_MAX, so truncation is only a theory. */
__attribute__((format(printf, 2, 3))) static void pathf(char *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out, PATH_MAX, fmt, ap);
  va_end(ap);
}

/* Removes a checkpoint directory: only the files this module writes
 * (state*), then the directory (rmdir fails, harmlessly, if a user put
 * anything else in). */
static void remove_ckpt_dir(const char *dir) {
  DIR *dh = ty_beneath_opendir(dir, NULL, 0);
  struct dirent *e;
  char p[PATH_MAX];
  while (dh && (e = readdir(dh))) {
    if (strncmp(e->d_name, "state", 5) != 0) continue;
    pathf(p, "%s/%s", dir, e->d_name);
    ty_beneath_remove(p, false, NULL, 0);
  }
  if (dh) closedir(dh);
  ty_beneath_remove(dir, true, NULL, 0);
}

/* The tensor file of a rank: state.safetensors when the span is replicated,
 * state-rank<r>.safetensors when each rank holds its own shard. */
static void tensors_path(char *out, const char *dir, bool sharded, int rank) {
  if (sharded)
    pathf(out, "%s/state-rank%d.safetensors", dir, rank);
  else
    pathf(out, "%s/%s", dir, STATE_TENSORS);
}

/* Every rank learns whether any rank failed (status 0 = fine); what names
 * the work for the others' message ("write the checkpoint of step 50"). */
static int agree(comm_t *comm, int rc, const char *what, char *err, size_t errlen) {
  if (comm_world_size(comm) == 1) return rc;
  float status = rc ? 1.0f : 0.0f;
  if (comm_all_reduce(comm, &status, 1) != 0) {
    snprintf(err, errlen, "cannot %s: %s", what, comm_error(comm));
    return TY_EABORTED;
  }
  if (status != 0 && !rc) {
    snprintf(err, errlen, "another rank failed to %s", what);
    return TY_EABORTED;
  }
  return rc;
}

/* The step of a "step-NNNNNNNN" name, or -1 for any other name. */
/* The step of a checkpoint directory's name "step-N", or with tmp of one a
 * save left unfinished, "step-N.tmp"; -1 for any other name. */
static int64_t parse_step_name(const char *name, bool tmp) {
  if (strncmp(name, "step-", 5) != 0) return -1;
  char *end;
  long long v = strtoll(name + 5, &end, 10);
  if (end == name + 5 || v < 0) return -1;
  return strcmp(end, tmp ? ".tmp" : "") ? -1 : (int64_t)v;
}

static int write_json(const char *path, json_t *obj, char *err, size_t errlen) {
  char why[1024];
  int rc = ty_json_write_file(obj, path, JSON_INDENT(2) | JSON_SORT_KEYS, why, sizeof why);
  if (rc) snprintf(err, errlen, "cannot write: %s", why);
  return rc ? TY_EPERM : 0;
}

static int write_tensors(const char *path, const optim_t *o, const float *params, size_t n,
                         char *err, size_t errlen) {
  st_desc_t descs[3] = {{"params", TY_DTYPE_F32, 1, {(int64_t)n}},
                        {"exp_avg", TY_DTYPE_F32, 1, {(int64_t)n}},
                        {"exp_avg_sq", TY_DTYPE_F32, 1, {(int64_t)n}}};
  st_writer_t *w;
  int rc = st_writer_open(path, descs, 3, NULL, &w, err, errlen);
  if (rc) return rc;
  const float *parts[3] = {params, o->m, o->v};
  for (int i = 0; i < 3 && !rc; i++)
    rc = st_writer_write(w, parts[i], n * sizeof(float), err, errlen);
  /* A failed write keeps its own message (the close would only say the
   * file is short). */
  int rc2 = st_writer_close(w, rc ? NULL : err, rc ? 0 : errlen);
  return rc ? rc : rc2;
}

static int write_json_state(const char *dir, const data_t *d, const optim_t *o, size_t n,
                            int64_t step, int world, bool sharded, const train_base_t *base,
                            char *err, size_t errlen) {
  char path[PATH_MAX];
  data_position_t pos;
  data_position_at(d, step, &pos);
  json_t *j =
      json_pack("{sI sI sI si sb s{sI sI sI sI si}}", "step", (json_int_t)step, "optimizer_step",
                (json_int_t)o->t, "n", (json_int_t)n, "world_size", world, "sharded", sharded,
                "data", "seed", (json_int_t)pos.seed, "num_tokens", (json_int_t)pos.num_tokens,
                "num_train_windows", (json_int_t)pos.num_train_windows, "global_batch",
                (json_int_t)pos.global_batch, "seq_len", pos.seq_len);
  if (base && base->fingerprint && base->fingerprint[0])
    json_object_set_new(
        j, "base",
        json_pack("{ss ss}", "model_path", base->model_path, "fingerprint", base->fingerprint));
  pathf(path, "%s/%s", dir, STATE_JSON);
  int rc = write_json(path, j, err, errlen);
  json_decref(j);
  return rc;
}

int train_state_save(const char *output_dir, comm_t *comm, const data_t *d, const optim_t *o,
                     const float *params, size_t n, int64_t step, bool sharded,
                     const train_base_t *base, char *err, size_t errlen) {
  const int rank = comm_rank(comm), world = comm_world_size(comm);
  char root[PATH_MAX], tmp[PATH_MAX], final[PATH_MAX], path[PATH_MAX], what[64];
  snprintf(what, sizeof what, "write the checkpoint of step %lld", (long long)step);
  pathf(root, "%s/checkpoints", output_dir);
  pathf(tmp, "%s/step-%08lld.tmp", root, (long long)step);
  pathf(final, "%s/step-%08lld", root, (long long)step);
  int rc = 0;
  if (rank == 0) {
    remove_ckpt_dir(tmp); /* left by a run that died while writing */
    rc = ty_beneath_mkdirs(tmp, err, errlen);
  }
  if ((rc = agree(comm, rc, what, err, errlen))) return rc;
  if (sharded || rank == 0) {
    tensors_path(path, tmp, sharded, rank);
    rc = write_tensors(path, o, params, n, err, errlen);
  }
  if ((rc = agree(comm, rc, what, err, errlen))) return rc;
  if (rank == 0) {
    rc = write_json_state(tmp, d, o, n, step, world, sharded, base, err, errlen);
    if (!rc) {
      remove_ckpt_dir(final);
      if (ty_beneath_rename(tmp, final, err, errlen) != 0) rc = TY_EPERM;
    }
    if (rc) {
      remove_ckpt_dir(tmp);
    } else {
      /* Only the newest complete checkpoint is needed to resume; a save
       * that a killed run left unfinished (step-N.tmp) is never needed. */
      DIR *dh = ty_beneath_opendir(root, NULL, 0);
      struct dirent *e;
      while (dh && (e = readdir(dh))) {
        int64_t s = parse_step_name(e->d_name, false);
        if ((s >= 0 && s != step) || parse_step_name(e->d_name, true) >= 0) {
          char old[PATH_MAX];
          pathf(old, "%s/%s", root, e->d_name);
          remove_ckpt_dir(old);
        }
      }
      if (dh) closedir(dh);
    }
  }
  return agree(comm, rc, what, err, errlen);
}

static int64_t json_int(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static int load_tensor(const st_ckpt_t *c, const char *name, float *dst, size_t n, const char *dir,
                       char *err, size_t errlen) {
  const st_tensor_t *t = st_find(c, name);
  if (!t || t->dtype != TY_DTYPE_F32 || t->nelem != n) {
    snprintf(err, errlen, "checkpoint %s: tensor %s is missing or not F32 [%zu]", dir, name, n);
    return TY_EDATALOSS;
  }
  return st_read(c, t, 0, dst, n * sizeof(float), err, errlen);
}

/* Rank 0's check that the checkpoint's frozen base (j's "base", when it
 * names one) is this run's. */
static int same_base(const json_t *j, const char *dir, const train_base_t *base, char *err,
                     size_t errlen) {
  const json_t *jb = json_object_get(j, "base");
  const char *was = json_string_value(json_object_get(jb, "fingerprint"));
  if (!was || !base || !base->fingerprint || !base->fingerprint[0] ||
      !strcmp(was, base->fingerprint))
    return 0;
  const char *was_path = json_string_value(json_object_get(jb, "model_path"));
  snprintf(err, errlen,
           "checkpoint %s trained its adapters over another base checkpoint (%s, fingerprint "
           "%s); this run's model_path %s has fingerprint %s: resume over the same base, or use "
           "a new output_dir",
           dir, was_path ? was_path : "unknown", was, base->model_path, base->fingerprint);
  return TY_EPRECONDITION;
}

int train_state_resume(const char *output_dir, comm_t *comm, const data_t *d, optim_t *o,
                       float *params, size_t n, bool sharded, const train_base_t *base,
                       int64_t *step, char *err, size_t errlen) {
  *step = 0;
  char root[PATH_MAX], dir[PATH_MAX], path[PATH_MAX];
  pathf(root, "%s/checkpoints", output_dir);
  char why[1024];
  DIR *dh = ty_beneath_opendir(root, why, sizeof why);
  if (!dh && errno == ENOENT) return 0; /* nothing to resume from */
  if (!dh) {
    snprintf(err, errlen, "cannot read the checkpoints to resume from: %s", why);
    return TY_EPERM;
  }
  int64_t best = -1;
  struct dirent *e;
  while ((e = readdir(dh))) {
    int64_t s = parse_step_name(e->d_name, false);
    if (s > best) best = s;
  }
  closedir(dh);
  if (best < 0) return 0;
  pathf(dir, "%s/step-%08lld", root, (long long)best);
  pathf(path, "%s/%s", dir, STATE_JSON);
  json_t *j = ty_json_load_file(path, 0, why, sizeof why);
  if (!j) {
    snprintf(err, errlen,
             "checkpoint %s: cannot read %s: %s (remove the directory to start "
             "over)",
             dir, STATE_JSON, why);
    return TY_EDATALOSS;
  }
  const json_t *jd = json_object_get(j, "data");
  data_position_t pos = {.step = json_int(j, "step"),
                         .seed = (uint64_t)json_int(jd, "seed"),
                         .num_tokens = json_int(jd, "num_tokens"),
                         .num_train_windows = json_int(jd, "num_train_windows"),
                         .global_batch = json_int(jd, "global_batch"),
                         .seq_len = (int)json_int(jd, "seq_len")};
  int64_t t = json_int(j, "optimizer_step"), jn = json_int(j, "n");
  int64_t world = json_int(j, "world_size");
  bool was_sharded = json_is_true(json_object_get(j, "sharded"));
  int rc = comm_rank(comm) == 0 ? same_base(j, dir, base, err, errlen) : 0;
  json_decref(j);
  if ((rc = agree(comm, rc, "resume (rank 0: the checkpoint was made over another base)", err,
                  errlen)))
    return rc;
  if (sharded != was_sharded || (sharded && world != comm_world_size(comm))) {
    snprintf(err, errlen,
             "checkpoint %s holds %s state of %lld ranks; this run has %d ranks "
             "%s: resume with the same world_size or use a new output_dir",
             dir, was_sharded ? "sharded" : "replicated", (long long)world, comm_world_size(comm),
             sharded ? "with sharded state" : "with replicated state");
    return TY_EPRECONDITION;
  }
  if (pos.step != best || t < 0 || jn != (int64_t)n) {
    snprintf(err, errlen,
             "checkpoint %s was written for %lld trained values at step %lld; this "
             "run trains %zu (a different model, use_lora or lora settings): use a new "
             "output_dir",
             dir, (long long)jn, (long long)pos.step, n);
    return TY_EPRECONDITION;
  }
  rc = data_position_check(d, &pos, err, errlen);
  if (rc) return rc;
  tensors_path(path, dir, sharded, comm_rank(comm));
  st_ckpt_t *c;
  rc = st_open(path, &c, err, errlen);
  if (rc) return rc;
  rc = load_tensor(c, "params", params, n, dir, err, errlen);
  if (!rc) rc = load_tensor(c, "exp_avg", o->m, n, dir, err, errlen);
  if (!rc) rc = load_tensor(c, "exp_avg_sq", o->v, n, dir, err, errlen);
  st_close(c);
  if (rc) return rc;
  o->t = t;
  *step = best;
  return 0;
}
