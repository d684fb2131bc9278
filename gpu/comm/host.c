/*
 * gpu/comm/host.c: the host backend. Ranks (threads or processes) talk TCP over a full mesh:
 * rank i connects to every rank j < i and accepts every rank j > i, so the mesh forms in one
 * pass without deadlock (rank 0 only accepts; each rank's connects are answered by lower
 * ranks that have finished theirs). A connection opens with a 16-byte hello (magic, version,
 * rank, size), answered by the same from the acceptor; a connection with a bad hello is
 * closed and the endpoint keeps waiting for the real peer.
 *
 * Design: sockets are non-blocking once the mesh is up. Transfers loop on send/recv and
 * poll() when the socket has no room or no data; the full-duplex exchange polls both
 * sockets at once, which is what lets every rank of a ring send to its next while it
 * receives from its previous. Every wait is bounded: no byte moving for the operation
 * timeout (FLINT_COMM_TIMEOUT_MS, default 300 s) is FL_ETIMEDOUT naming the peer. A peer
 * that closes is FL_EPEER, a socket error FL_ENET. Collectives on cuda tensors copy the
 * tensor into pinned host memory (dev->ops->host_alloc), run there and copy back, so
 * several ranks may share one GPU.
 *
 * Single copy between ranks on one host. Over loopback TCP every byte is copied twice (into
 * the kernel by send, out of it by recv), and past the caches that is what bounds a
 * collective. So when the mesh is up, each rank challenges every peer to show it a random
 * nonce through process_vm_readv(2) (which needs the same host and pid namespace, and
 * ptrace permission: Linux's cross-memory attach, as MPI libraries use it; see
 * single_copy_probe), and a pair where both directions work moves ring steps of
 * FLINT_COMM_SINGLE_COPY_MIN bytes or more (default 128 KiB; the pair takes the larger of
 * its two settings) by a single copy: the sender puts a 16-byte descriptor (address,
 * length) on the socket, the receiver reads the sender's buffer straight into its own (or
 * a piece at a time into the reduction), then answers with a 1-byte ack, after which the
 * sender may reuse the buffer. Everything else, and every pair that failed the probe,
 * stays on TCP. FLINT_COMM_SINGLE_COPY=0 turns it off. Only ring steps use it
 * (comm_host_ring_step): both ends of a step run the same call, so the receiver knows to
 * expect a descriptor, and neither end waits on an ack the other cannot send.
 *
 * Threading: one thread at a time per communicator (its rank's thread).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/common.h"
#include "gpu/comm/comm.h"

#define HOST_MAGIC 0x544e4c46u /* "FLNT" little-endian */
#define HOST_VERSION 2u /* 2: the single-copy probe follows the hello */
#define HOST_HELLO_BYTES 16
#define HOST_MAX_PENDING 32
#define HOST_DEFAULT_CONNECT_MS 30000u

/* Tunables read from the environment, declared once here with their defaults. */
static uint32_t env_u32(const char *name, uint32_t def) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end;
  unsigned long x = strtoul(v, &end, 10);
  return *end == '\0' && x <= UINT32_MAX ? (uint32_t)x : def;
}
/* No byte moving for this long inside a collective is FL_ETIMEDOUT. */
static uint32_t op_timeout_ms(void) { return env_u32("FLINT_COMM_TIMEOUT_MS", 300000u); }
/* SO_SNDBUF/SO_RCVBUF of every comm socket; 0 leaves them to the kernel's autotuning. */
static uint32_t sockbuf_bytes(void) { return env_u32("FLINT_COMM_SOCKBUF", 4u << 20); }
/* Single copy (top comment): off with 0; ring steps of at least _MIN bytes use it. */
static bool single_copy_enabled(void) { return env_u32("FLINT_COMM_SINGLE_COPY", 1) != 0; }
static uint32_t single_copy_min(void) { return env_u32("FLINT_COMM_SINGLE_COPY_MIN", 128u << 10); }

struct fl_comm_endpoint {
  int fd;
  char host[64];
  char address[96];
};

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
   * with it (0: never, TCP only). */
  pid_t *peer_pid;
  size_t *single_copy_min;
};

/* ---- sockets --------------------------------------------------------------------------- */

void comm_host_socket_options(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int buf = (int)sockbuf_bytes();
  if (buf > 0) {
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  }
}

