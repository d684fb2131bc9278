/*
 * test_ps_service: the parameter server over the network (ps/server.c, ps/client.c).
 *
 * Servers run in this process on loopback ports, except where a primary must die as a
 * process does (kill -9): that server runs in a forked child. Arithmetic through the
 * service is checked bit for bit against one local shard holding the whole table (whose
 * own arithmetic test_ps checks against a written reference), over 1 to 8 shards and 1 to 8
 * workers, every update function, dense and sparse; consistency by worker threads that
 * record the freshness of every pull; replication by killing a primary mid-run.
 */
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ps/wire.h"

#define MAX_SERVERS 8

typedef struct cluster {
  ps_server *servers[MAX_SERVERS];
  uint32_t n;
  ps_place places[MAX_SERVERS];
  ps_map map;
} cluster;

/* n servers; shard s's primary on server s % n, its backup (replicated) on the next one. */
static void cluster_start(cluster *c, uint32_t n, uint32_t table, const ps_table_spec *spec, uint32_t shards,
                          uint32_t workers, bool replicated, const ps_server_options *opts) {
  memset(c, 0, sizeof *c);
  c->n = n;
  for (uint32_t i = 0; i < n; i++) assert_int_equal(ps_server_start("127.0.0.1", 0, opts, &c->servers[i]), FL_OK);
  for (uint32_t s = 0; s < shards; s++) {
    snprintf(c->places[s].primary, PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(c->servers[s % n]));
    if (replicated)
      snprintf(c->places[s].backups[0], PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(c->servers[(s + 1) % n]));
  }
  c->map = (ps_map){.table = table, .spec = *spec, .shards = shards, .workers = workers, .places = c->places};
  assert_int_equal(ps_table_create(&c->map, opts ? opts->secret : NULL, 10000), FL_OK);
}

static void cluster_stop(cluster *c) {
  for (uint32_t i = 0; i < c->n; i++) ps_server_stop(c->servers[i]);
}

static void wait_ok(ps_client *c, uint64_t ticket) {
  fl_status st = ps_client_wait(c, ticket, NULL);
  if (st != FL_OK) fail_msg("wait: %s", fl_last_error());
}

/* ---- arithmetic ---- */

static void check_arithmetic(ps_update_kind kind, bool sparse, uint32_t shards, uint32_t workers, uint64_t seed) {
  ps_table_spec spec = {.sparse = sparse, .keys = sparse ? 0 : 37, .width = 3, .update = PS_UPDATE_INIT};
  spec.update.kind = kind;
  spec.update.lr = 0.05f;
  cluster cl;
  cluster_start(&cl, shards < 3 ? shards : 3, 7, &spec, shards, workers, false, NULL);
  ps_client *w[8];
  for (uint32_t i = 0; i < workers; i++) assert_int_equal(ps_client_create(&cl.map, i, NULL, 10000, &w[i]), FL_OK);
  ps_shard *ref;
  assert_int_equal(ps_shard_create(&spec, 1, 0, &ref), FL_OK);
  common_rng rng;
  common_rng_seed(&rng, seed);
  uint64_t keys[40];
  float grads[40 * 3];
  /* Rounds of pushes, worker after worker (each waited, so the order is the reference's),
   * with skewed keys (a hot key in most pushes), duplicates and empty pushes. */
  for (int round = 0; round < 6; round++) {
    for (uint32_t i = 0; i < workers; i++) {
      size_t n = common_rng_next(&rng) % 7 == 0 ? 0 : 1 + common_rng_next(&rng) % 40;
      for (size_t k = 0; k < n; k++) {
        uint64_t r = common_rng_next(&rng);
        keys[k] = r % 3 == 0 ? 5 : sparse ? r % 1000 * 7919 : r % spec.keys;
        for (int j = 0; j < 3; j++) grads[k * 3 + j] = (float)(common_rng_uniform(&rng) - 0.5);
      }
      uint64_t t;
      assert_int_equal(ps_client_push(w[i], keys, n, grads, &t), FL_OK);
      wait_ok(w[i], t);
      assert_int_equal(ps_shard_push(ref, keys, n, grads), FL_OK);
    }
  }
  if (!sparse) { /* a range push too */
    float g[37 * 3];
    for (int j = 0; j < 37 * 3; j++) g[j] = (float)j * 0.01f;
    uint64_t t, all[37];
    for (uint64_t k = 0; k < 37; k++) all[k] = k;
    assert_int_equal(ps_client_push_range(w[0], 3, 30, g, &t), FL_OK);
    wait_ok(w[0], t);
    assert_int_equal(ps_shard_push(ref, all + 3, 30, g), FL_OK);
  }
  /* Every key the reference knows, pulled by each worker (keyed), equals it bit for bit. */
  uint64_t probe[64];
  size_t np = 0;
  for (uint64_t k = 0; k < 1000 && np < 64; k++) {
    uint64_t key = sparse ? k * 7919 : k;
    if (!sparse && key >= spec.keys) break;
    if (sparse && k % 17 != 5 && k != 0) continue;
    probe[np++] = key;
  }
  probe[np++] = 5;
  float got[64 * 3], want[64 * 3];
  assert_int_equal(ps_shard_pull(ref, probe, np, want), FL_OK);
  for (uint32_t i = 0; i < workers; i++) {
    uint64_t t;
    memset(got, 0xff, sizeof got);
    assert_int_equal(ps_client_pull(w[i], probe, np, got, &t), FL_OK);
    wait_ok(w[i], t);
    assert_memory_equal(got, want, np * 3 * sizeof(float));
  }
  if (!sparse) {
    float range[37 * 3];
    uint64_t t;
    assert_int_equal(ps_client_pull_range(w[workers - 1], 0, 37, range, &t), FL_OK);
    wait_ok(w[workers - 1], t);
    uint64_t all[37];
    for (uint64_t k = 0; k < 37; k++) all[k] = k;
    float ref_all[37 * 3];
    assert_int_equal(ps_shard_pull(ref, all, 37, ref_all), FL_OK);
    assert_memory_equal(range, ref_all, sizeof range);
  }
  for (uint32_t i = 0; i < workers; i++) ps_client_destroy(w[i]);
  ps_shard_destroy(ref);
  cluster_stop(&cl);
}

