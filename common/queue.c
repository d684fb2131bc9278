/* queue.c: spin-then-block hand-offs between threads (see common.h for why). */
#include <errno.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <string.h>

#include "common/common.h"
#include "common/config.h"

static atomic_uint_fast64_t spin_default = 200000;

void common_spin_default_for_server(void) {
  if (sysconf(_SC_NPROCESSORS_ONLN) <= 4) atomic_store(&spin_default, 0);
}

uint64_t fl_spin_ns(void) {
  static atomic_uint_fast64_t cached = UINT64_MAX;
  uint64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v != UINT64_MAX) return v;
  v = atomic_load(&spin_default);
  if (config_given(CONFIG_SPIN_US)) v = config_us(CONFIG_SPIN_US) * 1000;
  atomic_store(&cached, v);
  return v;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins until `ready()` or spin_ns pass. With more threads than cores a pure spin would
 * starve the thread we wait for, so every few rounds the core is offered to others. */
#define SPIN_UNTIL(ready_expr, spin_ns)                                                      \
  do {                                                                                       \
    uint64_t spin_deadline_ = 0;                                                             \
    for (unsigned spin_i_ = 0; !(ready_expr); spin_i_++) {                                   \
      if ((spin_i_ & 63) == 63) {                                                            \
        uint64_t now_ = common_now_ns();                                                     \
        if (!spin_deadline_) spin_deadline_ = now_ + (spin_ns);                              \
        else if (now_ >= spin_deadline_) break;                                              \
        sched_yield();                                                                       \
      } else {                                                                               \
        cpu_relax();                                                                         \
      }                                                                                      \
    }                                                                                        \
  } while (0)

void common_queue_init(common_queue *q) {
  memset(q, 0, sizeof *q);
  FL_PCHECK(pthread_mutex_init(&q->lock, NULL));
  /* The monotonic clock (as common_now_ns), for common_queue_pop_until's deadline. */
  pthread_condattr_t attr;
  FL_PCHECK(pthread_condattr_init(&attr));
  FL_PCHECK(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC));
  FL_PCHECK(pthread_cond_init(&q->cond, &attr));
  pthread_condattr_destroy(&attr);
}

void common_queue_destroy(common_queue *q) {
  pthread_mutex_destroy(&q->lock);
  pthread_cond_destroy(&q->cond);
}

void common_queue_push(common_queue *q, common_qnode *node) { common_queue_push_chain(q, node, node, 1); }

void common_queue_push_chain(common_queue *q, common_qnode *first, common_qnode *last, size_t count) {
  if (!count) return;
  last->next = NULL;
  FL_PCHECK(pthread_mutex_lock(&q->lock));
  if (q->tail)
    q->tail->next = first;
  else
    q->head = first;
  q->tail = last;
  atomic_fetch_add_explicit(&q->depth, count, memory_order_release);
  for (size_t i = 0; i < count && i < (size_t)q->sleepers; i++) pthread_cond_signal(&q->cond);
  FL_PCHECK(pthread_mutex_unlock(&q->lock));
}

/* The head, or NULL; releases the lock that the caller holds. */
static common_qnode *take_and_unlock(common_queue *q) {
  common_qnode *node = q->head;
  if (node) {
    q->head = node->next;
    if (!q->head) q->tail = NULL;
    atomic_fetch_sub_explicit(&q->depth, 1, memory_order_relaxed);
  }
  FL_PCHECK(pthread_mutex_unlock(&q->lock));
  return node;
}

/* Whether the caller may spin: true for the one that claimed the queue's spinner. */
static bool spin_claim(common_queue *q, uint64_t spin_ns) {
  bool idle = false;
  return spin_ns && atomic_compare_exchange_strong_explicit(&q->spinning, &idle, true, memory_order_acquire,
                                                            memory_order_relaxed);
}

static void spin_release(common_queue *q) { atomic_store_explicit(&q->spinning, false, memory_order_release); }

common_qnode *common_queue_pop(common_queue *q, uint64_t spin_ns) {
  if (spin_claim(q, spin_ns)) {
    SPIN_UNTIL(atomic_load_explicit(&q->depth, memory_order_acquire) > 0, spin_ns);
    spin_release(q);
  }
  FL_PCHECK(pthread_mutex_lock(&q->lock));
  while (!q->head && !q->closed) {
    q->sleepers++;
    pthread_cond_wait(&q->cond, &q->lock);
    q->sleepers--;
  }
  return take_and_unlock(q);
}

common_qnode *common_queue_pop_until(common_queue *q, uint64_t spin_ns, uint64_t deadline_ns) {
  uint64_t now = common_now_ns();
  if (deadline_ns <= now) spin_ns = 0;
  else if (deadline_ns - now < spin_ns) spin_ns = deadline_ns - now;
  if (spin_claim(q, spin_ns)) {
    SPIN_UNTIL(atomic_load_explicit(&q->depth, memory_order_acquire) > 0, spin_ns);
    spin_release(q);
  }
  struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
  FL_PCHECK(pthread_mutex_lock(&q->lock));
  while (!q->head && !q->closed) {
    q->sleepers++;
    int rc = pthread_cond_timedwait(&q->cond, &q->lock, &ts);
    q->sleepers--;
    if (rc == ETIMEDOUT) break;
  }
  return take_and_unlock(q);
}

void common_queue_close(common_queue *q) {
  FL_PCHECK(pthread_mutex_lock(&q->lock));
  q->closed = true;
  pthread_cond_broadcast(&q->cond);
  FL_PCHECK(pthread_mutex_unlock(&q->lock));
}

void common_event_init(common_event *e) {
  FL_PCHECK(pthread_mutex_init(&e->lock, NULL));
  pthread_condattr_t attr; /* monotonic, for common_event_wait_until's deadline */
  FL_PCHECK(pthread_condattr_init(&attr));
  FL_PCHECK(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC));
  FL_PCHECK(pthread_cond_init(&e->cond, &attr));
  pthread_condattr_destroy(&attr);
  atomic_init(&e->set, false);
}

void common_event_destroy(common_event *e) {
  pthread_mutex_destroy(&e->lock);
  pthread_cond_destroy(&e->cond);
}

void common_event_set(common_event *e) {
  FL_PCHECK(pthread_mutex_lock(&e->lock));
  atomic_store_explicit(&e->set, true, memory_order_release);
  pthread_cond_broadcast(&e->cond);
  FL_PCHECK(pthread_mutex_unlock(&e->lock));
}

void common_event_wait(common_event *e, uint64_t spin_ns) {
  SPIN_UNTIL(atomic_load_explicit(&e->set, memory_order_acquire), spin_ns);
  FL_PCHECK(pthread_mutex_lock(&e->lock));
  while (!atomic_load_explicit(&e->set, memory_order_acquire))
    pthread_cond_wait(&e->cond, &e->lock);
  FL_PCHECK(pthread_mutex_unlock(&e->lock));
}

bool common_event_wait_until(common_event *e, uint64_t deadline_ns) {
  struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
  FL_PCHECK(pthread_mutex_lock(&e->lock));
  while (!atomic_load_explicit(&e->set, memory_order_acquire))
    if (pthread_cond_timedwait(&e->cond, &e->lock, &ts) == ETIMEDOUT) break;
  bool set = atomic_load_explicit(&e->set, memory_order_acquire);
  FL_PCHECK(pthread_mutex_unlock(&e->lock));
  return set;
}
