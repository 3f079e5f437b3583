/* partial.h - files being written as "<path>.partial" and renamed onto
 * path once whole (worker/ckpt/safetensors_write.c, ty_json_dump_file). A
 * process stopped by SIGTERM, SIGINT or SIGHUP in the middle of one (a
 * cancelled job saving its checkpoint) removes the part it was writing,
 * then dies of the signal as it would have, so that no half-written file
 * is left beside the outputs. SIGKILL leaves it: the next save of the same
 * file truncates it. */
#ifndef TRAINYARD_COMMON_PARTIAL_H
#define TRAINYARD_COMMON_PARTIAL_H

/* Tracks the part at path until ty_partial_untrack(slot); returns the
 * slot, or -1 when every slot is taken or path is too long (the file is
 * then written as before, untracked). Any thread. */
int ty_partial_track(const char *path);
void ty_partial_untrack(int slot);

/* Installs the handlers that remove the tracked parts, for each of those
 * signals that is not ignored. Once, early in a program. */
void ty_partial_cleanup_on_signals(void);

/* Removes every tracked part now: for a signal handler of another's that
 * ends the process itself (worker/rank/preempt.c). Async-signal-safe. */
void ty_partial_remove_all(void);

#endif