static void test_arithmetic_through_the_service(void **state) {
  (void)state;
  const uint32_t shard_counts[] = {1, 3, 8}, worker_counts[] = {1, 4, 8};
  uint64_t seed = 1;
  for (int kind = PS_UPDATE_ADD; kind <= PS_UPDATE_ADAM; kind++)
    for (int sparse = 0; sparse < 2; sparse++)
      for (int a = 0; a < 3; a++)
        check_arithmetic((ps_update_kind)kind, sparse, shard_counts[a], worker_counts[(a + kind) % 3], seed++);
}

/* Workers push at once from their own threads: sums of small integers are exact in any order. */
typedef struct adder {
  ps_client *c;
  uint32_t id;
} adder;

static void *adder_main(void *arg) {
  adder *a = arg;
  uint64_t keys[16];
  float g[16];
  for (int round = 0; round < 50; round++) {
    for (int k = 0; k < 16; k++) keys[k] = (uint64_t)(k * 13 + round) % 100, g[k] = (float)(a->id + 1);
    uint64_t t;
    if (ps_client_push(a->c, keys, 16, g, &t) != FL_OK || ps_client_wait(a->c, t, NULL) != FL_OK) return (void *)1;
  }
  return NULL;
}

static void test_concurrent_pushes_add_up(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 100, .width = 1, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 2, 1, &spec, 4, 4, true, NULL);
  adder a[4];
  pthread_t th[4];
  for (uint32_t i = 0; i < 4; i++) {
    a[i].id = i;
    assert_int_equal(ps_client_create(&cl.map, i, NULL, 10000, &a[i].c), FL_OK);
    assert_int_equal(pthread_create(&th[i], NULL, adder_main, &a[i]), 0);
  }
  for (uint32_t i = 0; i < 4; i++) {
    void *rv;
    pthread_join(th[i], &rv);
    assert_null(rv);
  }
  float want[100] = {0}, got[100];
  for (int round = 0; round < 50; round++)
    for (int k = 0; k < 16; k++) want[(k * 13 + round) % 100] += 1 + 2 + 3 + 4;
  uint64_t t;
  assert_int_equal(ps_client_pull_range(a[0].c, 0, 100, got, &t), FL_OK);
  wait_ok(a[0].c, t);
  assert_memory_equal(got, want, sizeof want);
  /* Every push was forwarded to its shard's backup before it was acknowledged. */
  uint64_t forwards = 0;
  for (uint32_t i = 0; i < cl.n; i++) forwards += ps_server_stats_get(cl.servers[i]).forwards;
  assert_true(forwards >= 4 * 50);
  for (uint32_t i = 0; i < 4; i++) ps_client_destroy(a[i].c);
  cluster_stop(&cl);
}

/* ---- consistency: no pull is staler than its bound ---- */

typedef struct sspw {
  ps_client *c;
  uint32_t id, staleness, iterations;
  atomic_int violations;
} sspw;

static void *ssp_main(void *arg) {
  sspw *w = arg;
  float v[8];
  float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  ps_client_set_staleness(w->c, w->staleness);
  for (uint32_t it = 0; it < w->iterations; it++) {
    uint64_t t, fresh = 0, clock = ps_client_clock_now(w->c);
    if (ps_client_pull_range(w->c, 0, 8, v, &t) != FL_OK || ps_client_wait(w->c, t, &fresh) != FL_OK) return (void *)1;
    /* The pull at clock c under staleness s must have seen every worker at c - s or later. */
    if (w->staleness != PS_STALENESS_ASYNC && fresh + w->staleness < clock) atomic_fetch_add(&w->violations, 1);
    if (w->id == 0) usleep(3000); /* the slow worker */
    if (ps_client_push_range(w->c, 0, 8, g, &t) != FL_OK || ps_client_wait(w->c, t, NULL) != FL_OK) return (void *)1;
    if (ps_client_clock(w->c, &t) != FL_OK || ps_client_wait(w->c, t, NULL) != FL_OK) return (void *)1;
  }
  return NULL;
}

static void test_ssp_bound_over_the_network(void **state) {
  (void)state;
  const uint32_t bounds[] = {0, 1, 3, PS_STALENESS_ASYNC};
  for (int b = 0; b < 4; b++) {
    ps_table_spec spec = {.keys = 8, .width = 1, .update = PS_UPDATE_INIT};
    cluster cl;
    cluster_start(&cl, 2, 3, &spec, 2, 4, false, NULL);
    sspw w[4];
    pthread_t th[4];
    for (uint32_t i = 0; i < 4; i++) {
      w[i] = (sspw){.id = i, .staleness = bounds[b], .iterations = 20};
      assert_int_equal(ps_client_create(&cl.map, i, NULL, 20000, &w[i].c), FL_OK);
      assert_int_equal(pthread_create(&th[i], NULL, ssp_main, &w[i]), 0);
    }
    for (uint32_t i = 0; i < 4; i++) {
      void *rv;
      pthread_join(th[i], &rv);
      assert_null(rv);
      assert_int_equal(atomic_load(&w[i].violations), 0);
    }
    float v[8];
    uint64_t t;
    assert_int_equal(ps_client_pull_range(w[0].c, 0, 8, v, &t), FL_OK);
    wait_ok(w[0].c, t);
    for (int k = 0; k < 8; k++) assert_true(v[k] == 80.0f);
    for (uint32_t i = 0; i < 4; i++) ps_client_destroy(w[i].c);
    cluster_stop(&cl);
  }
}

/* ---- replication: kill -9 the process holding a primary ---- */

static pid_t fork_server(int *port) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    ps_server *s;
    if (ps_server_start("127.0.0.1", 0, NULL, &s) != FL_OK) _exit(1);
    int p = ps_server_port(s);
    if (write(fds[1], &p, sizeof p) != sizeof p) _exit(1);
    for (;;) pause();
  }
  close(fds[1]);
  assert_int_equal(read(fds[0], port, sizeof *port), (ssize_t)sizeof *port);
  close(fds[0]);
  return pid;
}

