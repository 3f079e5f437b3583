/* safetensors.c - the safetensors header parser (the trust boundary of a
 * checkpoint file), single-file and sharded checkpoints read by byte range,
 * and the streaming writer. */
#include "worker/ckpt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
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
#include "worker/ckpt/pytorch.h"

/* Largest element count accepted for one tensor: keeps nelem x 4 far from
 * overflowing uint64 (2^50 elements is 4 PiB of F32). */
#define ST_MAX_NELEM (1ull << 50)

static int cmp_by_name(const void *a, const void *b) {
  return strcmp(((const st_tensor_t *)a)->name, ((const st_tensor_t *)b)->name);
}

static int cmp_by_offset(const void *a, const void *b) {
  const st_tensor_t *x = *(const st_tensor_t *const *)a, *y = *(const st_tensor_t *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return 0;
}

void st_header_free(st_header_t *h) {
  if (!h) return;
  for (size_t i = 0; i < h->ntensors; i++) free(h->tensors[i].name);
  free(h->tensors);
  h->tensors = NULL;
  h->ntensors = 0;
}

/* A JSON integer in [0, max], or false. */
static bool get_uint(const json_t *v, uint64_t max, uint64_t *out) {
  if (!json_is_integer(v)) return false;
  json_int_t i = json_integer_value(v);
  if (i < 0 || (uint64_t)i > max) return false;
  *out = (uint64_t)i;
  return true;
}

/* Validates one tensor entry; fills t (name not set). */
static int parse_entry(const char *name, const json_t *v, uint64_t data_len, st_tensor_t *t,
                       char *err, size_t errlen) {
  if (!json_is_object(v))
    return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': entry is not an object", name);
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)v, key, val) {
    if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s': unknown key '%s' (expected dtype, shape, data_offsets)", name,
                     key);
  }
  const json_t *dt = json_object_get(v, "dtype");
  if (!json_is_string(dt))
    return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': 'dtype' missing or not a string", name);
  const char *ds = json_string_value(dt);
  bool found = false;
  for (int k = 0; k < TY_DTYPE_COUNT; k++) {
    if (!strcmp(ds, ty_dtype_st_name((ty_dtype_t)k))) {
      t->dtype = (ty_dtype_t)k;
      found = true;
    }
  }
  if (!strcmp(ds, ty_dtype_st_name(TY_DTYPE_U8))) {
    t->dtype = TY_DTYPE_U8; /* bytes: st_open refuses them unless asked (ST_OPEN_U8) */
    found = true;
  }
  if (!found)
    return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                   "tensor '%s': unsupported dtype '%.32s' (trainyard reads F32, F16 and BF16, "
                   "and U8 in bitsandbytes' 4-bit layout; convert the checkpoint to one of them)",
                   name, ds);
  const json_t *shape = json_object_get(v, "shape");
  if (!json_is_array(shape))
    return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': 'shape' missing or not an array", name);
  size_t nd = json_array_size(shape);
  if (nd > ST_MAX_DIMS)
    return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': %zu dimensions (at most %d)", name, nd,
                   ST_MAX_DIMS);
  t->ndim = (int)nd;
  t->nelem = 1;
  for (size_t d = 0; d < nd; d++) {
    uint64_t dim;
    if (!get_uint(json_array_get(shape, d), ST_MAX_NELEM, &dim))
      return ty_errf(err, errlen, TY_EINVAL,
                     "tensor '%s': shape[%zu] is not an integer in [0, 2^50]", name, d);
    t->shape[d] = (int64_t)dim;
    if (dim && t->nelem > ST_MAX_NELEM / dim)
      return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': shape has more than 2^50 elements",
                     name);
    t->nelem *= dim;
  }
  t->nbytes = t->nelem * ty_dtype_size(t->dtype);
  const json_t *offs = json_object_get(v, "data_offsets");
  uint64_t b, e;
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !get_uint(json_array_get(offs, 0), UINT64_MAX >> 1, &b) ||
      !get_uint(json_array_get(offs, 1), UINT64_MAX >> 1, &e))
    return ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s': 'data_offsets' must be [begin, end], two non-negative integers",
                   name);
  if (e < b)
    return ty_errf(err, errlen, TY_EINVAL, "tensor '%s': data_offsets end %llu < begin %llu", name,
                   (unsigned long long)e, (unsigned long long)b);
  if (e > data_len)
    return ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s': data_offsets end %llu lies past the data section (%llu bytes): "
                   "the file is truncated or the header lies",
                   name, (unsigned long long)e, (unsigned long long)data_len);
  if (e - b != t->nbytes)
    return ty_errf(err, errlen, TY_EINVAL,
                   "tensor '%s': shape x %s size is %llu bytes but data_offsets span %llu", name,
                   ds, (unsigned long long)t->nbytes, (unsigned long long)(e - b));
  t->begin = b;
  return 0;
}

