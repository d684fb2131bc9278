/*
 * gpu/comm/host_transport.c: the host backend's transfers over the mesh: one loop (transfer)
 * that sends to one peer while it receives from another, with or without a single copy, and
 * reduces what it receives as it arrives; the scratch buffers; the reduction kernels. The
 * design is in gpu/comm/host_transport.h.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/common.h"
#include "gpu/comm/host_transport.h"

/* ---- waiting ----------------------------------------------------------------------------- */

int comm_host_remaining_ms(uint64_t deadline_ns) {
  uint64_t now = common_now_ns();
  if (now >= deadline_ns) return 0;
  uint64_t ms = (deadline_ns - now + 999999) / 1000000;
  return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* poll() with EINTR retried against the same deadline. Returns >0, 0 on timeout, -1. */
int comm_host_poll_until(struct pollfd *p, nfds_t n, uint64_t deadline_ns) {
  for (;;) {
    int r = poll(p, n, comm_host_remaining_ms(deadline_ns));
    if (r >= 0 || errno != EINTR) return r;
  }
}

/* Reads `bytes` at `remote` in process `pid` into `local`; -1 with errno. */
int comm_host_read_peer(pid_t pid, void *local, uint64_t remote, size_t bytes) {
  uint8_t *at = local;
  while (bytes > 0) {
    struct iovec l = {at, bytes}, r = {(void *)(uintptr_t)remote, bytes};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0) {
      if (got == 0) errno = EFAULT;
      return -1;
    }
    at += got, remote += (uint64_t)got, bytes -= (size_t)got;
  }
  return 0;
}


/* ---- the transport --------------------------------------------------------------------- */

static fl_status io_error(comm_host *h, int peer, ssize_t r, int err, const char *what) {
  if (err == ESHUTDOWN)
    return fl_set_error(FL_EPEER, "rank %d: rank %d closed its shared-memory rings during a %s "
                        "(it left or gave up)", h->rank, peer, what);
  if (r == 0)
    return fl_set_error(FL_EPEER, "rank %d: rank %d closed the connection during a %s", h->rank,
                        peer, what);
  if (err == ECONNRESET || err == EPIPE)
    return fl_set_error(FL_EPEER, "rank %d: rank %d reset the connection during a %s (%s)",
                        h->rank, peer, what, strerror(err));
  return fl_set_error(FL_ENET, "rank %d: %s with rank %d failed: %s", h->rank, what, peer, strerror(err));
}

static fl_status check_fd(comm_host *h, int peer) {
  if (h->fds[peer] < 0)
    return fl_set_error(FL_EPEER, "rank %d: the connection to rank %d was closed", h->rank, peer);
  return FL_OK;
}

/* Reads the sender's buffer described by desc ({address, length}) from recv_peer's process:
 * into rbuf, or with `sum` a piece at a time through rbuf (piece_bytes long) into sum. */
static fl_status single_copy_read(comm_host *h, int recv_peer, const uint64_t desc[2], void *rbuf,
                                  size_t rbytes, uint8_t *sum, comm_dtype type, size_t piece_bytes) {
  if (desc[1] != rbytes)
    return fl_set_error(FL_EPROTO, "rank %d: rank %d offered %llu bytes where the ring step expects %zu",
                        h->rank, recv_peer, (unsigned long long)desc[1], rbytes);
  pid_t pid = h->peer_pid[recv_peer];
  uint64_t at = desc[0];
  size_t step = sum ? piece_bytes : rbytes;
  for (size_t done = 0; done < rbytes; done += step) {
    size_t n = rbytes - done < step ? rbytes - done : step;
    uint8_t *to = sum ? rbuf : (uint8_t *)rbuf + done;
    if (comm_host_read_peer(pid, to, at + done, n) != 0)
      return fl_set_error(errno == ESRCH ? FL_EPEER : errno == EFAULT ? FL_EPROTO : FL_ENET,
                          "rank %d: reading rank %d's buffer (single copy, pid %d) failed: %s", h->rank,
                          recv_peer, (int)pid, strerror(errno));
    if (sum) {
      comm_reduce_add_dtype(type, sum, rbuf, n / comm_dtype_size(type));
      sum += n;
    }
  }
  return FL_OK;
}