static void test_primary_killed_backup_takes_over(void **state) {
  (void)state;
  int child_port;
  pid_t child = fork_server(&child_port); /* before this process has threads */
  ps_server *backup;
  assert_int_equal(ps_server_start("127.0.0.1", 0, NULL, &backup), FL_OK);
  ps_place places[2];
  memset(places, 0, sizeof places);
  /* shard 0: primary in the child, backup here; shard 1: unreplicated, here */
  snprintf(places[0].primary, PS_ADDRESS_MAX, "127.0.0.1:%d", child_port);
  snprintf(places[0].backups[0], PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(backup));
  snprintf(places[1].primary, PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(backup));
  ps_table_spec spec = {.keys = 64, .width = 2, .update = PS_UPDATE_INIT};
  spec.update.kind = PS_UPDATE_ADAGRAD;
  ps_map map = {.table = 9, .spec = spec, .shards = 2, .workers = 2, .places = places};
  assert_int_equal(ps_table_create(&map, NULL, 10000), FL_OK);
  ps_client *w[2];
  for (uint32_t i = 0; i < 2; i++) assert_int_equal(ps_client_create(&map, i, NULL, 10000, &w[i]), FL_OK);
  ps_shard *ref;
  assert_int_equal(ps_shard_create(&spec, 1, 0, &ref), FL_OK);
  float g[64 * 2];
  uint64_t all[64];
  for (int k = 0; k < 64; k++) all[k] = (uint64_t)k;
  for (int step = 0; step < 20; step++) {
    if (step == 10) { /* mid-run: the primary of shard 0 dies as a crashed executor does */
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
    }
    for (uint32_t i = 0; i < 2; i++) {
      for (int j = 0; j < 128; j++) g[j] = (float)((step * 7 + j * 3 + (int)i) % 11) * 0.1f - 0.5f;
      uint64_t t;
      assert_int_equal(ps_client_push_range(w[i], 0, 64, g, &t), FL_OK);
      wait_ok(w[i], t); /* acknowledged: it must survive */
      assert_int_equal(ps_shard_push(ref, all, 64, g), FL_OK);
    }
  }
  float got[128], want[128];
  uint64_t t;
  assert_int_equal(ps_client_pull_range(w[1], 0, 64, got, &t), FL_OK);
  wait_ok(w[1], t);
  assert_int_equal(ps_shard_pull(ref, all, 64, want), FL_OK);
  assert_memory_equal(got, want, sizeof want);
  assert_int_equal(ps_client_stats_get(w[0]).failovers, 1);
  assert_int_equal(ps_client_stats_get(w[1]).failovers, 1);
  for (uint32_t i = 0; i < 2; i++) ps_client_destroy(w[i]);
  ps_shard_destroy(ref);
  ps_server_stop(backup);
}

/* A resent request (same worker and sequence number) is applied once. */
static void test_resend_is_applied_once(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 1, 2, &spec, 1, 1, false, NULL);
  int fd;
  assert_int_equal(ps_wire_connect(cl.places[0].primary, 5000, &fd), FL_OK);
  float g[4] = {1, 2, 3, 4};
  fl_buf reply = FL_BUF_INIT;
  for (int i = 0; i < 3; i++) {
    ps_frame f = {.op = PS_OP_PUSH_RANGE, .table = 2, .worker = 0, .seq = i < 2 ? 1 : 2}, r;
    assert_int_equal(ps_wire_send(fd, &f, g, sizeof g, NULL, 0, ps_wire_deadline(5000), "test"), FL_OK);
    assert_int_equal(ps_wire_recv(fd, &r, &reply, 4096, ps_wire_deadline(5000), 5000, "test", NULL), FL_OK);
    assert_int_equal(r.status, FL_OK);
  }
  close(fd);
  fl_buf_free(&reply);
  assert_int_equal(ps_server_stats_get(cl.servers[0]).duplicates, 1);
  ps_client *c;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c), FL_OK);
  float v[4];
  uint64_t t;
  assert_int_equal(ps_client_pull_range(c, 0, 4, v, &t), FL_OK);
  wait_ok(c, t);
  for (int k = 0; k < 4; k++) assert_true(v[k] == 2 * g[k]);
  ps_client_destroy(c);
  cluster_stop(&cl);
}

/* A worker opened again (a retried task) goes on from the clock the servers have for it. */
static void test_reopened_worker_keeps_its_clock(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 2, 8, &spec, 3, 2, true, NULL);
  ps_client *c;
  assert_int_equal(ps_client_create(&cl.map, 1, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_clock_now(c), 0);
  for (int i = 0; i < 5; i++) {
    uint64_t t;
    assert_int_equal(ps_client_clock(c, &t), FL_OK);
    wait_ok(c, t);
  }
  ps_client_destroy(c);
  assert_int_equal(ps_client_create(&cl.map, 1, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_clock_now(c), 5);
  /* Its changes are numbered on from the lost attempt's: they apply, none reads as a resend. */
  float g[4] = {1, 1, 1, 1}, v[4];
  uint64_t t;
  assert_int_equal(ps_client_push_range(c, 0, 4, g, &t), FL_OK);
  wait_ok(c, t);
  assert_int_equal(ps_client_clock(c, &t), FL_OK);
  wait_ok(c, t);
  assert_int_equal(ps_client_pull_range(c, 0, 4, v, &t), FL_OK);
  wait_ok(c, t);
  for (int k = 0; k < 4; k++) assert_true(v[k] == 1.0f);
  ps_client_destroy(c);
  assert_int_equal(ps_client_create(&cl.map, 1, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_clock_now(c), 6);
  ps_client_destroy(c);
  for (uint32_t i = 0; i < cl.n; i++) assert_int_equal(ps_server_stats_get(cl.servers[i]).duplicates, 0);
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_clock_now(c), 0);
  ps_client_destroy(c);
  cluster_stop(&cl);
}

/* CLOCKS (the web UI's view): every worker's clock on a shard's primary, a retired worker's
 * as UINT64_MAX; a shard that is not there is FL_ENOENT naming it. */
static void test_clocks_of_a_shard(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 2, 9, &spec, 2, 3, true, NULL);
  ps_client *c0, *c2;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c0), FL_OK);
  assert_int_equal(ps_client_create(&cl.map, 2, NULL, 5000, &c2), FL_OK);
  uint64_t t;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(ps_client_clock(c0, &t), FL_OK);
    wait_ok(c0, t);
  }
  assert_int_equal(ps_client_retire(c2, &t), FL_OK);
  wait_ok(c2, t);
  for (uint32_t s = 0; s < 2; s++) {
    uint64_t *clocks = NULL;
    uint32_t n = 0;
    assert_int_equal(ps_shard_clocks(cl.places[s].primary, NULL, 9, s, 5000, &clocks, &n), FL_OK);
    assert_int_equal(n, 3);
    assert_int_equal(clocks[0], 3);
    assert_int_equal(clocks[1], 0);
    assert_true(clocks[2] == UINT64_MAX);
    common_free(clocks);
  }
  uint64_t *clocks = NULL;
  uint32_t n = 7;
  assert_int_equal(ps_shard_clocks(cl.places[0].primary, NULL, 9, 5, 5000, &clocks, &n), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "table 9 shard 5 is not hosted here"));
  assert_null(clocks);
  assert_int_equal(n, 0);
  ps_client_destroy(c0);
  ps_client_destroy(c2);
  cluster_stop(&cl);
}

