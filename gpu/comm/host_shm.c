/*
 * gpu/comm/host_shm.c: the host backend's shared-memory transport between ranks on one host:
 * each rank's segment (a memfd mapping holding its doorbell and one ring from every
 * same-host peer), the byte rings on it, the spin-then-futex hand-off, and closing on abort
 * or free. The mesh sets it up (gpu/comm/host_mesh.c, shm_setup) and transfer()
 * (gpu/comm/host_transport.c) moves bytes through it; the design is in
 * gpu/comm/host_transport.h.
 *
 * Memory order: a writer copies bytes into the ring and then publishes its counter (head for
 * the sender, tail for the receiver) with a release store; the other side loads it with
 * acquire before touching the bytes. Sleeping uses the Dekker pattern: the sleeper stores
 * `waiting`, fences, re-checks its rings, then futex-waits on `seq` as it read it before;
 * the waker publishes, fences, and only when it sees `waiting` bumps `seq` and wakes. One of
 * the two always sees the other's store, so no wake-up is lost, and the fast path (the peer
 * awake) costs a fence and a load, no system call. `waiting` counts sleepers and a wake-up
 * wakes them all: a rank may wait on two threads at once (the pipeline trainer receives on
 * its thread while its sender thread sends, gpu/parallel/pipeline_transfer.c), and each
 * must see the other's progress.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "gpu/comm/host_transport.h"

#define SHM_MAGIC 0x314d4853544e4c46ull /* "FLNTSHM1" little-endian */
#define SHM_LINE 64
/* Bytes of each ring (a power of two). 256 KiB holds a whole pipelined chunk of the tree
 * and the broadcast (256 KiB), and stays in the shared L3 with a few peers. */
#define SHM_RING_BYTES (256u << 10)
/* At most this much is copied before the counter is published, so that the other side starts
 * copying out while this side still copies in (32 KiB: an L1's worth; 16, 32 and 64 KiB were
 * within the noise of this shared machine). */
#define SHM_CHUNK_BYTES (32u << 10)

/* The start of a segment: who owns it, and its doorbell on a line of its own. */
typedef struct shm_header {
  uint64_t magic, nonce;
  uint32_t owner, nlocal;
  uint64_t ring_bytes;
  _Alignas(SHM_LINE) comm_shm_bell bell;
} shm_header;

static size_t ring_stride(void) { return sizeof(comm_shm_ring) + SHM_RING_BYTES; }
static size_t segment_bytes(int nlocal) {
  return sizeof(shm_header) + (size_t)nlocal * ring_stride();
}
static comm_shm_ring *ring_at(void *seg, int index) {
  return (comm_shm_ring *)((uint8_t *)seg + sizeof(shm_header) + (size_t)index * ring_stride());
}
static uint8_t *ring_data(comm_shm_ring *r) { return (uint8_t *)r + sizeof *r; }

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  /* Not FUTEX_PRIVATE_FLAG: the word is in a mapping that other processes share. */
  return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

/* After publishing a counter: wakes the owner of `bell` if it sleeps or is about to. */
static inline void bell_ring(comm_shm_bell *bell) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&bell->waiting, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&bell->seq, 1, memory_order_seq_cst);
    (void)futex(&bell->seq, FUTEX_WAKE, INT32_MAX, NULL);
  }
}

/* ---- the rings ------------------------------------------------------------------------------ */

