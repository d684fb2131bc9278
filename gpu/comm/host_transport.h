/*
 * gpu/comm/host_transport.h: the host backend's transport, private to gpu/comm/: the mesh of
 * TCP connections between the ranks (gpu/comm/host_mesh.c), shared memory between ranks on
 * one host (gpu/comm/host_shm.c) and the transfers over them (gpu/comm/host_transport.c), on which the algorithms (gpu/comm/host_algorithms.h) and the
 * backend's slots (gpu/comm/host.c) are written. Blocking send and receive of bytes to one
 * peer, and a full-duplex exchange that sends to one peer while it receives from another (what
 * a ring step needs).
 *
 * Design: every pair of ranks has a channel, one byte stream each way: the pair's
 * shared-memory rings when both ranks are on one host (below), else its TCP socket,
 * non-blocking once the mesh is up. One loop, transfer() in gpu/comm/host_transport.c, moves
 * the bytes of every call, trying each half in turn; the full-duplex exchange is what lets
 * every rank of a ring send to its next while it receives from its previous. When nothing
 * moves it spins, then sleeps: in poll() on the sockets, or on its doorbell for rings. Every
 * wait is bounded: no byte moving for the operation timeout (FLINT_COMM_TIMEOUT_MS, default
 * 300 s) is FL_ETIMEDOUT naming the peer. A peer that closes is FL_EPEER, a socket error
 * FL_ENET.
 *
 * Shared memory between ranks on one host (gpu/comm/host_shm.c; docs/collectives.md has the
 * details and figures). Each rank owns a segment (a memfd that its same-host peers map
 * through /proc/PID/fd, checked by a nonce; the mesh's shm_setup) with its doorbell (a futex
 * word and a waiting flag) and one ring of bytes from each same-host peer: head and tail
 * counters on cache lines of their own, published with release stores and read with acquire
 * loads. A writer copies at most a chunk, publishes, and wakes the owner only when its
 * waiting flag is set, so the fast path has no system call. A waiting rank spins (pause,
 * then sched_yield every 64 polls until FLINT_SPIN_US), then sleeps on its doorbell in
 * slices, checking between slices whether a peer's socket hung up (a process that died
 * closes no ring). Abort and free mark the pair's rings closed and wake the peers; a reader
 * drains what was sent before failing with FL_EPEER. Pairs where any step of the setup
 * fails, and FLINT_COMM_SHM=0, stay on TCP.
 *
 * Single copy between ranks on one host. Copying through a ring or over loopback TCP costs
 * two copies a byte, and past the caches that is what bounds a collective. So when the mesh
 * is up, each rank challenges every peer to show it a random
 * nonce through process_vm_readv(2) (which needs the same host and pid namespace, and
 * ptrace permission: Linux's cross-memory attach, as MPI libraries use it; see
 * single_copy_probe), and a pair where both directions work moves ring steps of
 * FLINT_COMM_SINGLE_COPY_MIN bytes or more (default 128 KiB; the pair takes the larger of
 * its two settings) by a single copy: the sender puts a 16-byte descriptor (address,
 * length) on the channel, the receiver reads the sender's buffer straight into its own (or
 * a piece at a time into the reduction), then answers with a 1-byte ack, after which the
 * sender may reuse the buffer. Everything else, and every pair that failed the probe,
 * stays on the channel. FLINT_COMM_SINGLE_COPY=0 turns it off. Only ring steps use it
 * (comm_host_ring_step): both ends of a step run the same call, so the receiver knows to
 * expect a descriptor, and neither end waits on an ack the other cannot send.
 *
 * Threading: one thread at a time per communicator (its rank's thread), except that one
 * thread may send (comm_host_send) while another receives (comm_host_recv), as the pipeline
 * trainer's sender thread does: the two halves touch separate sockets' directions and
 * separate rings, and sleepers on the rank's doorbell are counted and all woken.
 */
#ifndef FLINT_GPU_COMM_HOST_TRANSPORT_H
#define FLINT_GPU_COMM_HOST_TRANSPORT_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpu/comm/comm.h"

typedef struct comm_host comm_host;

/* Shared memory (gpu/comm/host_shm.c). A doorbell: the futex word that peers bump when they
 * make progress possible for its owner, and whether the owner sleeps (or is about to). */
typedef struct comm_shm_bell {
  _Atomic uint32_t seq;
  _Atomic uint32_t waiting; /* threads of the owner that sleep or are about to */
  _Atomic uint32_t cpu; /* the CPU the owner last started waiting on (+1; 0: unknown) */
} comm_shm_bell;