/* A primary backs itself up on a new server (the driver's recovery): the copy carries the
 * values, the clocks and the sequence numbers, and later pushes are forwarded to it. */
static void test_replicate_to_a_new_backup(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 16, .width = 2, .update = PS_UPDATE_INIT};
  spec.update.kind = PS_UPDATE_ADAM;
  cluster cl;
  cluster_start(&cl, 1, 11, &spec, 1, 2, false, NULL);
  ps_server *fresh;
  assert_int_equal(ps_server_start("127.0.0.1", 0, NULL, &fresh), FL_OK);
  char fresh_addr[PS_ADDRESS_MAX];
  snprintf(fresh_addr, sizeof fresh_addr, "127.0.0.1:%d", ps_server_port(fresh));
  ps_client *c;
  assert_int_equal(ps_client_create(&cl.map, 1, NULL, 5000, &c), FL_OK);
  float g[32], want[32], got[32];
  for (int i = 0; i < 32; i++) g[i] = (float)(i % 5) - 2;
  uint64_t t;
  for (int round = 0; round < 3; round++) {
    assert_int_equal(ps_client_push_range(c, 0, 16, g, &t), FL_OK);
    wait_ok(c, t);
    assert_int_equal(ps_client_clock(c, &t), FL_OK);
    wait_ok(c, t);
  }
  assert_int_equal(ps_shard_replicate(cl.places[0].primary, NULL, 11, 0, fresh_addr, 5000), FL_OK);
  assert_int_equal(ps_client_push_range(c, 0, 16, g, &t), FL_OK); /* forwarded to the new backup */
  wait_ok(c, t);
  assert_int_equal(ps_client_pull_range(c, 0, 16, want, &t), FL_OK);
  wait_ok(c, t);
  ps_client_destroy(c);
  /* The primary goes; the new backup, promoted, has everything. */
  cluster_stop(&cl);
  assert_int_equal(ps_shard_promote(fresh_addr, NULL, 11, 0, 5000), FL_OK);
  ps_place moved;
  memset(&moved, 0, sizeof moved);
  snprintf(moved.primary, PS_ADDRESS_MAX, "%s", fresh_addr);
  ps_map map = {.table = 11, .spec = spec, .shards = 1, .workers = 2, .places = &moved};
  assert_int_equal(ps_client_create(&map, 1, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_clock_now(c), 3);
  assert_int_equal(ps_client_pull_range(c, 0, 16, got, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(got, want, sizeof got);
  ps_client_destroy(c);
  /* A replicate to a server that is not there fails, naming it. */
  ps_server_stop(fresh);
  assert_int_equal(ps_shard_replicate(fresh_addr, NULL, 11, 0, "127.0.0.1:1", 2000), FL_ENET);
  assert_non_null(strstr(fl_last_error(), fresh_addr));
}

/* Three servers on loopback: a place with its primary on the first and `backups` backups on
 * the next; *spare (may be NULL) gets the third's address. */
static void three_servers(ps_server *srv[3], ps_place *place, int backups, char spare[PS_ADDRESS_MAX]) {
  memset(place, 0, sizeof *place);
  for (int i = 0; i < 3; i++) assert_int_equal(ps_server_start("127.0.0.1", 0, NULL, &srv[i]), FL_OK);
  snprintf(place->primary, PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(srv[0]));
  for (int b = 0; b < backups; b++)
    snprintf(place->backups[b], PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(srv[1 + b]));
  if (spare) snprintf(spare, PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(srv[2]));
}

/* Three replicas of each shard, primary-backup and chain: the primary and then the first
 * backup go, and the last replica serves everything that was acknowledged. */
static void check_two_losses(ps_replication mode) {
  ps_server *srv[3];
  ps_place place;
  three_servers(srv, &place, 2, NULL);
  ps_table_spec spec = {.keys = 8, .width = 1, .update = PS_UPDATE_INIT};
  spec.update.kind = PS_UPDATE_ADAGRAD;
  ps_map map = {.table = 21, .spec = spec, .shards = 1, .workers = 1, .replication = mode, .places = &place};
  assert_int_equal(ps_table_create(&map, NULL, 5000), FL_OK);
  ps_client *c;
  assert_int_equal(ps_client_create(&map, 0, NULL, 5000, &c), FL_OK);
  ps_shard *ref;
  assert_int_equal(ps_shard_create(&spec, 1, 0, &ref), FL_OK);
  uint64_t all[8] = {0, 1, 2, 3, 4, 5, 6, 7}, t;
  float g[8], got[8], want[8];
  for (int round = 0; round < 9; round++) {
    if (round == 3 || round == 6) ps_server_stop(srv[round / 3 - 1]); /* the primary, then the first backup */
    for (int k = 0; k < 8; k++) g[k] = (float)((round + k) % 5) - 2;
    assert_int_equal(ps_client_push_range(c, 0, 8, g, &t), FL_OK);
    wait_ok(c, t);
    assert_int_equal(ps_shard_push(ref, all, 8, g), FL_OK);
  }
  assert_int_equal(ps_client_pull_range(c, 0, 8, got, &t), FL_OK);
  wait_ok(c, t);
  assert_int_equal(ps_shard_pull(ref, all, 8, want), FL_OK);
  assert_memory_equal(got, want, sizeof got);
  assert_int_equal(ps_client_stats_get(c).failovers, 2);
  ps_client_destroy(c);
  ps_shard_destroy(ref);
  ps_server_stop(srv[2]);
}

static void test_three_replicas_survive_two_losses(void **state) {
  (void)state;
  check_two_losses(PS_REPLICATION_PRIMARY_BACKUP);
  check_two_losses(PS_REPLICATION_CHAIN);
}

/* The primary died after its forward reached the first backup but not the second: the
 * client's resend is a duplicate at the promoted backup, which forwards it all the same, so
 * the second backup has it too. */
static void test_resend_reaches_the_replica_the_primary_missed(void **state) {
  (void)state;
  ps_server *srv[3];
  ps_place place;
  three_servers(srv, &place, 2, NULL);
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  ps_map map = {.table = 22, .spec = spec, .shards = 1, .workers = 1, .places = &place};
  assert_int_equal(ps_table_create(&map, NULL, 5000), FL_OK);
  float g[4] = {1, 2, 3, 4}, got[4];
  ps_client *c;
  assert_int_equal(ps_client_create(&map, 0, NULL, 5000, &c), FL_OK);
  /* What the dying primary managed of worker 0's first push: its forward to backup 0 only. */
  int fd;
  fl_buf reply = FL_BUF_INIT;
  assert_int_equal(ps_wire_connect(place.backups[0], 5000, &fd), FL_OK);
  ps_frame f = {.op = PS_OP_PUSH_RANGE | PS_OP_FORWARDED, .table = 22, .worker = 0, .seq = 1}, r;
  assert_int_equal(ps_wire_send(fd, &f, g, sizeof g, NULL, 0, ps_wire_deadline(5000), "test"), FL_OK);
  assert_int_equal(ps_wire_recv(fd, &r, &reply, 4096, ps_wire_deadline(5000), 5000, "test", NULL), FL_OK);
  assert_int_equal(r.status, FL_OK);
  close(fd);
  fl_buf_free(&reply);
  ps_server_stop(srv[0]);
  uint64_t t;
  assert_int_equal(ps_client_push_range(c, 0, 4, g, &t), FL_OK); /* seq 1: fails over, sent again */
  wait_ok(c, t);
  assert_int_equal(ps_server_stats_get(srv[1]).duplicates, 1);
  ps_server_stop(srv[1]); /* the promoted backup goes too: the second backup has the push once */
  assert_int_equal(ps_client_pull_range(c, 0, 4, got, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(got, g, sizeof g);
  ps_client_destroy(c);
  ps_server_stop(srv[2]);
}

/* A client learns the replicas the driver adds after it opened (it asks the replicas every
 * two seconds), so it survives the loss of every replica it was told of. */
static void test_client_learns_new_replicas(void **state) {
  (void)state;
  ps_server *srv[3];
  char third[PS_ADDRESS_MAX];
  ps_place place;
  three_servers(srv, &place, 1, third);
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  ps_map map = {.table = 23, .spec = spec, .shards = 1, .workers = 1, .places = &place};
  assert_int_equal(ps_table_create(&map, NULL, 5000), FL_OK);
  ps_client *c;
  assert_int_equal(ps_client_create(&map, 0, NULL, 5000, &c), FL_OK);
  float g[4] = {1, 2, 3, 4}, got[4];
  uint64_t t;
  assert_int_equal(ps_client_push_range(c, 0, 4, g, &t), FL_OK);
  wait_ok(c, t);
  assert_int_equal(ps_shard_replicate(place.primary, NULL, 23, 0, third, 5000), FL_OK); /* as the driver would */
  usleep(2100 * 1000); /* past the client's refresh period */
  assert_int_equal(ps_client_push_range(c, 0, 4, g, &t), FL_OK); /* refreshes first */
  wait_ok(c, t);
  ps_server_stop(srv[0]);
  ps_server_stop(srv[1]);
  assert_int_equal(ps_client_pull_range(c, 0, 4, got, &t), FL_OK);
  wait_ok(c, t);
  for (int k = 0; k < 4; k++) assert_true(got[k] == 2 * g[k]);
  ps_client_destroy(c);
  ps_server_stop(srv[2]);
}

/* A worker opened with an old map (primary A, backup B) after the driver promoted B and
 * backed it up on C: its own failover's PROMOTE must not undo B's forwarding to C. */
static void test_stale_promote_keeps_new_backups(void **state) {
  (void)state;
  ps_server *srv[3];
  char c_addr[PS_ADDRESS_MAX];
  ps_place place;
  three_servers(srv, &place, 1, c_addr);
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  ps_map map = {.table = 24, .spec = spec, .shards = 1, .workers = 1, .places = &place};
  assert_int_equal(ps_table_create(&map, NULL, 5000), FL_OK);
  ps_server_stop(srv[0]); /* A is lost; the driver promotes B and backs it up on C */
  assert_int_equal(ps_shard_promote(place.backups[0], NULL, 24, 0, 5000), FL_OK);
  assert_int_equal(ps_shard_replicate(place.backups[0], NULL, 24, 0, c_addr, 5000), FL_OK);
  ps_client *c;
  assert_int_equal(ps_client_create(&map, 0, NULL, 5000, &c), FL_OK); /* fails over to B by itself */
  float g[4] = {1, 2, 3, 4}, got[4];
  uint64_t t;
  assert_int_equal(ps_client_push_range(c, 0, 4, g, &t), FL_OK);
  wait_ok(c, t);
  ps_client_destroy(c);
  ps_server_stop(srv[1]); /* B is lost too: C has the acknowledged push */
  ps_place at_c;
  memset(&at_c, 0, sizeof at_c);
  snprintf(at_c.primary, PS_ADDRESS_MAX, "%s", c_addr);
  assert_int_equal(ps_shard_promote(c_addr, NULL, 24, 0, 5000), FL_OK);
  ps_map map_c = {.table = 24, .spec = spec, .shards = 1, .workers = 1, .places = &at_c};
  assert_int_equal(ps_client_create(&map_c, 0, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_pull_range(c, 0, 4, got, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(got, g, sizeof g);
  ps_client_destroy(c);
  ps_server_stop(srv[2]);
}

/* A table dropped and hosted again under the same id (a retried create) is made afresh: the
 * dropped entry neither crashes the host nor answers. */
static void test_host_after_drop(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 4, .width = 1, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 1, 25, &spec, 1, 1, false, NULL);
  ps_client *c;
  float g[4] = {1, 1, 1, 1}, got[4];
  uint64_t t;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_push_range(c, 0, 4, g, &t), FL_OK);
  wait_ok(c, t);
  ps_client_destroy(c);
  assert_int_equal(ps_shard_drop(cl.places[0].primary, NULL, 25, 0, 5000), FL_OK);
  assert_int_equal(ps_table_create(&cl.map, NULL, 5000), FL_OK);
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_pull_range(c, 0, 4, got, &t), FL_OK);
  wait_ok(c, t);
  for (int k = 0; k < 4; k++) assert_true(got[k] == 0.0f); /* a fresh shard */
  ps_client_destroy(c);
  cluster_stop(&cl);
}

/* ---- checkpoints ---- */

static void test_save_and_load(void **state) {
  (void)state;
  ps_table_spec spec = {.sparse = true, .width = 2, .update = PS_UPDATE_INIT};
  spec.update.kind = PS_UPDATE_ADAM;
  cluster cl;
  cluster_start(&cl, 2, 4, &spec, 3, 1, true, NULL);
  ps_client *c;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c), FL_OK);
  uint64_t keys[5] = {1, 99, 1u << 30, 12345678901ull, 7};
  float g[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, saved[10], later[10], back[10];
  uint64_t t;
  assert_int_equal(ps_client_push(c, keys, 5, g, &t), FL_OK);
  wait_ok(c, t);
  assert_int_equal(ps_client_pull(c, keys, 5, saved, &t), FL_OK);
  wait_ok(c, t);
  char path[] = "/tmp/flint-ps-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(ps_table_save(c, path), FL_OK);
  assert_int_equal(ps_client_push(c, keys, 5, g, &t), FL_OK);
  wait_ok(c, t);
  assert_int_equal(ps_client_pull(c, keys, 5, later, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_not_equal(later, saved, sizeof saved);
  assert_int_equal(ps_table_load(c, path), FL_OK);
  assert_int_equal(ps_client_pull(c, keys, 5, back, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(back, saved, sizeof saved);
  /* A damaged checkpoint is refused by the shards' checks, and the table keeps its state. */
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 24 + 8 + 74, SEEK_SET); /* inside shard 0's blob, past its header */
  fputc(0x5a, f);
  fclose(f);
  assert_int_equal(ps_table_load(c, path), FL_ECORRUPT);
  assert_non_null(strstr(fl_last_error(), path));
  assert_int_equal(ps_client_pull(c, keys, 5, back, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(back, saved, sizeof saved);
  f = fopen(path, "wb");
  fputs("not a checkpoint", f);
  fclose(f);
  assert_int_equal(ps_table_load(c, path), FL_EFORMAT);
  unlink(path);
  assert_int_equal(ps_table_load(c, path), FL_ENOENT);
  ps_client_destroy(c);
  cluster_stop(&cl);
}

/* ---- bad input ---- */

static void test_bad_requests_get_clear_errors(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 10, .width = 4, .update = PS_UPDATE_INIT};
  ps_server_options opts = PS_SERVER_OPTIONS_INIT;
  opts.secret = "s3cret";
  opts.max_message = 4096;
  cluster cl;
  cluster_start(&cl, 1, 5, &spec, 2, 2, false, &opts);
  ps_client *c, *stranger;
  assert_int_equal(ps_client_create(&cl.map, 1, "s3cret", 5000, &c), FL_OK);
  uint64_t bad[2] = {3, 10}, t;
  float g[8] = {0};
  assert_int_equal(ps_client_push(c, bad, 2, g, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "key 10"));
  assert_int_equal(ps_client_pull_range(c, 8, 3, g, &t), FL_EINVAL);
  assert_int_equal(ps_client_create(&cl.map, 2, "s3cret", 5000, &stranger), FL_EINVAL); /* worker 2 of 2 */
  /* An oversized push: the server's limit, named. */
  float *big = calloc(10 * 4 * 40, sizeof(float));
  ps_table_spec wide = {.keys = 2000, .width = 4, .update = PS_UPDATE_INIT};
  ps_place wide_place = cl.places[0];
  ps_map wide_map = {.table = 6, .spec = wide, .shards = 1, .workers = 1, .places = &wide_place};
  assert_int_equal(ps_table_create(&wide_map, "s3cret", 5000), FL_OK);
  ps_client *wc;
  assert_int_equal(ps_client_create(&wide_map, 0, "s3cret", 5000, &wc), FL_OK);
  assert_int_equal(ps_client_push_range(wc, 0, 400, big, &t), FL_OK);
  assert_int_equal(ps_client_wait(wc, t, NULL), FL_ELIMIT);
  assert_non_null(strstr(fl_last_error(), "limit of 4096 bytes"));
  /* The client goes on after the refusal (a new connection). */
  assert_int_equal(ps_client_push_range(wc, 0, 10, big, &t), FL_OK);
  wait_ok(wc, t);
  ps_client_destroy(wc);
  free(big);
  /* A wrong secret, an unknown table: a client asks every shard for its clock as it opens. */
  assert_int_equal(ps_client_create(&cl.map, 0, "wrong", 5000, &stranger), FL_EAUTH);
  ps_map ghost = cl.map;
  ghost.table = 77;
  assert_int_equal(ps_client_create(&ghost, 0, "s3cret", 5000, &stranger), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "table 77"));
  /* A table's id taken by another spec. */
  ps_map clash = cl.map;
  clash.spec.width = 5;
  assert_int_equal(ps_table_create(&clash, "s3cret", 5000), FL_EEXIST);
  /* Garbage on the wire: the server answers, closes that connection, and serves the rest. */
  int fd;
  assert_int_equal(ps_wire_connect(cl.places[0].primary, 5000, &fd), FL_OK);
  char junk[PS_WIRE_HEADER];
  memset(junk, 'x', sizeof junk);
  assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  ps_frame r;
  fl_buf reply = FL_BUF_INIT;
  assert_int_equal(ps_wire_recv(fd, &r, &reply, 4096, ps_wire_deadline(5000), 5000, "test", NULL), FL_OK);
  assert_int_equal(r.status, FL_EPROTO);
  close(fd);
  fl_buf_free(&reply);
  assert_int_equal(ps_client_pull_range(c, 0, 2, g, &t), FL_OK);
  wait_ok(c, t);
  ps_client_destroy(c);
  cluster_stop(&cl);
}

/* ---- columns: vectors on the servers ---- */

#define COL_KEYS 37
#define COL_WIDTH 4

/* The reference: the whole table in one array, with the servers' arithmetic (double, then
 * float) and their dot (each shard's part in double, added in shard order). */
static double ref_column(float *ref, const ps_table_spec *spec, uint32_t shards, const ps_column_op *op,
                         const float *in, float *out) {
  double total = 0;
  for (uint32_t s = 0; s < shards; s++) {
    uint64_t a = ps_range_lo(spec, shards, s), b = ps_range_lo(spec, shards, s + 1), part = 0;
    double sum = 0;
    for (uint64_t k = a; k < b; k++) {
      if (k < op->lo || k >= op->lo + op->count) continue;
      float *x = ref + k * COL_WIDTH + op->x, *y = ref + k * COL_WIDTH + op->y;
      uint64_t i = k - op->lo;
      part++;
      switch (op->kind) {
      case PS_COLUMN_PUSH: *y = (float)((double)*y + in[i]); break;
      case PS_COLUMN_SET: *y = in[i]; break;
      case PS_COLUMN_PULL: out[i] = *x; break;
      case PS_COLUMN_DOT: sum += (double)*x * *y; break;
      case PS_COLUMN_AXPY: *y = (float)((double)*y + op->alpha * *x); break;
      case PS_COLUMN_SCALE: *y = (float)(op->alpha * *y); break;
      case PS_COLUMN_COPY: *y = *x; break;
      case PS_COLUMN_FILL: *y = (float)op->alpha; break;
      }
    }
    if (part) total += sum;
  }
  return total;
}

static void check_columns(uint32_t shards, uint64_t seed) {
  ps_table_spec spec = {.keys = COL_KEYS, .width = COL_WIDTH, .update = PS_UPDATE_INIT};
  uint32_t servers = shards < 3 ? shards + 1 : 3;
  cluster cl;
  cluster_start(&cl, servers, 20 + shards, &spec, shards, 1, true, NULL);
  ps_client *c;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 10000, &c), FL_OK);
  float ref[COL_KEYS * COL_WIDTH] = {0}, in[COL_KEYS], got[COL_KEYS], want[COL_KEYS];
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int step = 0; step < 200; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    ps_column_op op = {.kind = (ps_column_kind)(1 + (rng >> 33) % PS_COLUMN_LAST), .x = (uint32_t)(rng >> 20) % COL_WIDTH,
                       .y = (uint32_t)(rng >> 40) % COL_WIDTH, .alpha = (double)((int)(rng >> 50) % 17 - 8) / 3.0};
    /* ranges: the whole column, empty, one key, and ones that straddle shards */
    uint64_t r = (rng >> 12) % 5;
    op.lo = r == 0 ? 0 : (rng >> 24) % COL_KEYS;
    op.count = r == 0 ? COL_KEYS : r == 1 ? 0 : r == 2 ? 1 : (rng >> 44) % (COL_KEYS - op.lo + 1);
    for (uint64_t i = 0; i < op.count; i++) in[i] = (float)((int)((rng >> (i % 40)) % 1000) - 500) / 64.0f;
    double want_dot = ref_column(ref, &spec, shards, &op, in, want), dot = -1;
    uint64_t t;
    assert_int_equal(ps_client_column(c, &op, in, got, &dot, &t), FL_OK);
    wait_ok(c, t);
    if (op.kind == PS_COLUMN_DOT) assert_true(dot == want_dot); /* bit for bit */
    if (op.kind == PS_COLUMN_PULL) assert_memory_equal(got, want, op.count * sizeof(float));
  }
  /* the whole table as rows, on the primaries and, after promotion, on the backups */
  float all[COL_KEYS * COL_WIDTH];
  uint64_t t;
  assert_int_equal(ps_client_pull_range(c, 0, COL_KEYS, all, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(all, ref, sizeof all);
  ps_client_destroy(c);
  ps_place backups[MAX_SERVERS];
  for (uint32_t s = 0; s < shards; s++) {
    assert_int_equal(ps_shard_promote(cl.places[s].backups[0], NULL, cl.map.table, s, 5000), FL_OK);
    memset(&backups[s], 0, sizeof backups[s]);
    snprintf(backups[s].primary, PS_ADDRESS_MAX, "%s", cl.places[s].backups[0]);
  }
  ps_map promoted = cl.map;
  promoted.places = backups;
  assert_int_equal(ps_client_create(&promoted, 0, NULL, 10000, &c), FL_OK);
  memset(all, 0xff, sizeof all);
  assert_int_equal(ps_client_pull_range(c, 0, COL_KEYS, all, &t), FL_OK);
  wait_ok(c, t);
  assert_memory_equal(all, ref, sizeof all);
  ps_client_destroy(c);
  cluster_stop(&cl);
}

static void test_columns_match_a_local_reference(void **state) {
  (void)state;
  for (uint32_t shards = 1; shards <= 8; shards++) check_columns(shards, shards);
}

/* A once-push: the same (worker, seq) counts once, whichever client sends it (a task run
 * twice opens the same worker twice); a later seq counts again. */
static void test_push_once_counts_once(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 10, .width = 3, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 2, 30, &spec, 3, 2, true, NULL);
  ps_client *first, *second, *reader;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &first), FL_OK);
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &second), FL_OK);
  assert_int_equal(ps_client_create(&cl.map, 1, NULL, 5000, &reader), FL_OK);
  float g[10], v[10];
  for (int k = 0; k < 10; k++) g[k] = (float)(k + 1);
  uint64_t t;
  assert_int_equal(ps_client_push_column_once(first, 1, 0, 10, g, 1, &t), FL_OK);
  wait_ok(first, t);
  assert_int_equal(ps_client_push_column_once(second, 1, 0, 10, g, 1, &t), FL_OK); /* the duplicate */
  wait_ok(second, t);
  assert_int_equal(ps_client_push_column_once(first, 1, 2, 5, g, 1, &t), FL_OK); /* again, on part of it */
  wait_ok(first, t);
  ps_column_op pull = {.kind = PS_COLUMN_PULL, .x = 1, .lo = 0, .count = PS_COLUMN_TO_END};
  assert_int_equal(ps_client_column(reader, &pull, NULL, v, NULL, &t), FL_OK);
  wait_ok(reader, t);
  for (int k = 0; k < 10; k++) assert_true(v[k] == g[k]);
  uint64_t dups = 0;
  for (uint32_t i = 0; i < cl.n; i++) dups += ps_server_stats_get(cl.servers[i]).duplicates;
  assert_true(dups >= 2 * 3 - 1); /* every shard skipped the second; shards 0..1 of [2, 7) the third too */
  assert_int_equal(ps_client_push_column_once(second, 1, 0, 10, g, 2, &t), FL_OK); /* the next iteration */
  wait_ok(second, t);
  assert_int_equal(ps_client_column(reader, &pull, NULL, v, NULL, &t), FL_OK);
  wait_ok(reader, t);
  for (int k = 0; k < 10; k++) assert_true(v[k] == 2 * g[k]);
  /* other columns untouched */
  pull.x = 0;
  assert_int_equal(ps_client_column(reader, &pull, NULL, v, NULL, &t), FL_OK);
  wait_ok(reader, t);
  for (int k = 0; k < 10; k++) assert_true(v[k] == 0);
  ps_client_destroy(first);
  ps_client_destroy(second);
  ps_client_destroy(reader);
  cluster_stop(&cl);
}