static int remaining_ms(uint64_t deadline_ns) {
  uint64_t now = common_now_ns();
  if (now >= deadline_ns) return 0;
  uint64_t ms = (deadline_ns - now + 999999) / 1000000;
  return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* poll() with EINTR retried against the same deadline. Returns >0, 0 on timeout, -1. */
static int poll_until(struct pollfd *p, nfds_t n, uint64_t deadline_ns) {
  for (;;) {
    int r = poll(p, n, remaining_ms(deadline_ns));
    if (r >= 0 || errno != EINTR) return r;
  }
}

static int split_address(const char *address, char *host, size_t hlen, char *port, size_t plen) {
  const char *colon = strrchr(address, ':');
  if (!colon || colon == address || !colon[1]) return -1;
  size_t n = (size_t)(colon - address);
  if (address[0] == '[' && n >= 2 && address[n - 1] == ']') address++, n -= 2; /* [v6]:port */
  if (n >= hlen || strlen(colon + 1) >= plen) return -1;
  memcpy(host, address, n);
  host[n] = '\0';
  strcpy(port, colon + 1);
  return 0;
}

FL_API fl_status fl_comm_listen(const char *host, fl_comm_endpoint **out) {
  if (!host || !out) return fl_set_error(FL_EINVAL, "fl_comm_listen: NULL argument");
  if (strlen(host) >= 64) return fl_set_error(FL_EINVAL, "fl_comm_listen: host '%s' is too long", host);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int gai = getaddrinfo(host, "0", &hints, &res);
  if (gai != 0)
    return fl_set_error(FL_ENET, "fl_comm_listen: cannot resolve '%s': %s", host, gai_strerror(gai));
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return fl_set_error(FL_ENET, "fl_comm_listen: socket: %s", strerror(errno));
  }
  comm_host_socket_options(fd); /* accepted sockets inherit the buffer sizes */
  if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    int e = errno;
    freeaddrinfo(res);
    close(fd);
    return fl_set_error(FL_ENET, "fl_comm_listen: cannot listen on %s: %s", host, strerror(e));
  }
  freeaddrinfo(res);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = "", port[16] = "";
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
      getnameinfo((struct sockaddr *)&ss, sl, ip, sizeof ip, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    close(fd);
    return fl_set_error(FL_ENET, "fl_comm_listen: cannot read the bound address: %s", strerror(errno));
  }
  fl_comm_endpoint *ep = common_calloc(1, sizeof *ep);
  if (!ep) {
    close(fd);
    return FL_ERR(FL_ENOMEM, "out of memory for an endpoint");
  }
  ep->fd = fd;
  snprintf(ep->host, sizeof ep->host, "%s", host);
  if (ss.ss_family == AF_INET6)
    snprintf(ep->address, sizeof ep->address, "[%s]:%s", ip, port);
  else
    snprintf(ep->address, sizeof ep->address, "%s:%s", ip, port);
  *out = ep;
  return FL_OK;
}

FL_API const char *fl_comm_endpoint_address(const fl_comm_endpoint *ep) {
  return ep ? ep->address : "(null)";
}

FL_API void fl_comm_endpoint_destroy(fl_comm_endpoint *ep) {
  if (!ep) return;
  if (ep->fd >= 0) close(ep->fd);
  common_free(ep);
}

/* ---- the mesh ---------------------------------------------------------------------------- */

static void hello_pack(uint8_t *b, uint32_t rank, uint32_t size) {
  uint32_t w[4] = {HOST_MAGIC, HOST_VERSION, rank, size};
  memcpy(b, w, sizeof w);
}

/* Reads/writes exactly n bytes on a non-blocking socket before the deadline. 0, or -1 with
 * errno (ETIMEDOUT for the deadline, ECONNRESET for a closed peer). */
static int io_until(int fd, void *buf, size_t n, bool write, uint64_t deadline_ns) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = write ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r, n -= (size_t)r;
      continue;
    }
    if (r == 0) {
      errno = ECONNRESET;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    struct pollfd pf = {fd, write ? POLLOUT : POLLIN, 0};
    int pr = poll_until(&pf, 1, deadline_ns);
    if (pr < 0) return -1;
    if (pr == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
  }
  return 0;
}

