/*
 * claim_table.c: who runs a node-shared task (see storage.h). A table is a memfd of
 * CLAIM_SLOTS 64-bit slots, created by its executor and mapped read-write by the node's other
 * executors, found as shared blocks are: by name among /proc/PID/fd. A slot holds the key of
 * the last attempt claimed in it; the driver's keys only grow, so a slot with a smaller key
 * is free for a larger one. Pages are touched as slots are; as keys grow, the owner punches
 * out the pages of slots far behind the newest key (claim_table_trim), so the table costs
 * memory for the recent keys only, not for every key a long-lived executor saw.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "executor/storage/storage.h"

#define CLAIM_SLOTS ((size_t)1 << 20)
#define CLAIM_BYTES (CLAIM_SLOTS * sizeof(uint64_t))
#define CLAIM_NAME "flint-claims"

/* Slots of keys this far behind the newest are of attempts long over: an executor queues at
 * most 16 tasks a core, launched as keys grow. They are punched out a chunk at a time, so a
 * table holds at most about 576 KiB. Should one such attempt still be queued, its owner
 * claims it all the same (a zero slot is free); a peer holding an offer of one that already
 * ran could run it again, and the driver, which has its end, ignores the second. */
#define CLAIM_TRIM_BEHIND ((uint64_t)1 << 16)
#define CLAIM_TRIM_CHUNK ((uint64_t)1 << 13) /* slots: 64 KiB */

struct claim_table {
  _Atomic uint64_t *slots;
  int fd; /* the owner's descriptor; -1 in a peer */
  _Atomic uint64_t trimmed_to; /* keys below it (in chunks since the last clear) are punched */
};

static fl_status map_table(int fd, const char *what, claim_table **out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return FL_ERR(FL_EIO, "%s: %s", what, strerror(errno));
  if ((size_t)st.st_size != CLAIM_BYTES)
    return FL_ERR(FL_ECORRUPT, "%s: %lld bytes, not a claim table's %zu", what, (long long)st.st_size, CLAIM_BYTES);
  void *map = mmap(NULL, CLAIM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return FL_ERR(FL_ENOMEM, "cannot map %s: %s", what, strerror(errno));
  claim_table *t = common_calloc(1, sizeof *t);
  if (!t) {
    munmap(map, CLAIM_BYTES);
    return FL_ERR(FL_ENOMEM, "cannot allocate a claim table");
  }
  t->slots = map;
  t->fd = -1;
  *out = t;
  return FL_OK;
}

fl_status claim_table_create(claim_table **out) {
  /* Kept open (not CLOEXEC-closed by anyone): peers find it under /proc/PID/fd. */
  int fd = memfd_create(CLAIM_NAME, MFD_CLOEXEC);
  if (fd < 0) return FL_ERR(FL_EIO, "cannot create memfd %s: %s", CLAIM_NAME, strerror(errno));
  fl_status s = ftruncate(fd, (off_t)CLAIM_BYTES) == 0 ? map_table(fd, CLAIM_NAME, out)
                                                        : FL_ERR(FL_EIO, "cannot size %s: %s", CLAIM_NAME, strerror(errno));
  if (s != FL_OK) close(fd);
  else (*out)->fd = fd; /* open for the table's life, for peers to find */
  return s;
}

void claim_table_trim(claim_table *t, uint64_t newest, uint64_t oldest) {
  if (t->fd < 0 || newest < CLAIM_TRIM_BEHIND) return;
  uint64_t floor = newest - CLAIM_TRIM_BEHIND;
  if (oldest && oldest < floor) floor = oldest; /* an attempt still queued or running here */
  floor &= ~(CLAIM_TRIM_CHUNK - 1);
  /* Slots of keys in [floor, newest] are live: a punch reaches at most the rest of the ring. */
  if (newest - floor + CLAIM_TRIM_CHUNK >= CLAIM_SLOTS) return;
  uint64_t span = CLAIM_SLOTS - (newest - floor) - CLAIM_TRIM_CHUNK;
  uint64_t from = atomic_load(&t->trimmed_to);
  if (from >= floor || !atomic_compare_exchange_strong(&t->trimmed_to, &from, floor)) return;
  if (floor - from > span) from = floor - span; /* the first trim, or a jump */
  for (uint64_t k = from & ~(CLAIM_TRIM_CHUNK - 1); k < floor; k += CLAIM_TRIM_CHUNK) {
    off_t at = (off_t)((k & (CLAIM_SLOTS - 1)) * sizeof(uint64_t));
    fallocate(t->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, (off_t)(CLAIM_TRIM_CHUNK * sizeof(uint64_t)));
  }
}

void claim_table_clear(claim_table *t) {
  atomic_store(&t->trimmed_to, 0);
  /* Punching the pages out zeroes them for every mapping without touching them here. */
  if (t->fd < 0 || fallocate(t->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)CLAIM_BYTES) != 0)
    for (size_t i = 0; i < CLAIM_SLOTS; i++) atomic_store_explicit(&t->slots[i], 0, memory_order_relaxed);
}

fl_status claim_table_open(uint32_t pid, claim_table **out) {
  char what[64];
  snprintf(what, sizeof what, "the claim table of process %u", pid);
  int fd;
  fl_status opened = shared_fd_open(pid, CLAIM_NAME, O_RDWR, what, &fd);
  if (opened != FL_OK) return opened;
  fl_status s = map_table(fd, what, out);
  close(fd); /* the mapping keeps the memory */
  return s;
}

bool claim_table_take(claim_table *t, uint64_t key, bool owner) {
  _Atomic uint64_t *slot = &t->slots[key & (CLAIM_SLOTS - 1)];
  uint64_t seen = atomic_load_explicit(slot, memory_order_acquire);
  for (;;) {
    if (seen == key || (!owner && seen > key)) return false;
    if (atomic_compare_exchange_weak_explicit(slot, &seen, key, memory_order_acq_rel, memory_order_acquire))
      return true;
  }
}

void claim_table_free(claim_table *t) {
  if (!t) return;
  munmap((void *)t->slots, CLAIM_BYTES);
  if (t->fd >= 0) close(t->fd);
  common_free(t);
}
