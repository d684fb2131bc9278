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

/* The one transfer loop: sbytes to send_peer while rbytes come from recv_peer. With `sum`
 * set, received bytes land in the piece buffer `rbuf` (piece_bytes long) and each full piece
 * is added into sum (elements of `type`), so that the sends keep flowing while the received data is reduced.
 * With `ring` (comm_host_ring_step), a half of at least the pair's threshold moves by a
 * single copy (top comment): on the socket, the send half is then a descriptor out and an
 * ack in, the receive half a descriptor in, the read, and an ack out. When both peers are
 * one rank, its socket carries each direction in order (descriptor or data, then the ack),
 * so the ack out waits for the send half's bytes and the ack in for the receive half's. */
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
  bool s_copy = ring && sbytes && h->single_copy_min[send_peer] && sbytes >= h->single_copy_min[send_peer];
  bool r_copy = ring && rbytes && h->single_copy_min[recv_peer] && rbytes >= h->single_copy_min[recv_peer];
  uint64_t sdesc[2] = {(uint64_t)(uintptr_t)sbuf, sbytes}, rdesc[2] = {0, 0};
  uint8_t ack_out = 1, ack_in = 0;
  const uint8_t *sp = s_copy ? (const uint8_t *)sdesc : sbuf;
  size_t sleft = s_copy ? sizeof sdesc : sbytes;
  const uint8_t *rp = r_copy ? (uint8_t *)rdesc : rbuf;
  size_t rleft = r_copy ? sizeof rdesc : rbytes;
  const uint8_t *ackp_out = &ack_out, *ackp_in = &ack_in;
  size_t ack_out_left = 0, ack_in_left = s_copy ? 1 : 0;
  bool read_pending = r_copy, same = send_peer == recv_peer;
  size_t in_piece = 0; /* bytes of the current piece received (sum mode, TCP) */
  int sfd = sbytes ? h->fds[send_peer] : -1, rfd = rbytes ? h->fds[recv_peer] : -1;
  uint64_t timeout_ns = (uint64_t)h->op_timeout_ms * 1000000u;
  uint64_t spin_ns = fl_spin_ns(), spin_until = 0;
  ssize_t r;
  int err;
  while (sleft || rleft || read_pending || ack_out_left || ack_in_left) {
    bool progress = false;
    if (sleft) {
      if (io_step(sfd, &sp, &sleft, true, &r, &err)) progress = true;
      else if (io_failed(r, err, true)) return io_error(h, send_peer, r, err, "send");
    }
    if (rleft) {
      size_t want = rleft;
      if (sum && !r_copy) { /* receive into the piece buffer, a piece at a time */
        size_t room = piece_bytes - in_piece;
        if (want > room) want = room;
        rp = (uint8_t *)rbuf + in_piece;
      }
      size_t left = want;
      if (io_step(rfd, &rp, &left, false, &r, &err)) {
        size_t got = want - left;
        rleft -= got, progress = true;
        if (sum && !r_copy) {
          in_piece += got;
          if (in_piece == piece_bytes || rleft == 0) {
            /* whole elements only: pieces are element-aligned and so is the total */
            comm_reduce_add_dtype(type, sum, rbuf, in_piece / comm_dtype_size(type));
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
      /* A sender whose step fails while its descriptor is out shuts its sockets before its
       * caller may write the buffer again: a hang-up seen now means the read may have raced
       * such a write, so the data is not trusted. */
      if (peer_hung_up(rfd))
        return fl_set_error(FL_EPEER, "rank %d: rank %d gave up while this rank read its buffer (single "
                            "copy); the data read is not used", h->rank, recv_peer);
      read_pending = false, ack_out_left = 1, progress = true;
    }
    if (ack_out_left && !(same && sleft)) {
      if (io_step(rfd, &ackp_out, &ack_out_left, true, &r, &err)) progress = true;
      else if (io_failed(r, err, true)) return io_error(h, recv_peer, r, err, "send");
    }
    if (ack_in_left && !(same && rleft)) {
      if (io_step(sfd, &ackp_in, &ack_in_left, false, &r, &err)) {
        progress = true;
        if (ack_in != 1)
          return fl_set_error(FL_EPROTO, "rank %d: rank %d answered a single-copy send with %u, not an ack",
                              h->rank, send_peer, ack_in);
      } else if (io_failed(r, err, false)) {
        return io_error(h, send_peer, r, err, "receive");
      }
    }
    if (progress || !(sleft || rleft || read_pending || ack_out_left || ack_in_left)) {
      spin_until = 0;
      continue;
    }
    /* Waking a sleeping thread costs 25-60 us here, so spin (yielding the core, which a
     * peer rank on the same core needs) for fl_spin_ns() before sleeping in poll. */
    uint64_t now = common_now_ns();
    if (spin_until == 0) spin_until = now + spin_ns;
    if (now < spin_until) {
      sched_yield();
      continue;
    }
    struct pollfd pf[2];
    nfds_t n = 0;
    short s_events = (short)((sleft ? POLLOUT : 0) | (ack_in_left && !(same && rleft) ? POLLIN : 0));
    short r_events = (short)((rleft ? POLLIN : 0) | (ack_out_left && !(same && sleft) ? POLLOUT : 0));
    if (s_events) pf[n++] = (struct pollfd){sfd, s_events, 0};
    if (r_events) {
      if (n && pf[0].fd == rfd) pf[0].events |= r_events;
      else pf[n++] = (struct pollfd){rfd, r_events, 0};
    }
    int pr = comm_host_poll_until(pf, n, common_now_ns() + timeout_ns);
    if (pr < 0) return fl_set_error(FL_ENET, "rank %d: poll: %s", h->rank, strerror(errno));
    if (pr == 0) {
      if (!sleft && !rleft && !ack_out_left && ack_in_left)
        return fl_set_error(FL_ETIMEDOUT, "rank %d: rank %d did not acknowledge reading this rank's buffer "
                            "(single copy) for %u ms", h->rank, send_peer, h->op_timeout_ms);
      bool sending = sleft || ack_in_left, receiving = rleft || ack_out_left;
      int who = sending && receiving && send_peer != recv_peer ? -1 : (sending ? send_peer : recv_peer);
      if (who >= 0)
        return fl_set_error(FL_ETIMEDOUT, "rank %d: rank %d did not %s for %u ms", h->rank, who,
                            receiving ? "send" : "receive", h->op_timeout_ms);
      return fl_set_error(FL_ETIMEDOUT, "rank %d: neither rank %d (receiving) nor rank %d "
                          "(sending) moved a byte for %u ms", h->rank, send_peer, recv_peer,
                          h->op_timeout_ms);
    }
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

/* ---- reductions: plain loops that the compiler vectorizes (-fopenmp-simd) ---------------- */
void comm_reduce_add(float *restrict dst, const float *restrict src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* 16-bit elements are summed in fp32 and rounded back (to nearest even), as NCCL does. */
static void reduce_add_f16(uint16_t *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = comm_f32_to_f16(comm_f16_to_f32(dst[i]) + comm_f16_to_f32(src[i]));
}

static void reduce_add_bf16(uint16_t *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++)
    dst[i] = comm_f32_to_bf16(comm_bf16_to_f32(dst[i]) + comm_bf16_to_f32(src[i]));
}

void comm_reduce_add_dtype(comm_dtype type, void *dst, const void *src, size_t n) {
  switch (type) {
  case COMM_F16: reduce_add_f16(dst, src, n); break;
  case COMM_BF16: reduce_add_bf16(dst, src, n); break;
  default: comm_reduce_add(dst, src, n); break;
  }
}

size_t comm_dtype_size(comm_dtype type) { return type == COMM_F32 ? 4 : 2; }

void comm_reduce_scale(float *dst, float a, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] *= a;
}
