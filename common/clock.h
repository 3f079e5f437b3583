/* clock.h - the monotonic clock, for timeouts, deadlines and rates. */
#ifndef TY_COMMON_CLOCK_H
#define TY_COMMON_CLOCK_H

/* CLOCK_MONOTONIC in seconds, and in whole milliseconds. */
double ty_mono_s(void);
long long ty_mono_ms(void);

#endif
