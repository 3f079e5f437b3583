/* rest_deadline.c - request deadlines against slow clients; see
 * rest_deadline.h. */
#include "server/rest_deadline.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "common/xalloc.h"

#define CHECK_S 0.25

struct rdl_conn {
  int fd;
  double deadline; /* ty_mono_s(); 0 while the answer is being sent */
  bool cut;        /* shut down once already */
  rdl_conn_t *prev, *next;
};

struct rdl {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  rdl_conn_t *head;
  double limit;
  bool quit;
  int64_t cut;
  pthread_t thread;
};

static void *rdl_main(void *arg) {
  rdl_t *d = arg;
  pthread_mutex_lock(&d->lock);
  while (!d->quit) {
    double now = ty_mono_s();
    for (rdl_conn_t *c = d->head; c; c = c->next)
      if (c->deadline > 0 && now > c->deadline && !c->cut) {
        c->cut = true;
        d->cut++;
        shutdown(c->fd, SHUT_RDWR); /* libmicrohttpd sees the end and closes it */
      }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += (long)(CHECK_S * 1e9);
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&d->cond, &d->lock, &until);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

rdl_t *rdl_start(double limit_s) {
  rdl_t *d = xcalloc(1, sizeof *d);
  d->limit = limit_s;
  pthread_mutex_init(&d->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&d->cond, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&d->thread, NULL, rdl_main, d)) {
    pthread_cond_destroy(&d->cond);
    pthread_mutex_destroy(&d->lock);
    free(d);
    return NULL;
  }
  return d;
}

void rdl_stop(rdl_t *d) {
  if (!d) return;
  pthread_mutex_lock(&d->lock);
  d->quit = true;
  pthread_cond_signal(&d->cond);
  pthread_mutex_unlock(&d->lock);
  pthread_join(d->thread, NULL);
  while (d->head) {
    rdl_conn_t *c = d->head;
    d->head = c->next;
    free(c);
  }
  pthread_cond_destroy(&d->cond);
  pthread_mutex_destroy(&d->lock);
  free(d);
}

rdl_conn_t *rdl_opened(rdl_t *d, int fd) {
  rdl_conn_t *c = xcalloc(1, sizeof *c);
  c->fd = fd;
  pthread_mutex_lock(&d->lock);
  c->deadline = ty_mono_s() + d->limit;
  c->next = d->head;
  if (d->head) d->head->prev = c;
  d->head = c;
  pthread_mutex_unlock(&d->lock);
  return c;
}

void rdl_answering(rdl_t *d, rdl_conn_t *c) {
  if (!c) return;
  pthread_mutex_lock(&d->lock);
  c->deadline = 0;
  pthread_mutex_unlock(&d->lock);
}

void rdl_answered(rdl_t *d, rdl_conn_t *c) {
  if (!c) return;
  pthread_mutex_lock(&d->lock);
  c->deadline = ty_mono_s() + d->limit;
  pthread_mutex_unlock(&d->lock);
}

void rdl_closed(rdl_t *d, rdl_conn_t *c) {
  if (!c) return;
  pthread_mutex_lock(&d->lock);
  if (c->prev) c->prev->next = c->next;
  if (c->next) c->next->prev = c->prev;
  if (d->head == c) d->head = c->next;
  pthread_mutex_unlock(&d->lock);
  free(c);
}

int64_t rdl_cut(rdl_t *d) {
  pthread_mutex_lock(&d->lock);
  int64_t n = d->cut;
  pthread_mutex_unlock(&d->lock);
  return n;
}