static int check_metadata(const json_t *v, char *err, size_t errlen) {
  if (!json_is_object(v)) return ty_errf(err, errlen, TY_EINVAL, "'__metadata__' is not an object");
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)v, key, val) {
    if (!json_is_string(val))
      return ty_errf(err, errlen, TY_EINVAL, "'__metadata__.%s' is not a string", key);
  }
  return 0;
}

/* The tensors must tile the data section exactly: sorted by offset, each
 * starts where the previous ended, the last ends at data_len. */
static int check_tiling(const st_header_t *h, uint64_t data_len, char *err, size_t errlen) {
  const st_tensor_t **by = xmalloc((h->ntensors ? h->ntensors : 1) * sizeof *by);
  for (size_t i = 0; i < h->ntensors; i++) by[i] = &h->tensors[i];
  qsort(by, h->ntensors, sizeof *by, cmp_by_offset);
  uint64_t pos = 0;
  const char *prev = NULL;
  int rc = 0;
  for (size_t i = 0; i < h->ntensors && !rc; i++) {
    if (by[i]->begin < pos)
      rc = ty_errf(err, errlen, TY_EINVAL, "tensors '%s' and '%s' overlap in the data section",
                   prev, by[i]->name);
    else if (by[i]->begin > pos)
      rc = ty_errf(err, errlen, TY_EINVAL,
                   "hole of %llu bytes in the data section before tensor '%s'",
                   (unsigned long long)(by[i]->begin - pos), by[i]->name);
    pos = by[i]->begin + by[i]->nbytes;
    prev = by[i]->name;
  }
  if (!rc && pos != data_len)
    rc = ty_errf(err, errlen, TY_EINVAL,
                 "data section has %llu bytes but its tensors cover %llu: trailing bytes belong "
                 "to no tensor",
                 (unsigned long long)data_len, (unsigned long long)pos);
  free(by);
  return rc;
}

int st_header_parse(const char *json, size_t len, uint64_t data_len, st_header_t *h, char *err,
                    size_t errlen) {
  h->tensors = NULL;
  h->ntensors = 0;
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return ty_errf(err, errlen, TY_EINVAL, "header is not valid JSON (line %d column %d: %s)",
                   jerr.line, jerr.column, jerr.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "header is not a JSON object");
    goto out;
  }
  h->tensors = xcalloc(json_object_size(root) + 1, sizeof *h->tensors);
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) {
      if ((rc = check_metadata(val, err, errlen))) goto out;
      continue;
    }
    if (!*key) {
      rc = ty_errf(err, errlen, TY_EINVAL, "a tensor has an empty name");
      goto out;
    }
    st_tensor_t *t = &h->tensors[h->ntensors];
    if ((rc = parse_entry(key, val, data_len, t, err, errlen))) goto out;
    t->name = xstrdup(key);
    h->ntensors++;
  }
  if ((rc = check_tiling(h, data_len, err, errlen))) goto out;
  qsort(h->tensors, h->ntensors, sizeof *h->tensors, cmp_by_name);
out:
  json_decref(root);
  if (rc) st_header_free(h);
  return rc;
}

/* pread until n bytes or end of file; returns the count read, or -1. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* Without ST_OPEN_U8, a U8 tensor is refused by name: every reader of
 * floats (the loader, merge, eval, convert) opens with st_open, and none of
 * them may take bytes for weights. */
static int check_bytes(const char *path, const st_header_t *h, unsigned flags, char *err,
                       size_t errlen) {
  for (size_t i = 0; !(flags & ST_OPEN_U8) && i < h->ntensors; i++)
    if (h->tensors[i].dtype == TY_DTYPE_U8)
      return ty_errf(err, errlen, TY_EUNIMPLEMENTED,
                     "%s: tensor '%s' is U8, bytes rather than weights (trainyard reads F32, "
                     "F16 and BF16 here; if it is a bitsandbytes 4-bit checkpoint, "
                     "`trainyard convert --dequantize` writes it as floats)",
                     path, h->tensors[i].name);
  return 0;
}