ssize_t comm_shm_write(comm_host *h, int peer, const void *buf, size_t n) {
  comm_shm_peer *p = &h->shm[peer];
  uint64_t cap = SHM_RING_BYTES, room = cap - (p->out_head - p->out_tail_seen);
  if (room < n && room < SHM_CHUNK_BYTES) {
    p->out_tail_seen = atomic_load_explicit(&p->out->tail, memory_order_acquire);
    room = cap - (p->out_head - p->out_tail_seen);
  }
  if (atomic_load_explicit(&p->out->closed, memory_order_relaxed)) return -1;
  if (room == 0) return 0;
  size_t k = n < room ? n : (size_t)room;
  if (k > SHM_CHUNK_BYTES) k = SHM_CHUNK_BYTES;
  size_t at = (size_t)(p->out_head & (cap - 1)), first = cap - at < k ? cap - at : k;
  memcpy(ring_data(p->out) + at, buf, first);
  if (first < k) memcpy(ring_data(p->out), (const uint8_t *)buf + first, k - first);
  p->out_head += k;
  atomic_store_explicit(&p->out->head, p->out_head, memory_order_release);
  bell_ring(p->bell);
  return (ssize_t)k;
}

ssize_t comm_shm_read(comm_host *h, int peer, void *buf, size_t n) {
  comm_shm_peer *p = &h->shm[peer];
  uint64_t cap = SHM_RING_BYTES, avail = p->in_head_seen - p->in_tail;
  if (avail < n) {
    p->in_head_seen = atomic_load_explicit(&p->in->head, memory_order_acquire);
    avail = p->in_head_seen - p->in_tail;
  }
  if (avail == 0) {
    if (!atomic_load_explicit(&p->in->closed, memory_order_acquire)) return 0;
    /* Closed: what the sender published before closing is still delivered (as TCP delivers
     * what is buffered before the FIN). */
    p->in_head_seen = atomic_load_explicit(&p->in->head, memory_order_acquire);
    avail = p->in_head_seen - p->in_tail;
    if (avail == 0) return -1;
  }
  size_t k = n < avail ? n : (size_t)avail;
  if (k > SHM_CHUNK_BYTES) k = SHM_CHUNK_BYTES;
  size_t at = (size_t)(p->in_tail & (cap - 1)), first = cap - at < k ? cap - at : k;
  memcpy(buf, ring_data(p->in) + at, first);
  if (first < k) memcpy((uint8_t *)buf + first, ring_data(p->in), k - first);
  p->in_tail += k;
  atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
  bell_ring(p->bell);
  return (ssize_t)k;
}

ssize_t comm_shm_read_reduce(comm_host *h, int peer, void *sum, comm_dtype type, size_t n) {
  comm_shm_peer *p = &h->shm[peer];
  size_t es = comm_dtype_size(type);
  uint64_t cap = SHM_RING_BYTES, avail = p->in_head_seen - p->in_tail;
  if (avail < n) {
    p->in_head_seen = atomic_load_explicit(&p->in->head, memory_order_acquire);
    avail = p->in_head_seen - p->in_tail;
  }
  size_t k = n < avail ? n : (size_t)avail;
  if (k > SHM_CHUNK_BYTES) k = SHM_CHUNK_BYTES;
  k -= k % es;
  if (k == 0) return 0;
  uint8_t *data = ring_data(p->in), *to = sum;
  for (size_t done = 0; done < k;) {
    size_t at = (size_t)((p->in_tail + done) & (cap - 1)), seg = cap - at < k - done ? cap - at : k - done;
    size_t whole = seg - seg % es;
    if (whole) comm_reduce_add_unaligned(type, to + done, data + at, whole / es);
    done += whole;
    if (whole < seg) { /* one element across the end of the ring */
      _Alignas(4) uint8_t el[4];
      memcpy(el, data + at + whole, seg - whole);
      memcpy(el + (seg - whole), data, es - (seg - whole));
      comm_reduce_add_dtype(type, to + done, el, 1);
      done += es;
    }
  }
  p->in_tail += k;
  atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
  bell_ring(p->bell);
  return (ssize_t)k;
}

bool comm_shm_writable(comm_host *h, int peer) {
  comm_shm_peer *p = &h->shm[peer];
  return atomic_load_explicit(&p->out->tail, memory_order_acquire) + SHM_RING_BYTES != p->out_head ||
         atomic_load_explicit(&p->out->closed, memory_order_acquire);
}