/* Rank `rank` connects to lower rank `peer` and exchanges hellos, retrying a refused connect
 * until the deadline. */
static fl_status connect_peer(int rank, int size, int peer, const char *address,
                              uint64_t deadline_ns, int *out_fd) {
  char host[80], port[16];
  if (split_address(address, host, sizeof host, port, sizeof port) != 0)
    return fl_set_error(FL_EINVAL, "rank %d: address of rank %d '%s' is not HOST:PORT", rank,
                        peer, address);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int gai = getaddrinfo(host, port, &hints, &res);
  if (gai != 0)
    return fl_set_error(FL_ENET, "rank %d: cannot resolve rank %d's address '%s': %s", rank, peer,
                        address, gai_strerror(gai));
  const char *why = "timed out";
  for (;;) {
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      freeaddrinfo(res);
      return fl_set_error(FL_ENET, "rank %d: socket: %s", rank, strerror(errno));
    }
    comm_host_socket_options(fd);
    int r = connect(fd, res->ai_addr, res->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      struct pollfd pf = {fd, POLLOUT, 0};
      int pr = poll_until(&pf, 1, deadline_ns);
      int err = 0;
      socklen_t el = sizeof err;
      if (pr > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) r = 0;
      else errno = pr == 0 ? ETIMEDOUT : err;
    }
    if (r == 0) {
      uint8_t hello[HOST_HELLO_BYTES], ack[HOST_HELLO_BYTES];
      hello_pack(hello, (uint32_t)rank, (uint32_t)size);
      if (io_until(fd, hello, sizeof hello, true, deadline_ns) == 0 &&
          io_until(fd, ack, sizeof ack, false, deadline_ns) == 0) {
        uint8_t want[HOST_HELLO_BYTES];
        hello_pack(want, (uint32_t)peer, (uint32_t)size);
        freeaddrinfo(res);
        if (memcmp(ack, want, sizeof ack) != 0) {
          close(fd);
          return fl_set_error(FL_EPROTO, "rank %d: the endpoint at '%s' answered as another group "
                              "or rank, not rank %d of %d", rank, address, peer, size);
        }
        *out_fd = fd;
        return FL_OK;
      }
      why = errno == ETIMEDOUT ? "no answer to the hello" : "closed during the hello";
      close(fd);
      if (errno == ETIMEDOUT) break;
    } else {
      int e = errno;
      close(fd);
      why = strerror(e);
      if (e != ECONNREFUSED && e != ETIMEDOUT && e != EAGAIN) break;
      if (e == ETIMEDOUT) break;
    }
    if (remaining_ms(deadline_ns) == 0) break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  freeaddrinfo(res);
  return fl_set_error(FL_ETIMEDOUT, "rank %d: could not connect to rank %d at %s (%s)", rank,
                      peer, address, why);
}