/* One direction of a pair: a ring of bytes, its counters on lines of their own (head written
 * by the sender, tail by the receiver, each only ever grows), then the bytes. */
typedef struct comm_shm_ring {
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) _Atomic uint32_t closed; /* set by either end on abort or free */
} comm_shm_ring;

/* This rank's view of a same-host peer: the ring into the peer's segment (out), the peer's
 * ring in this rank's segment (in), the peer's doorbell, and local copies of the counters. */
typedef struct comm_shm_peer {
  void *seg; /* the peer's segment, mapped here; NULL: the pair talks TCP */
  comm_shm_ring *out, *in;
  comm_shm_bell *bell;
  uint64_t out_head, out_tail_seen, in_tail, in_head_seen;
} comm_shm_peer;

struct comm_host {
  int rank, size;
  int *fds; /* fds[peer]; fds[rank] is -1 */
  uint32_t op_timeout_ms;
  uint32_t connect_timeout_ms;
  char host[64]; /* where this rank listens (sub-groups listen there too) */
  void *scratch[2];
  size_t scratch_cap[2];
  /* Pinned staging buffers for cuda tensors, owned by stage_dev. */
  fl_device *stage_dev[2];
  void *stage[2];
  size_t stage_cap[2];
  /* Single copy, per peer: its pid, and the least bytes a ring step moves by a single copy
   * with it (0: never, its channel only). */
  pid_t *peer_pid;
  size_t *single_copy_min;
  size_t *single_copy_max; /* and the most (SIZE_MAX: no limit) */
  /* Topology: host_of[r] is the host of rank r, numbered 0..nhosts-1 in the order of each
   * host's lowest rank. Ranks share a host when they share the kernel (boot id) and the
   * network namespace, so namespaces stand for hosts in tests (host_topology). */
  int *host_of;
  int nhosts;
  /* Shared memory: shm[peer] (NULL when no pair uses it); shm_index[r] is rank r's index
   * among the ranks of this host (-1 elsewhere), which is where its ring lies in each
   * segment; this rank's own segment and doorbell; how many pairs use it; how many times
   * this rank slept on its doorbell (tests). */
  comm_shm_peer *shm;
  int *shm_index;
  void *shm_seg;
  size_t shm_seg_bytes;
  comm_shm_bell *shm_bell;
  int shm_peers;
  uint64_t shm_sleeps;
};

/* ---- the mesh (gpu/comm/host_mesh.c) ---------------------------------------------------- */

/* Joins `size` ranks into a mesh: this rank, listening on ep (borrowed: the caller still
 * destroys it), connects to the lower ranks at addresses[] and accepts the higher ones, then
 * probes which peers single copy reaches, all within timeout_ms (0: 30 s). Collective over
 * the ranks; blocks. On failure nothing is left to free. */
fl_status comm_host_connect(fl_comm_endpoint *ep, int rank, int size, const char *const *addresses,
                            uint32_t timeout_ms, comm_host **out);
/* Closes the connections and frees everything the transport holds (staging buffers too).
 * NULL does nothing. */
void comm_host_free(comm_host *h);

/* ---- transfers (gpu/comm/host_transport.c) ------------------------------------------------ */

/* Blocking transfers of exactly `bytes` to/from `peer`. FL_EPEER when the peer closed,
 * FL_ENET on a socket error, FL_ETIMEDOUT when no byte moved for the operation timeout;
 * each message names the peer rank. */
fl_status comm_host_send(comm_host *h, int peer, const void *buf, size_t bytes);
fl_status comm_host_recv(comm_host *h, int peer, void *buf, size_t bytes);
/* Sends sbytes to send_peer while receiving rbytes from recv_peer, without deadlock even
 * when both peers do the same to us (the two peers may be the same rank). */
fl_status comm_host_exchange(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                             int recv_peer, void *rbuf, size_t rbytes);
/* As exchange, but the rcount floats received are added into `sum`, a piece of
 * piece_floats at a time through `tmp` (piece_floats long) as soon as the piece is in, while
 * the send goes on: the reduction overlaps the transfer and reads the data while in cache. */
fl_status comm_host_exchange_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                    int recv_peer, float *sum, size_t rcount, float *tmp,
                                    size_t piece_floats);
/* A ring step: exchange (or exchange_reduce) where every rank of the step calls the same
 * function, sending to the rank that receives from it by this function too. Only then may
 * a half move by a single copy (the receiver reads the sender's buffer, see above):
 * the receiving end must expect the sender's descriptor instead of the data. */