bool comm_shm_readable(comm_host *h, int peer) {
  comm_shm_peer *p = &h->shm[peer];
  return atomic_load_explicit(&p->in->head, memory_order_acquire) != p->in_tail ||
         atomic_load_explicit(&p->in->closed, memory_order_acquire);
}

bool comm_shm_closed(comm_host *h, int peer) {
  comm_shm_peer *p = &h->shm[peer];
  return atomic_load_explicit(&p->in->closed, memory_order_acquire) ||
         atomic_load_explicit(&p->out->closed, memory_order_acquire);
}

/* ---- sleeping ------------------------------------------------------------------------------- */

uint32_t comm_shm_wait_begin(comm_host *h) {
  uint32_t seq = atomic_load_explicit(&h->shm_bell->seq, memory_order_acquire);
  atomic_fetch_add_explicit(&h->shm_bell->waiting, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  return seq;
}

bool comm_shm_sleep(comm_host *h, uint32_t seq, uint32_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  long r = futex(&h->shm_bell->seq, FUTEX_WAIT, seq, &ts);
  __atomic_fetch_add(&h->shm_sleeps, 1, __ATOMIC_RELAXED);
  return !(r < 0 && errno == ETIMEDOUT);
}

void comm_shm_wait_end(comm_host *h) {
  atomic_fetch_sub_explicit(&h->shm_bell->waiting, 1, memory_order_relaxed);
}

bool comm_shm_same_cpu(comm_host *h, int peer_a, int peer_b) {
  int cpu = sched_getcpu();
  if (cpu < 0) return false;
  uint32_t me = (uint32_t)cpu + 1;
  if (atomic_load_explicit(&h->shm_bell->cpu, memory_order_relaxed) != me)
    atomic_store_explicit(&h->shm_bell->cpu, me, memory_order_relaxed);
  return (peer_a >= 0 && atomic_load_explicit(&h->shm[peer_a].bell->cpu, memory_order_relaxed) == me) ||
         (peer_b >= 0 && atomic_load_explicit(&h->shm[peer_b].bell->cpu, memory_order_relaxed) == me);
}

bool comm_host_shm_peer_sleeping(const comm_host *h, int peer) {
  if (!h->shm || !h->shm[peer].out) return false;
  return atomic_load(&h->shm[peer].bell->waiting) != 0;
}

/* ---- setup and teardown ------------------------------------------------------------------- */

fl_status comm_host_shm_create(comm_host *h, int *out_fd, uint64_t *out_bytes, uint64_t *out_nonce) {
  *out_fd = -1;
  int nlocal = 0;
  for (int r = 0; r < h->size; r++) nlocal += h->host_of[r] == h->host_of[h->rank];
  h->shm = common_calloc((size_t)h->size, sizeof *h->shm);
  h->shm_index = common_calloc((size_t)h->size, sizeof *h->shm_index);
  if (!h->shm || !h->shm_index) return FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", h->size);
  for (int r = 0, i = 0; r < h->size; r++)
    h->shm_index[r] = h->host_of[r] == h->host_of[h->rank] ? i++ : -1;
  size_t bytes = segment_bytes(nlocal);
  /* A memfd, not shm_open: nothing named is left behind when a rank dies during setup, and
   * no /dev/shm size limit (64 MiB in a default container) turns a touch into SIGBUS. */
  int fd = memfd_create("flint-comm-shm", MFD_CLOEXEC);
  if (fd < 0) return FL_OK; /* no memfd: TCP */
  void *seg = MAP_FAILED;
  if (ftruncate(fd, (off_t)bytes) == 0)
    seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (seg == MAP_FAILED) {
    close(fd);
    return FL_OK;
  }
  shm_header *hd = seg;
  hd->magic = SHM_MAGIC;
  hd->nonce = common_random_u64();
  hd->owner = (uint32_t)h->rank;
  hd->nlocal = (uint32_t)nlocal;
  hd->ring_bytes = SHM_RING_BYTES;
  h->shm_seg = seg;
  h->shm_seg_bytes = bytes;
  h->shm_bell = &hd->bell;
  *out_fd = fd;
  *out_bytes = bytes;
  *out_nonce = hd->nonce;
  return FL_OK;
}

/* Maps the segment that rank `peer` offered (its pid, its memfd's number, the segment's
 * size and nonce): opened through /proc/PID/fd/N, which the kernel allows only to a process
 * that may inspect the peer's (same user; the same check as reading its file descriptors).
 * The nonce, read back from the mapping, proves it is the peer's segment and not the file
 * of another process that has the same pid in this rank's pid namespace. */
bool comm_host_shm_attach(comm_host *h, int peer, const uint64_t offer[4]) {
  uint64_t pid = offer[0], fd = offer[1], bytes = offer[2], nonce = offer[3];
  if (!h->shm_seg || fd > INT32_MAX || pid == 0 || pid > INT32_MAX || bytes != h->shm_seg_bytes)
    return false;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
  int pfd = open(path, O_RDWR | O_CLOEXEC);
  if (pfd < 0) return false;
  struct stat sb;
  void *seg = MAP_FAILED;
  if (fstat(pfd, &sb) == 0 && (uint64_t)sb.st_size == bytes)
    seg = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
  close(pfd);
  if (seg == MAP_FAILED) return false;
  shm_header *hd = seg;
  if (hd->magic != SHM_MAGIC || hd->nonce != nonce || hd->owner != (uint32_t)peer ||
      hd->ring_bytes != SHM_RING_BYTES) {
    munmap(seg, (size_t)bytes);
    return false;
  }
  comm_shm_peer *p = &h->shm[peer];
  p->seg = seg;
  p->bell = &hd->bell;
  p->out = ring_at(seg, h->shm_index[h->rank]);
  p->in = ring_at(h->shm_seg, h->shm_index[peer]);
  return true;
}

/* Ends the setup: the pairs in use[] (both ends mapped the other's segment) keep shared
 * memory, every other peer's mapping goes, and so does this rank's when no pair uses it. */
void comm_host_shm_finish(comm_host *h, const uint8_t *use) {
  int n = 0;
  for (int r = 0; h->shm && r < h->size; r++) {
    comm_shm_peer *p = &h->shm[r];
    if (!p->seg) continue;
    if (use[r]) {
      n++;
      continue;
    }
    munmap(p->seg, h->shm_seg_bytes);
    memset(p, 0, sizeof *p);
  }
  h->shm_peers = n;
  if (n == 0) comm_host_shm_free(h);
}

void comm_host_shm_close(comm_host *h) {
  for (int r = 0; h->shm && r < h->size; r++) {
    comm_shm_peer *p = &h->shm[r];
    if (!p->seg) continue;
    atomic_store_explicit(&p->out->closed, 1, memory_order_release);
    atomic_store_explicit(&p->in->closed, 1, memory_order_release);
    /* Always wake: the peer may sleep on either ring of the pair. */
    atomic_fetch_add_explicit(&p->bell->seq, 1, memory_order_seq_cst);
    (void)futex(&p->bell->seq, FUTEX_WAKE, INT32_MAX, NULL);
  }
}

void comm_host_shm_free(comm_host *h) {
  comm_host_shm_close(h);
  for (int r = 0; h->shm && r < h->size; r++)
    if (h->shm[r].seg) munmap(h->shm[r].seg, h->shm_seg_bytes);
  if (h->shm_seg) munmap(h->shm_seg, h->shm_seg_bytes);
  common_free(h->shm);
  common_free(h->shm_index);
  h->shm = NULL;
  h->shm_index = NULL;
  h->shm_seg = NULL;
  h->shm_bell = NULL;
  h->shm_peers = 0;
}