/* Accepts ranks rank+1 .. size-1 on ep; drops connections whose hello is wrong. */
static fl_status accept_peers(fl_comm_endpoint *ep, int rank, int size, int *fds,
                              uint64_t deadline_ns, uint32_t timeout_ms) {
  int missing = size - 1 - rank;
  struct {
    int fd;
    size_t got;
    uint8_t buf[HOST_HELLO_BYTES];
  } pend[HOST_MAX_PENDING];
  int npend = 0, rejected = 0;
  fl_status st = FL_OK;
  while (missing > 0) {
    struct pollfd pf[HOST_MAX_PENDING + 1];
    pf[0] = (struct pollfd){ep->fd, POLLIN, 0};
    for (int i = 0; i < npend; i++) pf[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
    int pr = poll_until(pf, (nfds_t)npend + 1, deadline_ns);
    if (pr < 0) {
      st = fl_set_error(FL_ENET, "rank %d: poll: %s", rank, strerror(errno));
      break;
    }
    if (pr == 0) {
      char list[256] = "";
      size_t len = 0;
      for (int j = rank + 1; j < size && len < sizeof list - 16; j++)
        if (fds[j] < 0) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", j);
      st = fl_set_error(FL_ETIMEDOUT, "rank %d: rank%s %s did not connect within %u ms%s", rank,
                        strchr(list, ',') ? "s" : "", list, timeout_ms,
                        rejected ? " (connections with a bad hello were rejected)" : "");
      break;
    }
    /* Pending hellos first (indexes shift as they leave). */
    for (int i = npend - 1; i >= 0; i--) {
      if (!(pf[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = recv(pend[i].fd, pend[i].buf + pend[i].got, HOST_HELLO_BYTES - pend[i].got, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      bool bad = r <= 0;
      if (!bad) pend[i].got += (size_t)r;
      if (!bad && pend[i].got < HOST_HELLO_BYTES) continue;
      int peer = -1;
      if (!bad) {
        uint32_t w[4];
        memcpy(w, pend[i].buf, sizeof w);
        bad = w[0] != HOST_MAGIC || w[1] != HOST_VERSION || w[3] != (uint32_t)size ||
              w[2] <= (uint32_t)rank || w[2] >= (uint32_t)size || fds[w[2]] >= 0;
        peer = (int)w[2];
      }
      if (!bad) {
        uint8_t ack[HOST_HELLO_BYTES];
        hello_pack(ack, (uint32_t)rank, (uint32_t)size);
        bad = io_until(pend[i].fd, ack, sizeof ack, true, deadline_ns) != 0;
      }
      if (bad) {
        close(pend[i].fd);
        rejected++;
      } else {
        fds[peer] = pend[i].fd;
        missing--;
      }
      pend[i] = pend[--npend];
    }
    if (pf[0].revents & POLLIN) {
      int fd = accept4(ep->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        if (npend == HOST_MAX_PENDING) {
          close(fd); /* a flood of strangers; the real peers retry nothing, so keep room */
          rejected++;
        } else {
          comm_host_socket_options(fd);
          pend[npend].fd = fd;
          pend[npend].got = 0;
          npend++;
        }
      }
    }
  }
  for (int i = 0; i < npend; i++) close(pend[i].fd);
  return st;
}

static const comm_backend_ops host_ops;

static void host_free(comm_host *h) {
  if (!h) return;
  if (h->fds)
    for (int i = 0; i < h->size; i++)
      if (h->fds[i] >= 0) close(h->fds[i]);
  common_free(h->fds);
  common_free(h->peer_pid);
  common_free(h->single_copy_min);
  for (int i = 0; i < 2; i++) {
    common_free(h->scratch[i]);
    if (h->stage[i]) h->stage_dev[i]->ops->host_free(h->stage_dev[i], h->stage[i]);
  }
  common_free(h);
}

/* ---- single copy --------------------------------------------------------------------------- */

/* Reads `bytes` at `remote` in process `pid` into `local`; -1 with errno. */
static int read_peer(pid_t pid, void *local, uint64_t remote, size_t bytes) {
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

/* The probe (top comment), a challenge in three rounds of a few bytes on idle sockets (all
 * sends of a round go before its reads, so no rank waits on another's read):
 *   1. offer: to each peer p, {pid, address of this rank's cookie array, threshold or 0 when
 *      off, a fresh nonce for p}; the nonce p sent is stored in cookies[p];
 *   2. ready: one byte each way, once every peer has stored its nonces;
 *   3. verdict: this rank reads p's cookies[this rank] from p's process and says whether it
 *      found the nonce it sent. A pair uses single copy when both verdicts are yes.
 * Only a process that received the nonce can hold it, so a peer cannot point the read at
 * another process's memory. */
static fl_status single_copy_probe(comm_host *h, uint64_t deadline_ns) {
  size_t n = (size_t)h->size;
  h->peer_pid = common_calloc(n, sizeof *h->peer_pid);
  h->single_copy_min = common_calloc(n, sizeof *h->single_copy_min);
  uint64_t(*theirs)[4] = common_calloc(n, sizeof *theirs);
  uint64_t *nonce = common_calloc(n, sizeof *nonce), *cookies = common_calloc(n, sizeof *cookies);
  uint8_t *verdict = common_calloc(n, 1);
  fl_status status = FL_OK;
  if (!h->peer_pid || !h->single_copy_min || !theirs || !nonce || !cookies || !verdict) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", h->size);
    goto cleanup;
  }
  uint64_t threshold = single_copy_enabled() ? single_copy_min() : 0;
  const char *what = "offer";
  int peer = 0;
  for (peer = 0; peer < h->size; peer++) {
    if (peer == h->rank) continue;
    nonce[peer] = common_random_u64();
    uint64_t offer[4] = {(uint64_t)getpid(), (uint64_t)(uintptr_t)cookies, threshold, nonce[peer]};
    if (io_until(h->fds[peer], offer, sizeof offer, true, deadline_ns) != 0) goto io_failed;
  }
  for (peer = 0; peer < h->size; peer++) {
    if (peer == h->rank) continue;
    if (io_until(h->fds[peer], theirs[peer], sizeof theirs[peer], false, deadline_ns) != 0) goto io_failed;
    cookies[peer] = theirs[peer][3];
  }
  what = "ready";
  uint8_t one = 1, back = 0;
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && io_until(h->fds[peer], &one, 1, true, deadline_ns) != 0) goto io_failed;
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && io_until(h->fds[peer], &back, 1, false, deadline_ns) != 0) goto io_failed;
  for (peer = 0; peer < h->size; peer++) {
    if (peer == h->rank) continue;
    uint64_t seen = 0, at = theirs[peer][1] + (uint64_t)h->rank * sizeof seen;
    verdict[peer] = threshold && theirs[peer][2] && theirs[peer][0] <= (uint64_t)INT32_MAX &&
                    read_peer((pid_t)theirs[peer][0], &seen, at, sizeof seen) == 0 && seen == nonce[peer];
  }
  what = "verdict";
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && io_until(h->fds[peer], &verdict[peer], 1, true, deadline_ns) != 0) goto io_failed;
  for (peer = 0; peer < h->size; peer++) {
    if (peer == h->rank) continue;
    if (io_until(h->fds[peer], &back, 1, false, deadline_ns) != 0) goto io_failed;
    h->peer_pid[peer] = (pid_t)theirs[peer][0];
    if (verdict[peer] && back == 1)
      h->single_copy_min[peer] = theirs[peer][2] > threshold ? theirs[peer][2] : threshold;
  }
  goto cleanup;
io_failed:
  status = fl_set_error(errno == ETIMEDOUT ? FL_ETIMEDOUT : FL_EPEER,
                        "rank %d: the single-copy %s with rank %d failed: %s", h->rank, what, peer,
                        strerror(errno));
cleanup:
  common_free(theirs);
  common_free(nonce);
  common_free(cookies);
  common_free(verdict);
  return status;
}

FL_API fl_status fl_comm_host_create(fl_comm_endpoint *ep, int rank, int size,
                                     const char *const *addresses, uint32_t timeout_ms,
                                     fl_comm **out) {
  static const char fn[] = "fl_comm_host_create";
  fl_status status = FL_OK;
  comm_host *h = NULL;
  if (!ep || !out || (size > 1 && !addresses)) {
    status = fl_set_error(FL_EINVAL, "%s: NULL argument", fn);
    goto cleanup;
  }
  if (size < 1 || rank < 0 || rank >= size) {
    status = fl_set_error(FL_EINVAL, "%s: rank %d is outside 0..%d", fn, rank, size - 1);
    goto cleanup;
  }
  for (int i = 0; i < size && addresses; i++)
    if (!addresses[i]) {
      status = fl_set_error(FL_EINVAL, "%s: the address of rank %d is NULL", fn, i);
      goto cleanup;
    }
  if (timeout_ms == 0) timeout_ms = HOST_DEFAULT_CONNECT_MS;
  h = common_calloc(1, sizeof *h);
  if (!h || !(h->fds = common_malloc(sizeof(int) * (size_t)size))) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", size);
    goto cleanup;
  }
  h->rank = rank;
  h->size = size;
  for (int i = 0; i < size; i++) h->fds[i] = -1;
  h->op_timeout_ms = op_timeout_ms();
  h->connect_timeout_ms = timeout_ms;
  snprintf(h->host, sizeof h->host, "%s", ep->host);
  uint64_t deadline = common_now_ns() + (uint64_t)timeout_ms * 1000000u;
  for (int j = 0; j < rank; j++) FL_CHECK(connect_peer(rank, size, j, addresses[j], deadline, &h->fds[j]));
  FL_CHECK(accept_peers(ep, rank, size, h->fds, deadline, timeout_ms));
  FL_CHECK(single_copy_probe(h, deadline));
  fl_comm *c;
  FL_CHECK(comm_alloc(&host_ops, rank, size, h, &c));
  h = NULL;
  *out = c;
cleanup:
  host_free(h);
  fl_comm_endpoint_destroy(ep);
  return status;
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
                                  size_t rbytes, float *sum, size_t piece_bytes) {
  if (desc[1] != rbytes)
    return fl_set_error(FL_EPROTO, "rank %d: rank %d offered %llu bytes where the ring step expects %zu",
                        h->rank, recv_peer, (unsigned long long)desc[1], rbytes);
  pid_t pid = h->peer_pid[recv_peer];
  uint64_t at = desc[0];
  size_t step = sum ? piece_bytes : rbytes;
  for (size_t done = 0; done < rbytes; done += step) {
    size_t n = rbytes - done < step ? rbytes - done : step;
    uint8_t *to = sum ? rbuf : (uint8_t *)rbuf + done;
    if (read_peer(pid, to, at + done, n) != 0)
      return fl_set_error(errno == ESRCH ? FL_EPEER : errno == EFAULT ? FL_EPROTO : FL_ENET,
                          "rank %d: reading rank %d's buffer (single copy, pid %d) failed: %s", h->rank,
                          recv_peer, (int)pid, strerror(errno));
    if (sum) {
      comm_reduce_add(sum, rbuf, n / sizeof(float));
      sum += n / sizeof(float);
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
 * is added into sum, so that the sends keep flowing while the received data is reduced.
 * With `ring` (comm_host_ring_step), a half of at least the pair's threshold moves by a
 * single copy (top comment): on the socket, the send half is then a descriptor out and an
 * ack in, the receive half a descriptor in, the read, and an ack out. When both peers are
 * one rank, its socket carries each direction in order (descriptor or data, then the ack),
 * so the ack out waits for the send half's bytes and the ack in for the receive half's. */
static fl_status transfer(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                          int recv_peer, void *rbuf, size_t rbytes, float *sum, size_t piece_bytes,
                          bool ring) {
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
  uint64_t spin_ns = common_spin_ns(), spin_until = 0;
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
            /* whole floats only: pieces are float-aligned and so is the total */
            comm_reduce_add(sum, rbuf, in_piece / sizeof(float));
            sum += in_piece / sizeof(float);
            in_piece = 0;
          }
        }
      } else if (io_failed(r, err, false)) {
        return io_error(h, recv_peer, r, err, "receive");
      }
    }
    if (read_pending && rleft == 0) {
      fl_status st = single_copy_read(h, recv_peer, rdesc, rbuf, rbytes, sum, piece_bytes);
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
     * peer rank on the same core needs) for common_spin_ns() before sleeping in poll. */
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
    int pr = poll_until(pf, n, common_now_ns() + timeout_ns);
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
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, rbuf, rbytes, NULL, 0, false);
}