fl_status comm_host_ring_step(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                              int recv_peer, void *rbuf, size_t rbytes);
/* rcount elements of `type` are added into sum, piece_elems at a time through tmp. */
fl_status comm_host_ring_step_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                     int recv_peer, void *sum, comm_dtype type, size_t rcount,
                                     void *tmp, size_t piece_elems);
/* A scratch buffer of at least `bytes` owned by the transport (grown on demand, kept for
 * the communicator's life). Slot 0 and 1 are separate buffers. */
fl_status comm_host_scratch(comm_host *h, int slot, size_t bytes, void **out);

/* ---- shared memory (gpu/comm/host_shm.c) ------------------------------------------------ */

/* Whether bytes to and from `peer` go through shared memory. */
static inline bool comm_host_is_shm(const comm_host *h, int peer) {
  return h->shm && h->shm[peer].seg;
}
/* Non-blocking: copies up to n bytes into the ring to `peer` (out of the ring from `peer`)
 * and publishes them, waking the peer if it sleeps. Returns the bytes moved, 0 when the ring
 * is full (empty), -1 when the pair was closed (a read first drains what was sent). */
ssize_t comm_shm_write(comm_host *h, int peer, const void *buf, size_t n);
ssize_t comm_shm_read(comm_host *h, int peer, void *buf, size_t n);
/* As comm_shm_read, but adds whole elements of `type` from the ring into sum (at most n
 * bytes) instead of copying them out; 0 when less than an element is there (or closed: a
 * plain read then says which). */
ssize_t comm_shm_read_reduce(comm_host *h, int peer, void *sum, comm_dtype type, size_t n);
/* Whether a write (read) would move a byte or fail now; and whether the pair was closed. */
bool comm_shm_writable(comm_host *h, int peer);
bool comm_shm_readable(comm_host *h, int peer);
bool comm_shm_closed(comm_host *h, int peer);
/* Sleeping on this rank's doorbell: begin (returns the word to sleep on), re-check the rings,
 * sleep at most ms unless a peer rang since begin (false when the time ran out), end. */
uint32_t comm_shm_wait_begin(comm_host *h);
bool comm_shm_sleep(comm_host *h, uint32_t seq, uint32_t ms);
void comm_shm_wait_end(comm_host *h);
/* Notes the CPU this rank waits on and says whether a peer it waits for (-1: none) last
 * waited on the same one: spinning there only delays that peer, so the waiter yields at once. */
bool comm_shm_same_cpu(comm_host *h, int peer_a, int peer_b);
/* Whether rank `peer` sleeps on its doorbell now (tests). */
bool comm_host_shm_peer_sleeping(const comm_host *h, int peer);
/* Setup (the mesh's shm_setup): this rank's segment as a memfd (*fd -1 when none could be
 * made: its pairs then talk TCP); mapping a peer's offer {pid, fd, bytes, nonce}, false when
 * it cannot be; keeping the pairs in use[]. Close marks every pair closed and wakes the peers
 * (abort); free closes and unmaps. */
fl_status comm_host_shm_create(comm_host *h, int *fd, uint64_t *bytes, uint64_t *nonce);
bool comm_host_shm_attach(comm_host *h, int peer, const uint64_t offer[4]);
void comm_host_shm_finish(comm_host *h, const uint8_t *use);
void comm_host_shm_close(comm_host *h);
void comm_host_shm_free(comm_host *h);

/* ---- reduction kernels (gpu/comm/reduce.c), vectorized ------------------------------------- */
void comm_reduce_add(float *restrict dst, const float *restrict src, size_t n);
void comm_reduce_scale(float *dst, float a, size_t n);
/* dst += src over n elements of `type` (16-bit ones summed in fp32, rounded back). */
void comm_reduce_add_dtype(comm_dtype type, void *dst, const void *src, size_t n);
/* The same where src may be misaligned for its type. */
void comm_reduce_add_unaligned(comm_dtype type, void *dst, const uint8_t *src, size_t n);
size_t comm_dtype_size(comm_dtype type);

/* Reads `bytes` at `remote` in process `pid` into `local` (process_vm_readv); -1 with errno. */
int comm_host_read_peer(pid_t pid, void *local, uint64_t remote, size_t bytes);
/* Milliseconds left until deadline_ns (0 once it passed), and poll() with EINTR retried
 * against the same deadline (>0, 0 on timeout, -1). */
int comm_host_remaining_ms(uint64_t deadline_ns);
int comm_host_poll_until(struct pollfd *p, nfds_t n, uint64_t deadline_ns);

#endif /* FLINT_GPU_COMM_HOST_TRANSPORT_H */
