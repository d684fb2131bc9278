/*
 * shared_block.c: cached partitions that other executors on the same host read in place
 * (see storage.h). A block is a sealed memfd: a 64-byte header, then the batch's bytes.
 * Its owner keeps the descriptor open, so a reader finds it among /proc/PID/fd by its name,
 * opens it there and maps it read-only. Seals (no write, no shrink, no grow) make the bytes
 * immutable for as long as anyone maps them, and a mapping outlives the owner's eviction or
 * crash; when the last process lets go, the kernel frees the memory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "executor/storage/storage.h"

#define SHARED_MAGIC "FLNTSHB1"
#define SHARED_HEADER 64
#define SHARED_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

typedef struct shared_header {
  char magic[8];
  uint64_t rdd_id;
  uint32_t partition, reserved;
  uint64_t count, len;
} shared_header;
_Static_assert(sizeof(shared_header) <= SHARED_HEADER, "the header fits its slot");

struct shared_block {
  int fd;      /* the owner's descriptor (readers close theirs once mapped): -1 */
  void *map;   /* PROT_READ, SHARED_HEADER + batch.buf.len bytes */
  size_t size;
  rdd_batch batch; /* a view into map: never freed by itself */
};

static void memfd_name(rdd_block_key key, char *buf, size_t len) {
  snprintf(buf, len, "flint-block-%llx-%x", (unsigned long long)key.rdd_id, key.partition);
}

/* Maps fd read-only and checks that it holds block `key` (and, for a reader, that its records
 * are well-formed); takes nothing on failure. */
static fl_status map_checked(int fd, rdd_block_key key, const char *what, bool check_records, shared_block *sb) {
  struct stat st;
  if (fstat(fd, &st) != 0) return FL_ERR(FL_EIO, "%s: %s", what, strerror(errno));
  if (st.st_size < SHARED_HEADER) return FL_ERR(FL_ECORRUPT, "%s: %lld bytes, less than a header", what, (long long)st.st_size);
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_WRITE | F_SEAL_SHRINK)) != (F_SEAL_WRITE | F_SEAL_SHRINK))
    return FL_ERR(FL_ECORRUPT, "%s is not sealed against writes and shrinking", what);
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return FL_ERR(FL_ENOMEM, "cannot map %s: %s", what, strerror(errno));
  shared_header h;
  memcpy(&h, map, sizeof h);
  fl_status s = FL_OK;
  if (memcmp(h.magic, SHARED_MAGIC, sizeof h.magic) != 0 || h.rdd_id != key.rdd_id || h.partition != key.partition)
    s = FL_ERR(FL_ECORRUPT, "%s does not hold block rdd_%llu_%u", what, (unsigned long long)key.rdd_id,
               key.partition);
  else if (h.len != (uint64_t)st.st_size - SHARED_HEADER)
    s = FL_ERR(FL_ECORRUPT, "%s: header says %llu bytes, the file has %llu", what, (unsigned long long)h.len,
               (unsigned long long)(st.st_size - SHARED_HEADER));
  else if (check_records && !rdd_batch_valid((const uint8_t *)map + SHARED_HEADER, h.len, h.count))
    s = FL_ERR(FL_ECORRUPT, "%s: its %llu records are malformed", what, (unsigned long long)h.count);
  if (s != FL_OK) {
    munmap(map, (size_t)st.st_size);
    return s;
  }
  sb->map = map;
  sb->size = (size_t)st.st_size;
  sb->batch.buf = (fl_buf){.data = (uint8_t *)map + SHARED_HEADER, .len = h.len, .cap = h.len};
  sb->batch.count = h.count;
  return FL_OK;
}