fl_status comm_host_exchange_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                    int recv_peer, float *sum, size_t rcount, float *tmp,
                                    size_t piece_floats) {
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, tmp, rcount * sizeof(float), sum,
                  piece_floats * sizeof(float), false);
}

int comm_host_single_copy_peers(const fl_comm *c) {
  if (!c || c->ops != &host_ops) return 0;
  const comm_host *h = c->impl;
  int n = 0;
  for (int i = 0; i < h->size; i++) n += h->single_copy_min && h->single_copy_min[i] > 0;
  return n;
}

fl_status comm_host_ring_step(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                              int recv_peer, void *rbuf, size_t rbytes) {
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, rbuf, rbytes, NULL, 0, true);
}

fl_status comm_host_ring_step_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                     int recv_peer, float *sum, size_t rcount, float *tmp,
                                     size_t piece_floats) {
  return transfer(h, send_peer, sbuf, sbytes, recv_peer, tmp, rcount * sizeof(float), sum,
                  piece_floats * sizeof(float), true);
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

void comm_reduce_scale(float *dst, float a, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] *= a;
}

/* ---- staging: a host view of a tensor ---------------------------------------------------- */

/* Host memory holding t's elements: t's own for the cpu device, else a pinned buffer of the
 * tensor's device (slot 0 or 1), filled from the tensor when `fill`. */
