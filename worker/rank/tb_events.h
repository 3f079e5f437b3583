/* tb_events.h - TensorBoard event files (events.out.tfevents.*): scalar
 * summaries per step, as TensorBoard and any TFRecord reader read them.
 *
 * A file is a sequence of TFRecords, each
 *   uint64 length (little-endian) | uint32 masked CRC-32C of the length |
 *   length bytes of data | uint32 masked CRC-32C of the data,
 * whose data is one tensorboard.Event (api/tensorboard.proto, encoded with
 * protobuf-c). The first record is the file_version event "brain.Event:2";
 * each later one holds one step's scalars. Every record is written with one
 * write(2) as it comes, so the file holds whole records only, whenever the
 * process stops (a cancel's SIGTERM included), and a reader (TensorBoard
 * polls) sees each step at once. */
#ifndef TY_WORKER_TB_EVENTS_H
#define TY_WORKER_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tb_events tb_events_t;

/* One scalar: tag (borrowed) and its value; a value that is not finite
 * is left out of the event. */
typedef struct {
  const char *tag;
  double value;
} tb_scalar_t;

/* Creates dir (and its parents) and a new event file in it, named
 * events.out.tfevents.<unix seconds>.<host>.<pid>.<n> with n the first
 * number no file there has yet, and writes the file_version event. *out is
 * the caller's (tb_events_close). 0, or a TY_E* code with the reason, naming
 * the file, in err. */
int tb_events_open(tb_events_t **out, const char *dir, double wall_time, char *err, size_t errlen);

/* Appends one Event{wall_time, step, summary{value{tag, simple_value}}} of
 * the n scalars v (those with finite values; none: nothing is written). 0,
 * or TY_EUNAVAILABLE with the reason in err. */
int tb_events_write(tb_events_t *w, int64_t step, double wall_time, const tb_scalar_t *v, int n,
                    char *err, size_t errlen);

/* The file's path (owned by w). */
const char *tb_events_path(const tb_events_t *w);

/* Syncs and closes the file and frees w. NULL is a no-op. */
void tb_events_close(tb_events_t *w);

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes, and
 * TFRecord's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t tb_crc32c(const void *p, size_t n);
uint32_t tb_masked_crc32c(const void *p, size_t n);

/* Frames data (n bytes) as one TFRecord into out, which holds n + 16
 * bytes; returns n + 16. */
size_t tb_record_frame(const void *data, size_t n, uint8_t *out);

#endif
