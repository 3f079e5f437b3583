/* tb_events.c - TensorBoard event files; see tb_events.h. */
#include "worker/rank/tb_events.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/xalloc.h"
#include "tensorboard.pb-c.h"

struct tb_events {
  int fd;
  char path[PATH_MAX];
};

static uint32_t g_crc_table[256]; /* byte -> CRC-32C of it, filled once */
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_table_fill(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    g_crc_table[i] = c;
  }
}

uint32_t tb_crc32c(const void *p, size_t n) {
  pthread_once(&g_crc_once, crc_table_fill);
  const uint32_t *table = g_crc_table;
  const uint8_t *b = p;
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ b[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t tb_masked_crc32c(const void *p, size_t n) {
  uint32_t crc = tb_crc32c(p, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le32(uint8_t *o, uint32_t v) {
  for (int i = 0; i < 4; i++) o[i] = (uint8_t)(v >> (8 * i));
}

size_t tb_record_frame(const void *data, size_t n, uint8_t *out) {
  uint64_t len = n;
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(len >> (8 * i));
  put_le32(out + 8, tb_masked_crc32c(out, 8));
  memcpy(out + 12, data, n);
  put_le32(out + 12 + n, tb_masked_crc32c(data, n));
  return n + 16;
}

/* Encodes ev and appends it as one record with one write. */
static int write_event(tb_events_t *w, const Tensorboard__Event *ev, char *err, size_t errlen) {
  size_t n = tensorboard__event__get_packed_size(ev);
  uint8_t *buf = xmalloc(n + 16);
  uint8_t *data = xmalloc(n ? n : 1);
  tensorboard__event__pack(ev, data);
  size_t len = tb_record_frame(data, n, buf);
  free(data);
  size_t done = 0;
  while (done < len) {
    ssize_t k = write(w->fd, buf + done, len - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      free(buf);
      return ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot write TensorBoard events to %s: %s",
                     w->path, strerror(e));
    }
    done += (size_t)k;
  }
  free(buf);
  return 0;
}

int tb_events_open(tb_events_t **out, const char *dir, double wall_time, char *err, size_t errlen) {
  *out = NULL;
  int rc = ty_mkdirs(dir, err, errlen);
  if (rc) return rc;
  char host[128] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  for (char *h = host; *h; h++)
    if (*h == '/') *h = '_';
  tb_events_t *w = xcalloc(1, sizeof *w);
  w->fd = -1;
  for (int i = 0; i < 1000 && w->fd < 0; i++) {
    int len = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d.%d", dir,
                       (long long)wall_time, host, (int)getpid(), i);
    if (len < 0 || (size_t)len >= sizeof w->path) {
      free(w);
      return ty_errf(err, errlen, TY_EINVAL, "the TensorBoard folder's path is too long: %s", dir);
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0 && errno != EEXIST) break;
  }
  if (w->fd < 0) {
    rc = ty_errf(err, errlen, TY_EUNAVAILABLE, "cannot create the TensorBoard event file %s: %s",
                 w->path, strerror(errno));
    free(w);
    return rc;
  }
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = wall_time;
  ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  ev.file_version = "brain.Event:2";
  if ((rc = write_event(w, &ev, err, errlen))) {
    tb_events_close(w);
    return rc;
  }
  *out = w;
  return 0;
}

int tb_events_write(tb_events_t *w, int64_t step, double wall_time, const tb_scalar_t *v, int n,
                    char *err, size_t errlen) {
  Tensorboard__Summary__Value *vals = xcalloc((size_t)(n > 0 ? n : 1), sizeof *vals);
  Tensorboard__Summary__Value **ptrs = xcalloc((size_t)(n > 0 ? n : 1), sizeof *ptrs);
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (!isfinite(v[i].value)) continue;
    tensorboard__summary__value__init(&vals[k]);
    vals[k].tag = (char *)v[i].tag; /* protobuf-c's field is not const; only read */
    vals[k].simple_value = (float)v[i].value;
    ptrs[k] = &vals[k];
    k++;
  }
  int rc = 0;
  if (k > 0) {
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = (size_t)k;
    sum.value = ptrs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    rc = write_event(w, &ev, err, errlen);
  }
  free(vals);
  free(ptrs);
  return rc;
}

const char *tb_events_path(const tb_events_t *w) {
  return w->path;
}

void tb_events_close(tb_events_t *w) {
  if (!w) return;
  if (w->fd >= 0) {
    (void)fsync(w->fd); /* what is written is whole already; this only makes it durable */
    close(w->fd);
  }
  free(w);
}