static fl_status stage_in(comm_host *h, int slot, const fl_tensor *t, bool fill, float **out) {
  if (t->dev->kind == FL_DEVICE_CPU) {
    *out = t->data;
    return FL_OK;
  }
  size_t bytes = t->numel * sizeof(float);
  if (h->stage_dev[slot] != t->dev || h->stage_cap[slot] < bytes) {
    if (h->stage[slot]) h->stage_dev[slot]->ops->host_free(h->stage_dev[slot], h->stage[slot]);
    h->stage[slot] = NULL;
    h->stage_cap[slot] = 0;
    size_t want = bytes ? bytes : sizeof(float);
    fl_status st = t->dev->ops->host_alloc(t->dev, want, &h->stage[slot]);
    if (st != FL_OK) return st;
    h->stage_dev[slot] = t->dev;
    h->stage_cap[slot] = want;
  }
  if (fill && bytes) {
    fl_status st = t->dev->ops->to_host(t->dev, h->stage[slot], t->data, bytes);
    if (st != FL_OK) return st;
  }
  *out = h->stage[slot];
  return FL_OK;
}

static fl_status stage_out(fl_tensor *t, const float *host) {
  if (t->dev->kind == FL_DEVICE_CPU || t->numel == 0) return FL_OK;
  return t->dev->ops->from_host(t->dev, t->data, host, t->numel * sizeof(float));
}

