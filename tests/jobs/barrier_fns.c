/* barrier_fns.c: barrier functions for test_barrier, in a shared library so that cluster
 * mode can ship them. Each emits one record per task: rank, world, attempt, gpu (int64s). */
#include <flint/flint.h>
#include <stdio.h>
#include <unistd.h>

typedef struct bf_arg {
  uint32_t mode;      /* see below */
  uint32_t sleep_ms;  /* mode 3: rank 0 sleeps this long before the gather */
  uint32_t rounds;    /* mode 0: all_gather rounds */
  char pid_file[200]; /* mode 3: rank 0 writes its process id there on attempt 0 */
  uint32_t gather_ms; /* the timeout of each all_gather; 0: 20 s */
} bf_arg;

enum { BF_GATHER = 0, BF_FAIL_ONCE = 1, BF_REPORT = 2, BF_SLEEP_GATHER = 3, BF_BIG = 4 };

static fl_status emit_info(fl_barrier *b, fl_emitter *out) {
  int64_t v[4] = {fl_barrier_rank(b), fl_barrier_world(b), fl_barrier_attempt(b), fl_barrier_gpu(b)};
  return fl_emit(out, v, sizeof v);
}

/* Checks that round r of all_gather gives every rank's "rank*1000+r" in rank order. */
static fl_status gather_check(fl_barrier *b, const bf_arg *a, uint32_t r) {
  int64_t mine = (int64_t)fl_barrier_rank(b) * 1000 + r;
  fl_records *all = NULL;
  fl_status s = fl_barrier_all_gather(b, fl_bytes_of(&mine, 8), a->gather_ms ? a->gather_ms : 20000, &all);
  if (s != FL_OK) return s;
  if (fl_records_count(all) != fl_barrier_world(b)) s = fl_set_error(FL_EUSER, "gather: wrong count");
  for (uint32_t i = 0; s == FL_OK && i < fl_barrier_world(b); i++)
    if (fl_i64(fl_records_get(all, i)) != (int64_t)i * 1000 + r)
      s = fl_set_error(FL_EUSER, "gather: rank %u got %lld at %u", fl_barrier_rank(b),
                       (long long)fl_i64(fl_records_get(all, i)), i);
  fl_records_free(all);
  return s;
}

fl_status bf_task(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *argp) {
  (void)in;
  const bf_arg *a = argp;
  fl_status s = FL_OK;
  switch (a->mode) {
  case BF_GATHER:
    for (uint32_t r = 0; s == FL_OK && r < a->rounds; r++) s = gather_check(b, a, r);
    break;
  case BF_FAIL_ONCE: {
    fl_buf got = FL_BUF_INIT;
    if (fl_barrier_attempt(b) == 0) {
      if (fl_barrier_rank(b) == 0) {
        int64_t state = 4242;
        if ((s = fl_barrier_checkpoint_put(b, fl_bytes_of(&state, 8))) != FL_OK) return s;
      }
      if ((s = gather_check(b, a, 0)) != FL_OK) return s; /* the put happened before the failure */
      if (fl_barrier_rank(b) == fl_barrier_world(b) - 1) return fl_set_error(FL_EUSER, "rank fails on attempt 0");
      /* The others wait in the next gather until the stage is abandoned. */
      s = gather_check(b, a, 1);
      return s == FL_OK ? fl_set_error(FL_EUSER, "gather succeeded on a failed attempt") : s;
    }
    if ((s = fl_barrier_checkpoint_get(b, &got)) != FL_OK) return s;
    int64_t state = fl_i64(fl_buf_bytes(&got));
    fl_buf_free(&got);
    if (state != 4242) return fl_set_error(FL_EUSER, "checkpoint gave %lld", (long long)state);
    s = gather_check(b, a, 0);
    break;
  }
  case BF_REPORT:
    if (fl_barrier_rank(b) == 0)
      for (int64_t i = 0; s == FL_OK && i < 5; i++) s = fl_barrier_report(b, fl_bytes_of(&i, 8));
    if (s == FL_OK) s = gather_check(b, a, 0);
    break;
  case BF_SLEEP_GATHER:
    if (fl_barrier_attempt(b) == 0 && fl_barrier_rank(b) == 0) {
      if (a->pid_file[0]) {
        char tmp[220];
        snprintf(tmp, sizeof tmp, "%s.tmp", a->pid_file);
        FILE *f = fopen(tmp, "w");
        if (f) {
          fprintf(f, "%d\n", (int)getpid());
          fclose(f);
          rename(tmp, a->pid_file);
        }
      }
      usleep(a->sleep_ms * 1000u);
    }
    s = gather_check(b, a, 0);
    break;
  case BF_BIG: {
    static uint8_t big[(1u << 20) + 1];
    fl_records *all = NULL;
    s = fl_barrier_all_gather(b, fl_bytes_of(big, sizeof big), 1000, &all);
    fl_records_free(all);
    if (s == FL_ELIMIT) return emit_info(b, out);
    return fl_set_error(FL_EUSER, "an oversized gather gave %s", fl_status_name(s));
  }
  }
  if (s != FL_OK) return s;
  return emit_info(b, out);
}