/* Whether the peer on fd shut the connection down (a FIN or an error is waiting). */
static bool peer_hung_up(int fd) {
  struct pollfd pf = {fd, POLLRDHUP, 0};
  return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* One non-blocking send (or recv) of what is left of a buffer, advancing it: true when bytes
 * moved; otherwise *r and *err say why, for io_failed. */
static bool io_step(int fd, const uint8_t **at, size_t *left, bool write, ssize_t *r, int *err) {
  *r = write ? send(fd, *at, *left, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, (void *)*at, *left, MSG_DONTWAIT);
  *err = errno;
  if (*r > 0) {
    *at += *r, *left -= (size_t)*r;
    return true;
  }
  return false;
}

/* Whether a step that moved nothing failed (rather than found no room or no data). */
static bool io_failed(ssize_t r, int err, bool write) {
  if (write) return r < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR;
  return r == 0 || (r < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR);
}

/* One step on the channel to or from `peer`: its shared-memory ring when the pair has one,
 * else its socket (io_step). A closed ring reads as ESHUTDOWN. */
static inline bool chan_step(comm_host *h, int peer, int fd, const uint8_t **at, size_t *left,
                             bool write, ssize_t *r, int *err) {
  if (comm_host_is_shm(h, peer)) {
    ssize_t k = write ? comm_shm_write(h, peer, *at, *left) : comm_shm_read(h, peer, (uint8_t *)*at, *left);
    if (k > 0) {
      *at += k, *left -= (size_t)k;
      return true;
    }
    *r = -1;
    *err = k < 0 ? ESHUTDOWN : EAGAIN;
    return false;
  }
  return io_step(fd, at, left, write, r, err);
}

/* What is left of a transfer, for the waits and their errors. */
typedef struct pending {
  bool send, ack_in;  /* on send_peer's channel: bytes out, the ack in */
  bool recv, ack_out; /* on recv_peer's channel: bytes in, the ack out */
} pending;

static fl_status timed_out(comm_host *h, int send_peer, int recv_peer, pending w) {
  if (!w.send && !w.recv && !w.ack_out && w.ack_in)
    return fl_set_error(FL_ETIMEDOUT, "rank %d: rank %d did not acknowledge reading this rank's buffer "
                        "(single copy) for %u ms", h->rank, send_peer, h->op_timeout_ms);
  bool sending = w.send || w.ack_in, receiving = w.recv || w.ack_out;
  int who = sending && receiving && send_peer != recv_peer ? -1 : (sending ? send_peer : recv_peer);
  if (who >= 0)
    return fl_set_error(FL_ETIMEDOUT, "rank %d: rank %d did not %s for %u ms", h->rank, who,
                        receiving ? "send" : "receive", h->op_timeout_ms);
  return fl_set_error(FL_ETIMEDOUT, "rank %d: neither rank %d (receiving) nor rank %d "
                      "(sending) moved a byte for %u ms", h->rank, send_peer, recv_peer,
                      h->op_timeout_ms);
}

/* Whether a ring this transfer waits on would move now (or fail): the re-check between
 * announcing sleep and sleeping. */
static bool shm_ready(comm_host *h, int send_peer, int recv_peer, pending w) {
  return (w.send && comm_shm_writable(h, send_peer)) || (w.ack_in && comm_shm_readable(h, send_peer)) ||
         (w.recv && comm_shm_readable(h, recv_peer)) || (w.ack_out && comm_shm_writable(h, recv_peer));
}

/* A peer process that died without closing its rings: its socket hangs up. */
static fl_status shm_hung_up(comm_host *h, int send_peer, int recv_peer, pending w) {
  if ((w.send || w.ack_in) && peer_hung_up(h->fds[send_peer]))
    return fl_set_error(FL_EPEER, "rank %d: rank %d went away (its connection closed) while this "
                        "rank sent to it through shared memory", h->rank, send_peer);
  if ((w.recv || w.ack_out) && peer_hung_up(h->fds[recv_peer]))
    return fl_set_error(FL_EPEER, "rank %d: rank %d went away (its connection closed) while this "
                        "rank waited for it through shared memory", h->rank, recv_peer);
  return FL_OK;
}

/* Shared-memory waits: 64 polls of pure spinning, then a poll every 64 with a sched_yield
 * (the peer may need this core: 4 ranks share 2 here) until fl_spin_ns() passed, then
 * sleeps on the doorbell in slices, checking between slices that the peers' sockets did not
 * hang up. The clock is read only once the pure spin is over. */
#define SHM_SPIN_POLLS 64u
#define SHM_SLICE_MS 100u

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* The one transfer loop: sbytes to send_peer while rbytes come from recv_peer. With `sum`
 * set, received bytes land in the piece buffer `rbuf` (piece_bytes long) and each full piece
 * is added into sum (elements of `type`), so that the sends keep flowing while the received data is reduced.
 * With `ring` (comm_host_ring_step), a half of at least the pair's threshold moves by a
 * single copy (top comment): on the channel, the send half is then a descriptor out and an
 * ack in, the receive half a descriptor in, the read, and an ack out. When both peers are
 * one rank, its channel carries each direction in order (descriptor or data, then the ack),
 * so the ack out waits for the send half's bytes and the ack in for the receive half's.
 * A channel is the pair's shared-memory rings when it has them, else its socket. */
static fl_status transfer(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                          int recv_peer, void *rbuf, size_t rbytes, uint8_t *sum, comm_dtype type,
                          size_t piece_bytes, bool ring) {
  if (sbytes) {
    fl_status st = check_fd(h, send_peer);
    if (st) return st;
  }
  if (rbytes) {
    fl_status st = check_fd(h, recv_peer);
    if (st) return st;
  }
  bool s_copy = ring && sbytes && h->single_copy_min[send_peer] && sbytes >= h->single_copy_min[send_peer] &&
                sbytes <= h->single_copy_max[send_peer];
  bool r_copy = ring && rbytes && h->single_copy_min[recv_peer] && rbytes >= h->single_copy_min[recv_peer] &&
                rbytes <= h->single_copy_max[recv_peer];
  uint64_t sdesc[2] = {(uint64_t)(uintptr_t)sbuf, sbytes}, rdesc[2] = {0, 0};
  uint8_t ack_out = 1, ack_in = 0;
  const uint8_t *sp = s_copy ? (const uint8_t *)sdesc : sbuf;
  size_t sleft = s_copy ? sizeof sdesc : sbytes;
  const uint8_t *rp = r_copy ? (uint8_t *)rdesc : rbuf;
  size_t rleft = r_copy ? sizeof rdesc : rbytes;
  const uint8_t *ackp_out = &ack_out, *ackp_in = &ack_in;
  size_t ack_out_left = 0, ack_in_left = s_copy ? 1 : 0;
  bool read_pending = r_copy, same = send_peer == recv_peer;
  size_t in_piece = 0, es = comm_dtype_size(type); /* bytes of the current piece received (sum mode) */
  int sfd = sbytes ? h->fds[send_peer] : -1, rfd = rbytes ? h->fds[recv_peer] : -1;
  bool s_shm = sbytes && comm_host_is_shm(h, send_peer), r_shm = rbytes && comm_host_is_shm(h, recv_peer);
  uint64_t timeout_ns = (uint64_t)h->op_timeout_ms * 1000000u;
  uint64_t spin_until = 0, wait_since = 0, next_check = 0;
  unsigned polls = 0;
  bool colocated = false;
  ssize_t r;
  int err;
  while (sleft || rleft || read_pending || ack_out_left || ack_in_left) {
    bool progress = false;
    if (sleft) {
      if (chan_step(h, send_peer, sfd, &sp, &sleft, true, &r, &err)) progress = true;
      else if (io_failed(r, err, true)) return io_error(h, send_peer, r, err, "send");
    }
    bool direct = false;
    if (rleft && sum && r_shm && !r_copy && in_piece == 0) {
      /* Summed straight from the ring, whole elements at a time: one copy fewer. */
      ssize_t k = comm_shm_read_reduce(h, recv_peer, sum, type, rleft);
      if (k > 0) sum += k, rleft -= (size_t)k, progress = direct = true;
    }
    if (rleft && !direct) {
      size_t want = rleft;
      if (sum && !r_copy) { /* receive into the piece buffer, a piece at a time */
        size_t room = piece_bytes - in_piece;
        if (want > room) want = room;
        /* Over shared memory only an element split across the sender's chunks comes this
         * way; it is summed as soon as it is whole. */
        if (r_shm && want > es - in_piece) want = es - in_piece;
        rp = (uint8_t *)rbuf + in_piece;
      }
      size_t left = want;
      if (chan_step(h, recv_peer, rfd, &rp, &left, false, &r, &err)) {
        size_t got = want - left;
        rleft -= got, progress = true;
        if (sum && !r_copy) {
          in_piece += got;
          if (in_piece == piece_bytes || rleft == 0 || (r_shm && in_piece == es)) {
            /* whole elements only: pieces are element-aligned and so is the total */
            comm_reduce_add_dtype(type, sum, rbuf, in_piece / es);
            sum += in_piece;
            in_piece = 0;
          }
        }
      } else if (io_failed(r, err, false)) {
        return io_error(h, recv_peer, r, err, "receive");
      }
    }
    if (read_pending && rleft == 0) {
      fl_status st = single_copy_read(h, recv_peer, rdesc, rbuf, rbytes, sum, type, piece_bytes);
      if (st != FL_OK) return st;
      /* A sender whose step fails while its descriptor is out closes its channels before its
       * caller may write the buffer again: a hang-up seen now means the read may have raced
       * such a write, so the data is not trusted. */
      if ((r_shm && comm_shm_closed(h, recv_peer)) || peer_hung_up(rfd))
        return fl_set_error(FL_EPEER, "rank %d: rank %d gave up while this rank read its buffer (single "
                            "copy); the data read is not used", h->rank, recv_peer);
      read_pending = false, ack_out_left = 1, progress = true;
    }
    if (ack_out_left && !(same && sleft)) {
      if (chan_step(h, recv_peer, rfd, &ackp_out, &ack_out_left, true, &r, &err)) progress = true;
      else if (io_failed(r, err, true)) return io_error(h, recv_peer, r, err, "send");
    }
    if (ack_in_left && !(same && rleft)) {
      if (chan_step(h, send_peer, sfd, &ackp_in, &ack_in_left, false, &r, &err)) {
        progress = true;
        if (ack_in != 1)
          return fl_set_error(FL_EPROTO, "rank %d: rank %d answered a single-copy send with %u, not an ack",
                              h->rank, send_peer, ack_in);
      } else if (io_failed(r, err, false)) {
        return io_error(h, send_peer, r, err, "receive");
      }
    }
    if (progress || !(sleft || rleft || read_pending || ack_out_left || ack_in_left)) {
      polls = 0, spin_until = 0, wait_since = 0;
      continue;
    }
    pending w = {.send = sleft > 0, .ack_in = ack_in_left && !(same && rleft),
                 .recv = rleft > 0, .ack_out = ack_out_left && !(same && sleft)};
    bool s_wait = w.send || w.ack_in, r_wait = w.recv || w.ack_out;
    bool all_shm = (!s_wait || s_shm) && (!r_wait || r_shm);
    if (all_shm) {
      /* No system call until the pure spin is over (the fast path: data already there),
       * unless the peer waited last on this CPU: then it needs the CPU, not our spin, and
       * every poll yields (still bounded by the clock below). */
      if (polls++ == 0) colocated = comm_shm_same_cpu(h, s_wait ? send_peer : -1, r_wait ? recv_peer : -1);
      if (!colocated && (polls < SHM_SPIN_POLLS || polls % SHM_SPIN_POLLS)) {
        cpu_relax();
        continue;
      }
      uint64_t now = common_now_ns();
      if (!wait_since) wait_since = now, spin_until = now + fl_spin_ns(), next_check = now;
      if (now - wait_since >= timeout_ns) return timed_out(h, send_peer, recv_peer, w);
      if (now < spin_until) {
        sched_yield();
        continue;
      }
      if (now >= next_check) { /* a peer process that died closes no ring */
        fl_status st = shm_hung_up(h, send_peer, recv_peer, w);
        if (st != FL_OK) return st;
        next_check = now + SHM_SLICE_MS * 1000000u;
      }
      uint32_t seq = comm_shm_wait_begin(h);
      if (!shm_ready(h, send_peer, recv_peer, w)) {
        uint64_t left_ms = (wait_since + timeout_ns - now) / 1000000u + 1;
        (void)comm_shm_sleep(h, seq, left_ms < SHM_SLICE_MS ? (uint32_t)left_ms : SHM_SLICE_MS);
      }
      comm_shm_wait_end(h);
      polls = 0; /* spin a little again after a wake-up, then straight back to sleep */
      continue;
    }
    /* Waking a sleeping thread costs 25-60 us here, so spin (yielding the core, which a
     * peer rank on the same core needs) for fl_spin_ns() before sleeping in poll. */
    uint64_t now = common_now_ns();
    if (spin_until == 0) spin_until = now + fl_spin_ns(), wait_since = now;
    if (now < spin_until) {
      sched_yield();
      continue;
    }
    /* Poll the sockets this transfer waits on; a ring it also waits on cannot wake poll, so
     * then the sleep is 1 ms at a time (this mix only happens across hosts). */
    struct pollfd pf[2];
    nfds_t n = 0;
    short s_events = (short)(s_shm ? 0 : (w.send ? POLLOUT : 0) | (w.ack_in ? POLLIN : 0));
    short r_events = (short)(r_shm ? 0 : (w.recv ? POLLIN : 0) | (w.ack_out ? POLLOUT : 0));
    if (s_events) pf[n++] = (struct pollfd){sfd, s_events, 0};
    if (r_events) {
      if (n && pf[0].fd == rfd) pf[0].events |= r_events;
      else pf[n++] = (struct pollfd){rfd, r_events, 0};
    }
    bool mixed = (s_wait && s_shm) || (r_wait && r_shm);
    if (now - wait_since >= timeout_ns) return timed_out(h, send_peer, recv_peer, w);
    uint64_t until = mixed ? now + 1000000u : wait_since + timeout_ns;
    int pr = comm_host_poll_until(pf, n, until);
    if (pr < 0) return fl_set_error(FL_ENET, "rank %d: poll: %s", h->rank, strerror(errno));
    if (pr == 0 && !mixed) return timed_out(h, send_peer, recv_peer, w);
  }
  return FL_OK;
}

fl_status comm_host_exchange(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                             int recv_peer, void *rbuf, size_t rbytes) {
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, rbuf, rbytes, NULL, COMM_F32, 0, false);
}