/* ---- the backend's slots ----------------------------------------------------------------- */

static fl_status host_allreduce(fl_comm *c, fl_tensor *t, fl_reduce_op op, fl_allreduce_algo algo) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, true, &data);
  if (st != FL_OK) return st;
  size_t n = t->numel;
  if (algo == FL_ALLREDUCE_AUTO)
    algo = comm_auto_algo(n * sizeof(float), c->size, comm_host_single_copy_peers(c) > 0);
  if (c->size > 1 && n > 0) {
    switch (algo) {
    case FL_ALLREDUCE_RING: st = allreduce_ring(h, c->rank, c->size, data, n); break;
    case FL_ALLREDUCE_HALVING_DOUBLING: st = allreduce_halving_doubling(h, c->rank, c->size, data, n); break;
    default: st = allreduce_tree(h, c->rank, c->size, data, n); break;
    }
    if (st != FL_OK) return st;
  }
  if (op == FL_REDUCE_AVG) comm_reduce_scale(data, 1.0f / (float)c->size, n);
  return stage_out(t, data);
}

static fl_status host_broadcast(fl_comm *c, fl_tensor *t, int root) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, c->rank == root, &data);
  if (st != FL_OK) return st;
  st = tree_broadcast_bytes(h, c->rank, c->size, root, (uint8_t *)data, t->numel * sizeof(float));
  if (st != FL_OK || c->rank == root) return st;
  return stage_out(t, data);
}

static fl_status host_allgather(fl_comm *c, const fl_tensor *in, fl_tensor *out) {
  comm_host *h = c->impl;
  float *src, *dst;
  fl_status st = stage_in(h, 0, in, true, &src);
  if (st == FL_OK) st = stage_in(h, 1, out, false, &dst);
  if (st != FL_OK) return st;
  size_t n = in->numel, bytes = n * sizeof(float);
  size_t *off = common_malloc(2 * sizeof(size_t) * (size_t)c->size);
  if (!off) return FL_ERR(FL_ENOMEM, "out of memory");
  size_t *len = off + c->size;
  for (int r = 0; r < c->size; r++) off[r] = (size_t)r * bytes, len[r] = bytes;
  if (bytes) memmove((uint8_t *)dst + off[c->rank], src, bytes);
  st = ring_allgather_bytes(h, c->rank, c->size, (uint8_t *)dst, off, len);
  common_free(off);
  if (st != FL_OK) return st;
  return stage_out(out, dst);
}

static fl_status host_reduce_scatter(fl_comm *c, const fl_tensor *in, fl_tensor *out,
                                     fl_reduce_op op) {
  comm_host *h = c->impl;
  size_t n = in->numel;
  float *src, *work, *dst;
  fl_status st = stage_in(h, 0, in, true, &src);
  if (st != FL_OK) return st;
  /* The ring reduces in place, and `in` is the caller's: work on a copy. */
  void *w = NULL;
  st = comm_host_scratch(h, 0, n * sizeof(float) + 1, &w);
  if (st != FL_OK) return st;
  work = w;
  if (n) memcpy(work, src, n * sizeof(float));
  st = ring_reduce_scatter(h, c->rank, c->size, work, n);
  if (st != FL_OK) return st;
  st = stage_in(h, 1, out, false, &dst);
  if (st != FL_OK) return st;
  size_t cnt = comm_block_count(n, c->size, c->rank);
  if (cnt) memcpy(dst, work + comm_block_offset(n, c->size, c->rank), cnt * sizeof(float));
  if (op == FL_REDUCE_AVG) comm_reduce_scale(dst, 1.0f / (float)c->size, cnt);
  return stage_out(out, dst);
}