fl_status shared_block_create(rdd_block_key key, const rdd_batch *batch, shared_block **out) {
  char name[64];
  memfd_name(key, name, sizeof name);
  shared_block *sb = common_calloc(1, sizeof *sb);
  if (!sb) return FL_ERR(FL_ENOMEM, "cannot allocate a shared block");
  sb->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (sb->fd < 0) {
    common_free(sb);
    return FL_ERR(errno == EMFILE || errno == ENFILE ? FL_ELIMIT : FL_EIO, "cannot create memfd %s: %s", name,
                  strerror(errno));
  }
  uint8_t head[SHARED_HEADER] = {0};
  shared_header h = {.rdd_id = key.rdd_id, .partition = key.partition, .count = batch->count, .len = batch->buf.len};
  memcpy(h.magic, SHARED_MAGIC, sizeof h.magic);
  memcpy(head, &h, sizeof h);
  /* write() rather than a writable mapping: F_SEAL_WRITE refuses while one exists. */
  fl_status s = common_write_all(sb->fd, head, sizeof head, name);
  if (s == FL_OK && batch->buf.len) s = common_write_all(sb->fd, batch->buf.data, batch->buf.len, name);
  if (s == FL_OK && fcntl(sb->fd, F_ADD_SEALS, SHARED_SEALS) != 0)
    s = FL_ERR(FL_EIO, "cannot seal %s: %s", name, strerror(errno));
  if (s == FL_OK) s = map_checked(sb->fd, key, name, false, sb);
  if (s != FL_OK) {
    close(sb->fd);
    common_free(sb);
    return s;
  }
  *out = sb;
  return FL_OK;
}

fl_status shared_fd_open(uint32_t pid, const char *name, int flags, const char *what, int *fd) {
  char dir[64], want[96];
  int wlen = snprintf(want, sizeof want, "/memfd:%s (deleted)", name);
  if (wlen <= 0 || (size_t)wlen >= sizeof want) return FL_ERR(FL_EINVAL, "%s: a name too long", what);
  snprintf(dir, sizeof dir, "/proc/%u/fd", pid);
  DIR *d = opendir(dir);
  int found = -1;
  struct dirent *e;
  while (d && found < 0 && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char link[128];
    ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link);
    if (n == wlen && memcmp(link, want, (size_t)n) == 0) found = atoi(e->d_name);
  }
  if (d) closedir(d);
  if (found < 0) return FL_ERR(FL_ENOENT, "%s: not found among its descriptors", what);
  char path[64];
  snprintf(path, sizeof path, "/proc/%u/fd/%d", pid, found);
  *fd = open(path, flags | O_CLOEXEC);
  if (*fd < 0) return FL_ERR(FL_ENOENT, "%s: cannot open %s: %s", what, path, strerror(errno));
  return FL_OK;
}

fl_status shared_block_open(uint32_t pid, rdd_block_key key, shared_block **out) {
  char what[96];
  snprintf(what, sizeof what, "block rdd_%llu_%u of process %u", (unsigned long long)key.rdd_id, key.partition, pid);
  char name[64];
  memfd_name(key, name, sizeof name);
  int fd;
  fl_status opened = shared_fd_open(pid, name, O_RDONLY, what, &fd);
  if (opened != FL_OK) return opened;
  shared_block *sb = common_calloc(1, sizeof *sb);
  fl_status s = sb ? map_checked(fd, key, what, true, sb) : FL_ERR(FL_ENOMEM, "cannot allocate a shared block");
  close(fd); /* the mapping keeps the memory */
  if (s != FL_OK) {
    common_free(sb);
    return s;
  }
  sb->fd = -1;
  *out = sb;
  return FL_OK;
}

void shared_block_node(char out[SHARED_NODE_MAX]) {
  out[0] = 0;
  char boot[40] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re"); /* /proc files report no size */
  if (!f) return;
  if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
  fclose(f);
  boot[strcspn(boot, " \n")] = 0;
  /* Pids name descriptors under /proc only within one pid namespace: containers on one host
   * share the boot id, not the namespace. */
  struct stat ns;
  if (boot[0] && stat("/proc/self/ns/pid", &ns) == 0)
    snprintf(out, SHARED_NODE_MAX, "%s/%llu", boot, (unsigned long long)ns.st_ino);
}

const rdd_batch *shared_block_batch(const shared_block *sb) { return &sb->batch; }

uint64_t shared_block_bytes(const shared_block *sb) { return sb->size; }

void shared_block_free(shared_block *sb) {
  if (!sb) return;
  munmap(sb->map, sb->size);
  if (sb->fd >= 0) close(sb->fd);
  common_free(sb);
}