fl_status comm_host_exchange_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                    int recv_peer, float *sum, size_t rcount, float *tmp,
                                    size_t piece_floats) {
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, tmp, rcount * sizeof(float), (uint8_t *)sum,
                  COMM_F32, piece_floats * sizeof(float), false);
}


fl_status comm_host_ring_step(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                              int recv_peer, void *rbuf, size_t rbytes) {
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, rbuf, rbytes, NULL, COMM_F32, 0, true);
}

fl_status comm_host_ring_step_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                     int recv_peer, void *sum, comm_dtype type, size_t rcount,
                                     void *tmp, size_t piece_elems) {
  size_t es = comm_dtype_size(type);
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, tmp, rcount * es, sum, type,
                  piece_elems * es, true);
}

fl_status comm_host_send(comm_host *h, int peer, const void *buf, size_t bytes) {
  return comm_host_exchange(h, peer, buf, bytes, peer, NULL, 0);
}

fl_status comm_host_recv(comm_host *h, int peer, void *buf, size_t bytes) {
  return comm_host_exchange(h, peer, NULL, 0, peer, buf, bytes);
}

fl_status comm_host_scratch(comm_host *h, int slot, size_t bytes, void **out) {
  if (h->scratch_cap[slot] < bytes) {
    common_free(h->scratch[slot]);
    h->scratch_cap[slot] = 0;
    h->scratch[slot] = common_malloc(bytes);
    if (!h->scratch[slot]) return FL_ERR(FL_ENOMEM, "out of memory for %zu bytes of scratch", bytes);
    h->scratch_cap[slot] = bytes;
  }
  *out = h->scratch[slot];
  return FL_OK;
}