/* Opens one file and parses its header into h (file index fi): a
 * safetensors file, or a PyTorch one. */
static int open_one(const char *path, int fi, unsigned flags, st_file_t *f, st_header_t *h,
                    char *err, size_t errlen) {
  f->path = xstrdup(path);
  char why[1024];
  f->fd = ty_beneath_open(path, O_RDONLY, 0, why, sizeof why);
  if (f->fd < 0) {
    const int rc = f->fd;
    f->fd = -1;
    return ty_errf(err, errlen, rc, "cannot open: %s", why);
  }
  struct stat sb;
  if (fstat(f->fd, &sb) || !S_ISREG(sb.st_mode))
    return ty_errf(err, errlen, TY_EINVAL, "%s: not a regular file", path);
  f->size = (uint64_t)sb.st_size;
  unsigned char lenbuf[8] = {0};
  /* A PyTorch file (a zip archive, or a legacy one, which starts with the
   * pickled magic number and is refused saying how to re-save it) is read
   * by worker/ckpt/pytorch.c into the same header. No safetensors file starts
   * so: as a header length these bytes are far above ST_HEADER_MAX. A
   * .bin/.pt/.pth file that does not start as safetensors goes there too,
   * to be named for what it is (a legacy tar file, or neither format). */
  ssize_t head = pread_full(f->fd, lenbuf, 8, 0);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | lenbuf[i];
  bool st_like = head == 8 && n <= ST_HEADER_MAX && n <= f->size - 8;
  if (pt_is_zip(lenbuf, head > 0 ? (size_t)head : 0) ||
      (head == 8 && !memcmp(lenbuf, "\x80\x02\x8a\x0a", 4)) ||
      (!st_like &&
       (ends_with(path, ".bin") || ends_with(path, ".pt") || ends_with(path, ".pth")))) {
    f->data_start = 0; /* pt_open_file gives absolute offsets */
    int rc = pt_open_file(f->fd, path, f->size, fi, h, err, errlen);
    return rc ? rc : check_bytes(path, h, flags, err, errlen);
  }
  if (f->size < 8 || head != 8)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s: %llu bytes, too short to be safetensors (truncated?)", path,
                   (unsigned long long)f->size);
  if (n > ST_HEADER_MAX)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s: header length %llu exceeds the 100 MB limit (not safetensors?)", path,
                   (unsigned long long)n);
  if (n > f->size - 8)
    return ty_errf(err, errlen, TY_EINVAL,
                   "%s: header length %llu runs past the end of the file (%llu bytes): truncated",
                   path, (unsigned long long)n, (unsigned long long)f->size);
  char *hdr = malloc(n ? n : 1);
  if (!hdr) return ty_errf(err, errlen, TY_EEXHAUSTED, "%s: no memory for the header", path);
  int rc = 0;
  if (pread_full(f->fd, hdr, n, 8) != (ssize_t)n) {
    rc = ty_errf(err, errlen, TY_EDATALOSS, "%s: cannot read the header", path);
  } else {
    f->data_start = 8 + n;
    char msg[512];
    rc = st_header_parse(hdr, n, f->size - 8 - n, h, msg, sizeof msg);
    if (rc) ty_errf(err, errlen, rc, "%s: %s", path, msg);
    for (size_t i = 0; !rc && i < h->ntensors; i++) h->tensors[i].file = fi;
    if (!rc) rc = check_bytes(path, h, flags, err, errlen);
  }
  free(hdr);
  return rc;
}

void st_close(st_ckpt_t *c) {
  if (!c) return;
  for (size_t i = 0; i < c->nfiles; i++) {
    if (c->files[i].fd >= 0) close(c->files[i].fd);
    free(c->files[i].path);
  }
  free(c->files);
  for (size_t i = 0; i < c->ntensors; i++) free(c->tensors[i].name);
  free(c->tensors);
  free(c);
}

/* Moves h's tensors into c (h is left empty). */
static void take_tensors(st_ckpt_t *c, st_header_t *h) {
  c->tensors = xrealloc(c->tensors, (c->ntensors + h->ntensors + 1) * sizeof *c->tensors);
  memcpy(c->tensors + c->ntensors, h->tensors, h->ntensors * sizeof *h->tensors);
  c->ntensors += h->ntensors;
  free(h->tensors);
  h->tensors = NULL;
  h->ntensors = 0;
}