static void test_bad_column_requests(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 10, .width = 4, .update = PS_UPDATE_INIT};
  cluster cl;
  cluster_start(&cl, 1, 31, &spec, 2, 1, false, NULL);
  ps_client *c;
  assert_int_equal(ps_client_create(&cl.map, 0, NULL, 5000, &c), FL_OK);
  float v[16] = {0};
  double dot;
  uint64_t t;
  ps_column_op op = {.kind = PS_COLUMN_AXPY, .x = 4, .y = 0, .alpha = 1, .lo = 0, .count = 10};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, NULL, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "column 4 of a table of 4 columns"));
  op = (ps_column_op){.kind = PS_COLUMN_DOT, .x = 0, .y = 1, .lo = 8, .count = 3};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, &dot, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "keys [8, 11)"));
  op.count = 2;
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, NULL, &t), FL_EINVAL); /* no result */
  op = (ps_column_op){.kind = PS_COLUMN_SCALE, .y = 0, .alpha = NAN, .count = 1};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, NULL, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "not finite"));
  op = (ps_column_op){.kind = (ps_column_kind)99};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, NULL, &t), FL_EINVAL);
  assert_int_equal(ps_client_push_column_once(c, 0, 0, 10, v, 0, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "sequence number"));
  /* the server checks too: a descriptor for another shard's keys, and a bad one */
  int fd;
  assert_int_equal(ps_wire_connect(cl.places[0].primary, 5000, &fd), FL_OK);
  fl_buf reply = FL_BUF_INIT;
  uint8_t desc[PS_WIRE_COLUMN_BYTES];
  ps_column_op far = {.kind = PS_COLUMN_FILL, .y = 0, .alpha = 1, .lo = 7, .count = 2}; /* shard 1's keys */
  ps_wire_column_encode(&far, desc);
  ps_frame f = {.op = PS_OP_COLUMN, .table = 31, .shard = 0, .seq = 1}, r;
  assert_int_equal(ps_wire_send(fd, &f, desc, sizeof desc, NULL, 0, ps_wire_deadline(5000), "test"), FL_OK);
  assert_int_equal(ps_wire_recv(fd, &r, &reply, 4096, ps_wire_deadline(5000), 5000, "test", NULL), FL_OK);
  assert_int_equal(r.status, FL_EINVAL);
  assert_non_null(strstr((const char *)reply.data, "not inside shard 0's"));
  desc[2] = 7; /* a reserved byte */
  assert_int_equal(ps_wire_send(fd, &f, desc, sizeof desc, NULL, 0, ps_wire_deadline(5000), "test"), FL_OK);
  assert_int_equal(ps_wire_recv(fd, &r, &reply, 4096, ps_wire_deadline(5000), 5000, "test", NULL), FL_OK);
  assert_int_equal(r.status, FL_EPROTO);
  close(fd);
  fl_buf_free(&reply);
  /* the client goes on */
  op = (ps_column_op){.kind = PS_COLUMN_DOT, .x = 0, .y = 0, .lo = 0, .count = PS_COLUMN_TO_END};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, &dot, &t), FL_OK);
  wait_ok(c, t);
  assert_true(dot == 0);
  ps_client_destroy(c);
  /* a sparse table has no columns; a table that is not `add` takes no column push */
  ps_table_spec sparse = {.sparse = true, .width = 2, .update = PS_UPDATE_INIT};
  cluster sp;
  cluster_start(&sp, 1, 32, &sparse, 1, 1, false, NULL);
  assert_int_equal(ps_client_create(&sp.map, 0, NULL, 5000, &c), FL_OK);
  op = (ps_column_op){.kind = PS_COLUMN_FILL, .count = 1};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, NULL, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "sparse"));
  ps_client_destroy(c);
  cluster_stop(&sp);
  ps_table_spec ada = {.keys = 4, .width = 2, .update = PS_UPDATE_INIT};
  ada.update.kind = PS_UPDATE_ADAGRAD;
  cluster ac;
  cluster_start(&ac, 1, 33, &ada, 1, 1, false, NULL);
  assert_int_equal(ps_client_create(&ac.map, 0, NULL, 5000, &c), FL_OK);
  assert_int_equal(ps_client_push_column_once(c, 0, 0, 4, v, 1, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "add table"));
  op = (ps_column_op){.kind = PS_COLUMN_FILL, .y = 1, .alpha = 2, .count = 4};
  assert_int_equal(ps_client_column(c, &op, NULL, NULL, NULL, &t), FL_OK); /* the rest is fine */
  wait_ok(c, t);
  ps_client_destroy(c);
  cluster_stop(&ac);
  cluster_stop(&cl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_primary_killed_backup_takes_over), /* first: it forks */
      cmocka_unit_test(test_arithmetic_through_the_service),
      cmocka_unit_test(test_concurrent_pushes_add_up),
      cmocka_unit_test(test_ssp_bound_over_the_network),
      cmocka_unit_test(test_resend_is_applied_once),
      cmocka_unit_test(test_reopened_worker_keeps_its_clock),
      cmocka_unit_test(test_clocks_of_a_shard),
      cmocka_unit_test(test_replicate_to_a_new_backup),
      cmocka_unit_test(test_three_replicas_survive_two_losses),
      cmocka_unit_test(test_client_learns_new_replicas),
      cmocka_unit_test(test_stale_promote_keeps_new_backups),
      cmocka_unit_test(test_host_after_drop),
      cmocka_unit_test(test_resend_reaches_the_replica_the_primary_missed),
      cmocka_unit_test(test_save_and_load),
      cmocka_unit_test(test_bad_requests_get_clear_errors),
      cmocka_unit_test(test_columns_match_a_local_reference),
      cmocka_unit_test(test_push_once_counts_once),
      cmocka_unit_test(test_bad_column_requests),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