static fl_status host_send(fl_comm *c, const fl_tensor *t, int peer) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, true, &data);
  if (st != FL_OK) return st;
  return comm_host_send(h, peer, data, t->numel * sizeof(float));
}

static fl_status host_recv(fl_comm *c, fl_tensor *t, int peer) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, false, &data);
  if (st != FL_OK) return st;
  st = comm_host_recv(h, peer, data, t->numel * sizeof(float));
  if (st != FL_OK) return st;
  return stage_out(t, data);
}

static fl_status host_barrier_slot(fl_comm *c) {
  comm_host *h = c->impl;
  return host_barrier(h, c->rank, c->size);
}

/* Split: every member listens on a fresh endpoint; (color, key, rank, address) records go
 * around the parent by allgather; members of one color form their mesh as any group does. */
typedef struct split_record {
  int32_t color, key, rank, pad;
  char address[96];
} split_record;

static int split_cmp(const void *a, const void *b) {
  const split_record *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static fl_status host_split(fl_comm *c, int color, int key, fl_comm **out) {
  comm_host *h = c->impl;
  fl_status status = FL_OK;
  fl_comm_endpoint *ep = NULL;
  split_record *all = NULL;
  size_t *off = NULL;
  const char **addrs = NULL;
  *out = NULL;
  if (color >= 0) FL_CHECK(fl_comm_listen(h->host, &ep));
  all = common_calloc((size_t)c->size, sizeof *all);
  off = common_malloc(2 * sizeof(size_t) * (size_t)c->size);
  addrs = common_calloc((size_t)c->size, sizeof *addrs);
  if (!all || !off || !addrs) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a split");
    goto cleanup;
  }
  split_record *mine = &all[c->rank];
  mine->color = color, mine->key = key, mine->rank = c->rank;
  if (ep) snprintf(mine->address, sizeof mine->address, "%s", ep->address);
  size_t *len = off + c->size;
  for (int r = 0; r < c->size; r++) off[r] = (size_t)r * sizeof *all, len[r] = sizeof *all;
  FL_CHECK(ring_allgather_bytes(h, c->rank, c->size, (uint8_t *)all, off, len));
  if (color < 0) goto cleanup;
  int n = 0;
  for (int r = 0; r < c->size; r++)
    if (all[r].color == color) all[n++] = all[r];
  qsort(all, (size_t)n, sizeof *all, split_cmp);
  int sub_rank = -1;
  for (int i = 0; i < n; i++) {
    all[i].address[sizeof all[i].address - 1] = '\0';
    addrs[i] = all[i].address;
    if (all[i].rank == c->rank) sub_rank = i;
  }
  FL_ASSERT(sub_rank >= 0);
  fl_comm *sub;
  status = fl_comm_host_create(ep, sub_rank, n, addrs, h->connect_timeout_ms, &sub);
  ep = NULL; /* taken */
  if (status != FL_OK) goto cleanup;
  sub->algo = c->algo;
  *out = sub;
cleanup:
  fl_comm_endpoint_destroy(ep);
  common_free(addrs);
  common_free(off);
  common_free(all);
  return status;
}

static void host_abort(fl_comm *c) {
  comm_host *h = c->impl;
  for (int i = 0; i < h->size; i++)
    if (h->fds[i] >= 0) shutdown(h->fds[i], SHUT_RDWR);
}

static void host_destroy(fl_comm *c) { host_free(c->impl); }

static const comm_backend_ops host_ops = {
    .name = "host",
    .allreduce = host_allreduce,
    .broadcast = host_broadcast,
    .allgather = host_allgather,
    .reduce_scatter = host_reduce_scatter,
    .send = host_send,
    .recv = host_recv,
    .barrier = host_barrier_slot,
    .split = host_split,
    .abort = host_abort,
    .destroy = host_destroy,
};
