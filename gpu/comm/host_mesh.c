/*
 * gpu/comm/host_mesh.c: the host backend's mesh. Ranks (threads or processes) talk TCP over a
 * full mesh: rank i connects to every rank j < i and accepts every rank j > i, so the mesh
 * forms in one pass without deadlock (rank 0 only accepts; each rank's connects are answered
 * by lower ranks that have finished theirs). A connection opens with a 16-byte hello (magic,
 * version, rank, size), answered by the same from the acceptor; a connection with a bad hello
 * is closed and the endpoint keeps waiting for the real peer. Once the mesh is up, the ranks
 * probe which pairs may move ring steps by a single copy (single_copy_probe; the scheme is in
 * gpu/comm/host_transport.h), and learn which ranks share a host (host_topology).
 *
 * Threading: a mesh forms on its rank's thread; endpoints are used by one thread at a time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/comm/host_transport.h"

#define HOST_MAGIC 0x544e4c46u /* "FLNT" little-endian */
#define HOST_VERSION 4u /* 2: the single-copy probe follows the hello; 3: then host keys; 4: then shm */
#define HOST_HELLO_BYTES 16
#define HOST_MAX_PENDING 32
#define HOST_DEFAULT_CONNECT_MS 30000u
#define HOST_KEY_BYTES 96

/* Settings (declared with every other in common/config.h, which bounds these to 32 bits). */
/* No byte moving for this long inside a collective is FL_ETIMEDOUT. */
static uint32_t op_timeout_ms(void) { return (uint32_t)config_ms(CONFIG_COMM_TIMEOUT_MS); }
/* SO_SNDBUF/SO_RCVBUF of every comm socket; 0 leaves them to the kernel's autotuning. */
static uint32_t sockbuf_bytes(void) { return (uint32_t)config_size(CONFIG_COMM_SOCKBUF); }
/* Single copy (gpu/comm/host_transport.h): off with 0; ring steps of at least _MIN bytes use it. */
static bool single_copy_enabled(void) { return config_bool(CONFIG_COMM_SINGLE_COPY); }
static uint32_t single_copy_min(void) { return (uint32_t)config_size(CONFIG_COMM_SINGLE_COPY_MIN); }
/* Shared memory between ranks on one host (gpu/comm/host_transport.h): off with 0. */
static bool shm_enabled(void) { return config_bool(CONFIG_COMM_SHM); }
/* The ring steps that a pair talking through shared memory moves by single copy: [min, max]
 * bytes (min 0: none). By default 512 KiB to 4 MiB, where one process_vm_readv beat two
 * copies through a ring on this machine; below, the call's cost, and above, its slower
 * copy (it pins pages, and streams past the caches where the ring stays in them) lost
 * (docs/collectives.md). FLINT_COMM_SINGLE_COPY_MIN, when set, gives min and no max. */
#define SHM_SINGLE_COPY_MIN (512u << 10)
#define SHM_SINGLE_COPY_MAX (4u << 20)
static void shm_single_copy_range(uint64_t range[2]) {
  range[0] = SHM_SINGLE_COPY_MIN, range[1] = SHM_SINGLE_COPY_MAX;
  if (config_given(CONFIG_COMM_SINGLE_COPY_MIN)) range[0] = single_copy_min(), range[1] = UINT64_MAX;
  if (!single_copy_enabled()) range[0] = 0;
}