static st_file_t *add_file(st_ckpt_t *c) {
  c->files = xrealloc(c->files, (c->nfiles + 1) * sizeof *c->files);
  st_file_t *f = &c->files[c->nfiles++];
  memset(f, 0, sizeof *f);
  f->fd = -1;
  return f;
}

static char *join_path(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = xmalloc(n);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int open_index(st_ckpt_t *c, const char *index_path, unsigned flags, char *err,
                      size_t errlen) {
  char why[1024];
  json_t *root = ty_json_load_file(index_path, JSON_REJECT_DUPLICATES, why, sizeof why);
  if (!root) return ty_errf(err, errlen, errno == EINVAL ? TY_EINVAL : TY_EPERM, "%s", why);
  int rc = 0;
  char *dir = xstrdup(index_path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = 0;
  else
    strcpy(dir, ".");
  const json_t *wm = json_object_get(root, "weight_map");
  if (!json_is_object(root) || !json_is_object(wm)) {
    rc = ty_errf(err, errlen, TY_EINVAL, "%s: no 'weight_map' object", index_path);
    goto out;
  }
  const char *name;
  json_t *v;
  /* Each distinct file, in the order of first mention; files[i].path is the
   * bare name until it is opened. */
  json_object_foreach((json_t *)wm, name, v) {
    const char *fn = json_string_value(v);
    if (!fn || !*fn || strchr(fn, '/') || !strcmp(fn, "..") || !strcmp(fn, ".")) {
      rc = ty_errf(err, errlen, TY_EINVAL, "%s: weight_map['%s'] must name a file beside the index",
                   index_path, name);
      goto out;
    }
  }
  json_object_foreach((json_t *)wm, name, v) {
    const char *fn = json_string_value(v);
    char *full = join_path(dir, fn);
    bool seen = false;
    for (size_t i = 0; i < c->nfiles && !seen; i++) seen = !strcmp(c->files[i].path, full);
    if (seen) {
      free(full);
      continue;
    }
    st_header_t h = {0};
    int fi = (int)c->nfiles;
    rc = open_one(full, fi, flags, add_file(c), &h, err, errlen);
    free(full);
    if (rc) goto out;
    for (size_t i = 0; i < h.ntensors; i++) {
      const char *want = json_string_value(json_object_get(wm, h.tensors[i].name));
      if (!want || strcmp(want, fn)) {
        rc =
            ty_errf(err, errlen, TY_EINVAL, "%s: tensor '%s' is in %s but the index %s", index_path,
                    h.tensors[i].name, fn, want ? "names another file for it" : "does not list it");
        st_header_free(&h);
        goto out;
      }
    }
    take_tensors(c, &h);
  }
  if (c->ntensors != json_object_size(wm)) {
    /* Every tensor found is in the map with its file, so some map entry has
     * no tensor: name the first. */
    json_object_foreach((json_t *)wm, name, v) {
      bool have = false;
      for (size_t i = 0; i < c->ntensors && !have; i++) have = !strcmp(c->tensors[i].name, name);
      if (!have) {
        rc = ty_errf(err, errlen, TY_EINVAL, "%s: tensor '%s' is not in %s as the index says",
                     index_path, name, json_string_value(v));
        goto out;
      }
    }
  }
out:
  free(dir);
  json_decref(root);
  return rc;
}

int st_open(const char *path, st_ckpt_t **out, char *err, size_t errlen) {
  return st_open_flags(path, 0, out, err, errlen);
}

int st_open_flags(const char *path, unsigned flags, st_ckpt_t **out, char *err, size_t errlen) {
  *out = NULL;
  st_ckpt_t *c = xcalloc(1, sizeof *c);
  struct stat sb;
  int rc = 0;
  char why[1024];
  if ((rc = ty_beneath_stat(path, &sb, why, sizeof why))) {
    rc = ty_errf(err, errlen, rc == TY_ENOTFOUND ? rc : TY_EPERM, "%s", why);
  } else if (S_ISDIR(sb.st_mode)) {
    /* Hugging Face's order: safetensors first, then PyTorch's files. Inside
     * the roots, a name that leads out is an error, not a miss. */
    const char *names[] = {ST_INDEX_NAME, ST_SINGLE_NAME, PT_INDEX_NAME, PT_SINGLE_NAME};
    char *found = NULL;
    for (size_t i = 0; i < 4 && !found && !rc; i++) {
      found = join_path(path, names[i]);
      int e = ty_beneath_stat(found, &sb, why, sizeof why);
      if (e == TY_ENOTFOUND) {
        free(found), found = NULL;
      } else if (e) {
        rc = ty_errf(err, errlen, TY_EPERM, "%s", why);
      }
    }
    if (rc) {
      /* a name that leads outside the roots; said above */
    } else if (found && ends_with(found, ".json")) {
      rc = open_index(c, found, flags, err, errlen);
    } else if (found) {
      st_header_t h = {0};
      rc = open_one(found, 0, flags, add_file(c), &h, err, errlen);
      if (!rc) take_tensors(c, &h);
    } else {
      rc = ty_errf(err, errlen, TY_ENOTFOUND, "%s: holds none of %s, %s, %s, %s", path,
                   ST_INDEX_NAME, ST_SINGLE_NAME, PT_INDEX_NAME, PT_SINGLE_NAME);
    }
    free(found);
  } else if (ends_with(path, ".json")) {
    rc = open_index(c, path, flags, err, errlen);
  } else {
    st_header_t h = {0};
    rc = open_one(path, 0, flags, add_file(c), &h, err, errlen);
    if (!rc) take_tensors(c, &h);
  }
  if (rc) {
    st_close(c);
    return rc;
  }
  qsort(c->tensors, c->ntensors, sizeof *c->tensors, cmp_by_name);
  for (size_t i = 0; i < c->ntensors; i++) c->data_bytes += c->tensors[i].nbytes;
  *out = c;
  return 0;
}

const st_tensor_t *st_find(const st_ckpt_t *c, const char *name) {
  st_tensor_t key = {.name = (char *)name};
  return bsearch(&key, c->tensors, c->ntensors, sizeof key, cmp_by_name);
}

int st_read(const st_ckpt_t *c, const st_tensor_t *t, uint64_t off, void *dst, size_t n, char *err,
            size_t errlen) {
  const st_file_t *f = &c->files[t->file];
  if (off > t->nbytes || n > t->nbytes - off)
    return ty_errf(err, errlen, TY_ERANGE, "tensor '%s': bytes [%llu, +%zu) outside its %llu",
                   t->name, (unsigned long long)off, n, (unsigned long long)t->nbytes);
  uint64_t at = f->data_start + t->begin + off;
  ssize_t got = pread_full(f->fd, dst, n, at);
  if (got < 0)
    return ty_errf(err, errlen, TY_EDATALOSS, "%s: reading tensor '%s': %s", f->path, t->name,
                   strerror(errno));
  if ((size_t)got != n)
    return ty_errf(err, errlen, TY_EDATALOSS,
                   "%s: truncated: tensor '%s' needs bytes up to %llu but the file ends at %llu",
                   f->path, t->name, (unsigned long long)(at + n),
                   (unsigned long long)(at + (uint64_t)got));
  return 0;
}

void st_shard_name(char *buf, size_t n, size_t f, size_t nfiles) {
  if (nfiles <= 1)
    snprintf(buf, n, "%s", ST_SINGLE_NAME);
  else
    snprintf(buf, n, "model-%05zu-of-%05zu.safetensors", f + 1, nfiles);
}

size_t st_shard_plan(const uint64_t *bytes, size_t n, uint64_t shard_bytes, size_t *cut) {
  size_t nfiles = 0;
  uint64_t in_file = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == 0 || (shard_bytes && in_file && in_file + bytes[i] > shard_bytes))
      cut[nfiles++] = i, in_file = 0;
    in_file += bytes[i];
  }
  if (!nfiles) cut[nfiles++] = 0;
  cut[nfiles] = n;
  return nfiles;
}

json_t *st_shard_index(const char *const *names, const size_t *cut, size_t nfiles, uint64_t total) {
  json_t *wm = json_object();
  char name[64];
  for (size_t f = 0; f < nfiles; f++) {
    st_shard_name(name, sizeof name, f, nfiles);
    for (size_t i = cut[f]; i < cut[f + 1]; i++)
      json_object_set_new(wm, names[i], json_string(name));
  }
  return json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
}
