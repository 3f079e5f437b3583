/* scheduler.h - the FIFO queue over this host's rank slots and the life of
 * every attempt: start its ranks (through a dispatcher,
 * server/dispatcher.h), watch them (exit
 * status, heartbeats, a step that stops advancing), stop them (SIGTERM,
 * then SIGKILL after the grace period) and report the outcome through the
 * service's state changes. One thread; every other entry point only queues
 * work for it and wakes it. */
#ifndef TY_SERVER_SCHEDULER_H
#define TY_SERVER_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "api/report_wire.h"
#include "db/db.h"
#include "server/config.h"

typedef struct svc svc_t;
typedef struct sched sched_t;
typedef struct dispatcher dispatcher_t;

/* report_url_base: "http://127.0.0.1:8080" (the ranks append
 * /v1/internal/jobs/<id>/report). cfg, svc and disp (the engine that runs
 * the ranks) are borrowed. */
int sched_create(svc_t *svc, const srv_config_t *cfg, dispatcher_t *disp,
                 const char *report_url_base, sched_t **out, char *msg, size_t msgsz);
int sched_start(sched_t *s);
/* Stops every running attempt (their jobs are requeued or failed, with the
 * reason), waits for the ranks and joins the thread. */
void sched_shutdown(sched_t *s);
void sched_free(sched_t *s);

/* A job was queued: look at the queue now. */
void sched_wake(sched_t *s);
/* A job's state became cancelled: stop its ranks, if any. */
void sched_cancel(sched_t *s, const char *id);
/* A rank reported: a heartbeat, and progress when report_wire_progressed
 * says so (the phase, step or bytes loaded changed). why (size bytes; may
 * be NULL) receives what the attempt's ranks do now ("all 2 ranks
 * training", "rank 0 training, rank 1 tokenizing") when that differs from
 * the reason last written (sched_reason_written), else "". */
void sched_note_report(sched_t *s, const char *id, const report_wire_t *r, char *why,
                       size_t size);
/* The job's reason is now why (from sched_note_report), written. */
void sched_reason_written(sched_t *s, const char *id, int attempt, const char *why);

/* Slots: whether a job of world_size ranks on device ("cpu"/"cuda") could
 * ever run here; 0, or TY_EINVAL with msg saying why. */
int sched_fits(const srv_config_t *cfg, const char *device, int world_size, char *msg,
               size_t msgsz);
int64_t sched_ranks_running(sched_t *s);
/* Whether the scheduler still holds an attempt of job id: ranks to stop,
 * reap or record, or an output folder lock to release. */
bool sched_has_run(sched_t *s, const char *id);

/* Before sched_start: watches again attempt `attempt` of job id, whose
 * ranks an earlier trainyardd started through this dispatcher and which
 * still run there (recovery_run's list): their reports, their end and a
 * cancel are handled as if this process had started them. 0, or a TY_E*
 * code when the job cannot be read or the dispatcher cannot take it over
 * (the caller then fails the attempt). */
int sched_adopt(sched_t *s, const char *id, int attempt, int pid, int64_t start_ticks);

#endif