struct fl_comm_endpoint {
  int fd;
  char host[64];
  char address[96];
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
    int pr = comm_host_poll_until(&pf, 1, deadline_ns);
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
      int pr = comm_host_poll_until(&pf, 1, deadline_ns);
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
    if (comm_host_remaining_ms(deadline_ns) == 0) break;
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
    int pr = comm_host_poll_until(pf, (nfds_t)npend + 1, deadline_ns);
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

void comm_host_free(comm_host *h) {
  if (!h) return;
  comm_host_shm_close(h);
  if (h->fds)
    for (int i = 0; i < h->size; i++)
      if (h->fds[i] >= 0) close(h->fds[i]);
  common_free(h->fds);
  common_free(h->peer_pid);
  common_free(h->single_copy_min);
  common_free(h->single_copy_max);
  comm_host_shm_free(h); /* before the sockets' peers see them close: the rings first */
  common_free(h->host_of);
  for (int i = 0; i < 2; i++) {
    common_free(h->scratch[i]);
    if (h->stage[i]) h->stage_dev[i]->ops->host_free(h->stage_dev[i], h->stage[i]);
  }
  common_free(h);
}

/* ---- single copy --------------------------------------------------------------------------- */

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
  h->single_copy_max = common_malloc(n * sizeof *h->single_copy_max);
  uint64_t(*theirs)[4] = common_calloc(n, sizeof *theirs);
  uint64_t *nonce = common_calloc(n, sizeof *nonce), *cookies = common_calloc(n, sizeof *cookies);
  uint8_t *verdict = common_calloc(n, 1);
  fl_status status = FL_OK;
  if (!h->peer_pid || !h->single_copy_min || !h->single_copy_max || !theirs || !nonce || !cookies || !verdict) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", h->size);
    goto cleanup;
  }
  for (size_t i = 0; i < n; i++) h->single_copy_max[i] = SIZE_MAX;
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
                    comm_host_read_peer((pid_t)theirs[peer][0], &seen, at, sizeof seen) == 0 && seen == nonce[peer];
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

/* ---- topology -------------------------------------------------------------------------------- */

/* This process's host key: the kernel's boot id and the network namespace, so that ranks in
 * other namespaces of one machine count as other hosts (as they do for addresses). */
static void host_key(char key[HOST_KEY_BYTES]) {
  char boot[40] = "", ns[40] = ""; /* a boot id is 36 characters, "net:[4026531840]" 16 */
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
    fclose(f);
  }
  boot[strcspn(boot, "\n")] = '\0';
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  ns[n > 0 ? n : 0] = '\0';
  memset(key, 0, HOST_KEY_BYTES);
  snprintf(key, HOST_KEY_BYTES, "%s/%s", boot, ns);
}

/* Every rank sends its host key to every peer (all sends before any read: the keys fit in
 * the socket buffers) and numbers the hosts in the order of their lowest rank, so every
 * rank computes the same host_of[]. */
static fl_status host_topology(comm_host *h, uint64_t deadline_ns) {
  size_t n = (size_t)h->size;
  char(*keys)[HOST_KEY_BYTES] = common_calloc(n, sizeof *keys);
  h->host_of = common_malloc(n * sizeof *h->host_of);
  fl_status status = FL_OK;
  if (!keys || !h->host_of) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", h->size);
    goto cleanup;
  }
  host_key(keys[h->rank]);
  int peer;
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && io_until(h->fds[peer], keys[h->rank], HOST_KEY_BYTES, true, deadline_ns) != 0)
      goto io_failed;
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && io_until(h->fds[peer], keys[peer], HOST_KEY_BYTES, false, deadline_ns) != 0)
      goto io_failed;
  h->nhosts = 0;
  for (int r = 0; r < h->size; r++) {
    keys[r][HOST_KEY_BYTES - 1] = '\0';
    int same = -1;
    for (int q = 0; q < r && same < 0; q++)
      if (strcmp(keys[q], keys[r]) == 0) same = h->host_of[q];
    h->host_of[r] = same >= 0 ? same : h->nhosts++;
  }
  goto cleanup;
io_failed:
  status = fl_set_error(errno == ETIMEDOUT ? FL_ETIMEDOUT : FL_EPEER,
                        "rank %d: exchanging host keys with rank %d failed: %s", h->rank, peer,
                        strerror(errno));
cleanup:
  common_free(keys);
  return status;
}

/* ---- shared memory -------------------------------------------------------------------------- */

/* Pairs of ranks on one host agree on shared memory in two rounds on idle sockets (all sends
 * of a round before its reads, as in the probe):
 *   1. offer: to each same-host peer, {pid, memfd number, segment bytes, nonce} of this
 *      rank's segment ({0, -1, 0, 0} when it has none: off, or no memfd), and the ring
 *      steps it would move by single copy over shared memory (shm_single_copy_range);
 *   2. verdict: one byte each way, whether this rank mapped the peer's segment.
 * A pair uses shared memory when both verdicts are yes; the memfd is closed after the
 * verdicts (the mappings keep the memory), so nothing is left to unlink, whoever dies. Any
 * other failure leaves the pair on TCP; only a socket failure fails the mesh. A pair on
 * shared memory keeps single copy for the steps both ends' ranges hold, computed alike on
 * both ends, since the receiver of a ring step must know whether a descriptor comes. */
