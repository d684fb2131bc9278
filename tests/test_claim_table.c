/* test_claim_table: node-shared tasks' claims (executor/storage/claim_table.c). An owner and its node
 * peers (here a parent and forked children, as executors beside each other) claim attempt keys
 * in the owner's table; each key must go to exactly one of them. */
#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "executor/storage/storage.h"

enum { KEYS = 200000 };

static void wait_ok(pid_t child) {
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* The owner and two peers race over the same keys, the peers from the other end as executors
 * do with offers: every key is claimed exactly once, and who lost knows it. */
static void test_each_key_claimed_once(void **state) {
  (void)state;
  claim_table *mine;
  assert_ok(claim_table_create(&mine));
  const uint64_t base = (uint64_t)7 << 40; /* as the driver's random start */
  uint8_t *won = mmap(NULL, 3 * KEYS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(won != MAP_FAILED);
  memset(won, 0, 3 * KEYS);
  pid_t owner = getpid(), peers[2];
  for (int p = 0; p < 2; p++) {
    peers[p] = fork();
    assert_true(peers[p] >= 0);
    if (peers[p] == 0) {
      claim_table *theirs;
      if (claim_table_open((uint32_t)owner, &theirs) != FL_OK) _exit(2);
      for (uint64_t i = KEYS; i-- > 0;) won[(size_t)(p + 1) * KEYS + i] = claim_table_take(theirs, base + i, false);
      claim_table_free(theirs);
      _exit(0);
    }
  }
  for (uint64_t i = 0; i < KEYS; i++) won[i] = claim_table_take(mine, base + i, true);
  for (int p = 0; p < 2; p++) wait_ok(peers[p]);
  size_t by[3] = {0};
  for (size_t i = 0; i < KEYS; i++) {
    int winners = won[i] + won[KEYS + i] + won[2 * KEYS + i];
    if (winners != 1) fail_msg("key %zu was claimed %d times", i, winners);
    for (int w = 0; w < 3; w++) by[w] += won[(size_t)w * KEYS + i];
  }
  fprintf(stderr, "claims: owner %zu, peers %zu and %zu of %d keys\n", by[0], by[1], by[2], KEYS);
  /* A claimed key stays claimed: a second try by anyone loses. */
  for (uint64_t i = 0; i < KEYS; i += 997) assert_false(claim_table_take(mine, base + i, true));
  munmap(won, 3 * KEYS);
  claim_table_free(mine);
}

/* A slot holds the last key claimed in it; keys only grow. A peer never claims a key whose
 * slot a later key has taken (that attempt is long over, and its claim is not undone), while
 * the owner runs its own attempt whatever the slot says, unless a peer claimed exactly it. */
static void test_stale_slots(void **state) {
  (void)state;
  claim_table *t;
  assert_ok(claim_table_create(&t));
  const uint64_t slots = (uint64_t)1 << 20, key = 12345;
  assert_true(claim_table_take(t, key + slots, true)); /* a later key in key's slot */
  assert_false(claim_table_take(t, key, false));
  assert_true(claim_table_take(t, key, true));
  assert_true(claim_table_take(t, key + 2 * slots, false)); /* a newer one is free */
  assert_false(claim_table_take(t, key + 2 * slots, true));
  claim_table_free(t);
}

/* What cannot be a peer's table: a process that is gone, one with no table, and a descriptor
 * with the table's name and the wrong size. Each fails with the cause and maps nothing. */
static void test_no_table(void **state) {
  (void)state;
  claim_table *t = NULL;
  assert_int_equal(claim_table_open(0x7ffffff0u, &t), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "not found"));
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) { /* a process with no claim table: exec closes the inherited one */
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  fl_status none = FL_OK;
  for (int i = 0; i < 200 && (none = claim_table_open((uint32_t)child, &t)) == FL_OK; i++) {
    claim_table_free(t); /* not exec'd yet: still this process's copy */
    t = NULL;
    usleep(10000);
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  assert_int_equal(none, FL_ENOENT);
  /* A process whose only "flint-claims" is 4 KiB (this one keeps the tables it made). */
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    for (int fd = 3; fd < 1024; fd++)
      if (fd != ready[1]) close(fd);
    int fd = memfd_create("flint-claims", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 4096) != 0 || write(ready[1], "r", 1) != 1) _exit(2);
    sleep(30);
    _exit(0);
  }
  close(ready[1]);
  char r = 0;
  assert_int_equal(read(ready[0], &r, 1), 1);
  close(ready[0]);
  fl_status wrong = claim_table_open((uint32_t)child, &t);
  char why[256];
  snprintf(why, sizeof why, "%s", fl_last_error());
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  assert_int_equal(wrong, FL_ECORRUPT);
  assert_non_null(strstr(why, "not a claim table"));
  assert_null(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_key_claimed_once),
      cmocka_unit_test(test_stale_slots),
      cmocka_unit_test(test_no_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
