/* log.h - leveled logging to stderr, and fail-fast for the worker.
 *
 * Every binary logs through ty_log(). ty_die() is for the worker and the CLI
 * only (the server never exits after start-up): it prints file:line, the
 * message and a hint, then exits with status 1. */
#ifndef TY_COMMON_LOG_H
#define TY_COMMON_LOG_H

typedef enum { TY_LOG_DEBUG, TY_LOG_INFO, TY_LOG_WARN, TY_LOG_ERROR } ty_log_level_t;

/* Messages below this level are dropped. Default INFO; TRAINYARD_LOG=debug
 * (or info, warn, error) in the environment changes it at first use. */
void ty_log_set_level(ty_log_level_t level);
void ty_log_at(ty_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
_Noreturn void ty_die_at(const char *file, int line, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define ty_debug(...) ty_log_at(TY_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define ty_info(...) ty_log_at(TY_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define ty_warn(...) ty_log_at(TY_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define ty_error(...) ty_log_at(TY_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
/* ty_die(hint, fmt, ...): hint may be NULL. */
#define ty_die(hint, ...) ty_die_at(__FILE__, __LINE__, hint, __VA_ARGS__)

#endif