static fl_status shm_setup(comm_host *h, uint64_t deadline_ns) {
  size_t n = (size_t)h->size;
  int fd = -1, peer = 0;
  uint64_t bytes = 0, nonce = 0, (*their_range)[2] = NULL;
  const char *what = "offer";
  uint8_t *verdict = common_calloc(n, 1), *use = common_calloc(n, 1);
  fl_status status = FL_OK;
  if (!verdict || !use) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", h->size);
    goto cleanup;
  }
  int nlocal = 0;
  for (int r = 0; r < h->size; r++) nlocal += h->host_of[r] == h->host_of[h->rank];
  if (nlocal < 2) goto cleanup;
  if (shm_enabled()) FL_CHECK(comm_host_shm_create(h, &fd, &bytes, &nonce));
  uint64_t mine[2];
  shm_single_copy_range(mine);
  their_range = common_calloc(n, sizeof *their_range);
  if (!their_range) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a communicator of %d ranks", h->size);
    goto cleanup;
  }
  uint64_t offer[6] = {fd >= 0 ? (uint64_t)getpid() : 0, (uint64_t)(int64_t)fd, bytes, nonce, mine[0], mine[1]};
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && h->host_of[peer] == h->host_of[h->rank] &&
        io_until(h->fds[peer], offer, sizeof offer, true, deadline_ns) != 0)
      goto io_failed;
  for (peer = 0; peer < h->size; peer++) {
    if (peer == h->rank || h->host_of[peer] != h->host_of[h->rank]) continue;
    uint64_t theirs[6];
    if (io_until(h->fds[peer], theirs, sizeof theirs, false, deadline_ns) != 0) goto io_failed;
    verdict[peer] = fd >= 0 && comm_host_shm_attach(h, peer, theirs);
    their_range[peer][0] = theirs[4], their_range[peer][1] = theirs[5];
  }
  what = "verdict";
  for (peer = 0; peer < h->size; peer++)
    if (peer != h->rank && h->host_of[peer] == h->host_of[h->rank] &&
        io_until(h->fds[peer], &verdict[peer], 1, true, deadline_ns) != 0)
      goto io_failed;
  for (peer = 0; peer < h->size; peer++) {
    if (peer == h->rank || h->host_of[peer] != h->host_of[h->rank]) continue;
    uint8_t back = 0;
    if (io_until(h->fds[peer], &back, 1, false, deadline_ns) != 0) goto io_failed;
    use[peer] = verdict[peer] && back == 1;
    if (use[peer] && h->single_copy_min[peer]) {
      uint64_t lo = mine[0] > their_range[peer][0] ? mine[0] : their_range[peer][0];
      uint64_t hi = mine[1] < their_range[peer][1] ? mine[1] : their_range[peer][1];
      bool any = mine[0] && their_range[peer][0] && lo <= hi;
      h->single_copy_min[peer] = any ? (size_t)lo : 0;
      h->single_copy_max[peer] = any && hi < SIZE_MAX ? (size_t)hi : SIZE_MAX;
    }
  }
  comm_host_shm_finish(h, use);
  goto cleanup;
io_failed:
  status = fl_set_error(errno == ETIMEDOUT ? FL_ETIMEDOUT : FL_EPEER,
                        "rank %d: the shared-memory %s with rank %d failed: %s", h->rank, what, peer,
                        strerror(errno));
cleanup:
  if (fd >= 0) close(fd);
  common_free(their_range);
  common_free(verdict);
  common_free(use);
  return status;
}

fl_status comm_host_connect(fl_comm_endpoint *ep, int rank, int size, const char *const *addresses,
                            uint32_t timeout_ms, comm_host **out) {
  fl_status status = FL_OK;
  comm_host *h = NULL;
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
  FL_CHECK(host_topology(h, deadline));
  FL_CHECK(shm_setup(h, deadline));
  *out = h;
  h = NULL;
cleanup:
  comm_host_free(h);
  return status;
}
