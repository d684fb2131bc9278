/*
 * ps/wire.c: the parameter server's frames and its blocking socket I/O (ps/wire.h). Sockets
 * are non-blocking and every read and write polls with what is left of its deadline, so a
 * stalled peer costs a timeout, never a hung thread.
 */
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
#include <fcntl.h>

#include "ps/wire.h"

static const char *const op_names[] = {"?", "hello", "host", "push", "pull", "push-range", "pull-range",
                                       "set-range", "clock", "retire", "save", "load", "promote", "drop",
                                       "replicate", "adopt", "clock-of", "targets", "where", "column", "clocks"};

const char *ps_op_name(uint8_t op) {
  op &= (uint8_t) ~(PS_OP_REPLY | PS_OP_FORWARDED);
  return op >= 1 && op <= PS_OP_LAST ? op_names[op] : "?";
}

void ps_wire_encode(uint8_t out[PS_WIRE_HEADER], const ps_frame *f) {
  memset(out, 0, PS_WIRE_HEADER);
  common_put_u32(out, PS_WIRE_MAGIC);
  out[4] = PS_WIRE_VERSION;
  out[5] = f->op;
  common_put_u16(out + 6, f->status);
  common_put_u32(out + 8, f->table);
  common_put_u32(out + 12, f->shard);
  common_put_u32(out + 16, f->worker);
  common_put_u32(out + 20, f->staleness);
  common_put_u64(out + 24, f->seq);
  common_put_u64(out + 32, f->clock);
  common_put_u64(out + 40, f->arg);
  common_put_u64(out + 48, f->len);
  common_put_u32(out + 56, f->crc);
  common_put_u32(out + 60, common_crc32c(0, out, 60));
}

const char *ps_wire_decode(const uint8_t in[PS_WIRE_HEADER], ps_frame *f) {
  if (common_get_u32(in) != PS_WIRE_MAGIC) return "not a parameter-server frame (bad magic)";
  if (common_get_u32(in + 60) != common_crc32c(0, in, 60)) return "the frame header's checksum does not match";
  if (in[4] != PS_WIRE_VERSION) return "unsupported frame version";
  f->op = in[5];
  uint8_t base = f->op & (uint8_t) ~(PS_OP_REPLY | PS_OP_FORWARDED);
  if (base < 1 || base > PS_OP_LAST) return "unknown operation";
  f->status = common_get_u16(in + 6);
  f->table = common_get_u32(in + 8);
  f->shard = common_get_u32(in + 12);
  f->worker = common_get_u32(in + 16);
  f->staleness = common_get_u32(in + 20);
  f->seq = common_get_u64(in + 24);
  f->clock = common_get_u64(in + 32);
  f->arg = common_get_u64(in + 40);
  f->len = common_get_u64(in + 48);
  f->crc = common_get_u32(in + 56);
  return NULL;
}

fl_status ps_wire_targets_encode(const char (*targets)[PS_ADDRESS_MAX], uint32_t n, fl_buf *out) {
  uint8_t head[4];
  common_put_u32(head, n);
  fl_status st = fl_buf_append(out, head, 4);
  for (uint32_t i = 0; st == FL_OK && i < n; i++) {
    size_t len = strnlen(targets[i], PS_ADDRESS_MAX - 1);
    uint8_t l[2];
    common_put_u16(l, (uint16_t)len);
    st = fl_buf_append(out, l, 2);
    if (st == FL_OK) st = fl_buf_append(out, targets[i], len);
  }
  return st == FL_OK ? st : FL_ERR(FL_ENOMEM, "parameter server: out of memory");
}

fl_status ps_wire_targets_decode(fl_bytes in, char (*targets)[PS_ADDRESS_MAX], uint32_t *n, size_t *used) {
  if (in.len < 4) return fl_set_error(FL_EPROTO, "parameter server: a target list without its count");
  uint32_t count = common_get_u32(in.data);
  if (count > PS_MAX_BACKUPS)
    return fl_set_error(FL_EPROTO, "parameter server: %u targets (at most %d)", count, PS_MAX_BACKUPS);
  size_t at = 4;
  for (uint32_t i = 0; i < count; i++) {
    if (in.len - at < 2) return fl_set_error(FL_EPROTO, "parameter server: a target list is cut short");
    size_t len = common_get_u16(in.data + at);
    at += 2;
    if (len == 0 || len >= PS_ADDRESS_MAX || in.len - at < len)
      return fl_set_error(FL_EPROTO, "parameter server: a target's address is malformed");
    memcpy(targets[i], in.data + at, len);
    targets[i][len] = 0;
    at += len;
  }
  for (uint32_t i = count; i < PS_MAX_BACKUPS; i++) targets[i][0] = 0;
  *n = count;
  *used = at;
  return FL_OK;
}

void ps_wire_column_encode(const ps_column_op *op, uint8_t out[PS_WIRE_COLUMN_BYTES]) {
  memset(out, 0, PS_WIRE_COLUMN_BYTES);
  out[0] = (uint8_t)op->kind;
  common_put_u32(out + 4, op->x);
  common_put_u32(out + 8, op->y);
  memcpy(out + 16, &op->alpha, 8);
  common_put_u64(out + 24, op->lo);
  common_put_u64(out + 32, op->count);
}

fl_status ps_wire_column_decode(fl_bytes in, ps_column_op *op) {
  static const uint8_t zero[4] = {0};
  if (in.len < PS_WIRE_COLUMN_BYTES || memcmp(in.data + 1, zero, 3) != 0 || memcmp(in.data + 12, zero, 4) != 0)
    return fl_set_error(FL_EPROTO, "parameter server: a column request without a valid descriptor (%zu bytes)", in.len);
  if (in.data[0] < 1 || in.data[0] > PS_COLUMN_LAST)
    return fl_set_error(FL_EINVAL, "parameter server: unknown column operation %u", in.data[0]);
  op->kind = (ps_column_kind)in.data[0];
  op->x = common_get_u32(in.data + 4);
  op->y = common_get_u32(in.data + 8);
  memcpy(&op->alpha, in.data + 16, 8);
  op->lo = common_get_u64(in.data + 24);
  op->count = common_get_u64(in.data + 32);
  return FL_OK;
}

/* ---- HOST's payload: 48 bytes and the target list ----
 *  0 u8 sparse, 3 zero   4 u32 width   8 u64 keys   16 u32 update kind   20 f32 lr, beta1,
 *  beta2, eps (to 36)   36 u32 shards   40 u32 index   44 u32 workers   48 the targets */
#define HOST_FIXED 48u

fl_status ps_wire_host_encode(const ps_host_request *h, fl_buf *out) {
  uint8_t b[HOST_FIXED] = {0};
  b[0] = h->spec.sparse;
  common_put_u32(b + 4, h->spec.width);
  common_put_u64(b + 8, h->spec.keys);
  ps_update_put(b + 16, &h->spec.update);
  common_put_u32(b + 36, h->shards);
  common_put_u32(b + 40, h->index);
  common_put_u32(b + 44, h->workers);
  if (fl_buf_append(out, b, sizeof b) != FL_OK) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  return ps_wire_targets_encode(h->targets, h->num_targets, out);
}

fl_status ps_wire_host_decode(fl_bytes in, ps_host_request *h) {
  if (in.len < HOST_FIXED) return fl_set_error(FL_EPROTO, "parameter server: a host request of %zu bytes", in.len);
  memset(h, 0, sizeof *h);
  size_t used;
  fl_status st = ps_wire_targets_decode(fl_bytes_of(in.data + HOST_FIXED, in.len - HOST_FIXED), h->targets,
                                        &h->num_targets, &used);
  if (st != FL_OK) return st;
  if (HOST_FIXED + used != in.len) return fl_set_error(FL_EPROTO, "parameter server: a host request has trailing bytes");
  h->spec.sparse = in.data[0] != 0;
  h->spec.width = common_get_u32(in.data + 4);
  h->spec.keys = common_get_u64(in.data + 8);
  uint32_t kind = ps_update_get(in.data + 16, &h->spec.update);
  if (kind > PS_UPDATE_ADAM) return fl_set_error(FL_EPROTO, "parameter server: unknown update function %u", kind);
  h->shards = common_get_u32(in.data + 36);
  h->index = common_get_u32(in.data + 40);
  h->workers = common_get_u32(in.data + 44);
  return FL_OK;
}

/* ---- a replica's state ---- */

fl_status ps_wire_replica_encode(const ps_shard *shard, ps_clocks *clocks, const uint64_t *last_seq, uint32_t workers,
                                 fl_buf *out) {
  uint8_t head[8] = {0};
  common_put_u32(head, workers);
  if (fl_buf_append(out, head, sizeof head) != FL_OK) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t w = 0; w < workers; w++) {
    uint8_t row[24];
    bool retired;
    common_put_u64(row, ps_clocks_state(clocks, w, &retired));
    common_put_u64(row + 8, last_seq[w]);
    common_put_u64(row + 16, retired);
    if (fl_buf_append(out, row, sizeof row) != FL_OK) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  fl_buf blob = FL_BUF_INIT; /* ps_shard_encode replaces its buffer's contents */
  fl_status st = ps_shard_encode(shard, &blob);
  if (st == FL_OK && fl_buf_append(out, blob.data, blob.len) != FL_OK)
    st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  fl_buf_free(&blob);
  return st;
}

fl_status ps_wire_replica_adopt(fl_bytes in, ps_shard *shard, ps_clocks *clocks, uint64_t *last_seq, uint32_t workers) {
  if (in.len < 8 || common_get_u32(in.data) != workers || in.len - 8 < (uint64_t)workers * 24)
    return fl_set_error(FL_EPROTO, "parameter server: a replica's state is not for %u workers", workers);
  size_t at = 8 + (size_t)workers * 24;
  fl_status st = ps_shard_decode(shard, fl_bytes_of(in.data + at, in.len - at));
  if (st != FL_OK) return st;
  for (uint32_t w = 0; w < workers; w++) {
    const uint8_t *row = in.data + 8 + (size_t)w * 24;
    ps_clocks_restore(clocks, w, common_get_u64(row), common_get_u64(row + 16) != 0);
    last_seq[w] = common_get_u64(row + 8);
  }
  return FL_OK;
}

/* ---- sockets ---- */

static int wait_for(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    int ms = -1;
    if (deadline_ns) {
      uint64_t now = common_now_ns();
      if (now >= deadline_ns) return 0;
      ms = (int)((deadline_ns - now + 999999) / 1000000);
    }
    struct pollfd p = {.fd = fd, .events = events};
    int rc = poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    return rc; /* > 0 ready (or an error the next call reports), 0 timed out */
  }
}

static fl_status split_address(const char *address, char *host, size_t hostcap, char *port) {
  const char *colon = strrchr(address, ':');
  size_t hlen = colon ? (size_t)(colon - address) : 0;
  if (!colon || hlen == 0 || hlen >= hostcap || !colon[1] || strlen(colon + 1) > 5)
    return fl_set_error(FL_EINVAL, "parameter server: '%s' is not HOST:PORT", address);
  const char *h = address;
  if (h[0] == '[' && hlen >= 2 && h[hlen - 1] == ']') h++, hlen -= 2; /* [v6] */
  memcpy(host, h, hlen);
  host[hlen] = 0;
  strcpy(port, colon + 1);
  return FL_OK;
}

static void set_socket_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

fl_status ps_wire_connect(const char *address, uint32_t timeout_ms, int *out) {
  char host[PS_ADDRESS_MAX], port[8];
  fl_status st = split_address(address, host, sizeof host, port);
  if (st != FL_OK) return st;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0 || !res)
    return fl_set_error(FL_ENET, "parameter server %s: cannot resolve: %s", address, gai_strerror(rc));
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return fl_set_error(FL_ENET, "parameter server %s: socket: %s", address, strerror(errno));
  }
  set_socket_options(fd);
  uint64_t deadline = ps_wire_deadline(timeout_ms ? timeout_ms : 30000);
  rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  int err = rc == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    if (wait_for(fd, POLLOUT, deadline) == 0) {
      close(fd);
      return fl_set_error(FL_ETIMEDOUT, "parameter server %s: no connection within %u ms", address, timeout_ms);
    }
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  if (err != 0) {
    close(fd);
    return fl_set_error(FL_ENET, "parameter server %s: cannot connect: %s", address, strerror(err));
  }
  *out = fd;
  return FL_OK;
}

fl_status ps_wire_listen(const char *host, int port, int *out, int *bound_port) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc != 0 || !res)
    return fl_set_error(FL_ENET, "parameter server: cannot resolve %s: %s", host ? host : "*", gai_strerror(rc));
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return fl_set_error(FL_ENET, "parameter server cannot listen on %s:%d: %s", host ? host : "*", port, strerror(err));
  }
  freeaddrinfo(res);
  struct sockaddr_storage a;
  socklen_t alen = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &alen);
  *bound_port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                              : ((struct sockaddr_in *)&a)->sin_port);
  *out = fd;
  return FL_OK;
}

fl_status ps_wire_send(int fd, const ps_frame *f, const void *a, size_t alen, const void *b, size_t blen,
                       uint64_t deadline_ns, const char *peer) {
  ps_frame g = *f;
  g.len = alen + blen;
  g.crc = common_crc32c(common_crc32c(0, a, alen), b, blen);
  uint8_t head[PS_WIRE_HEADER];
  ps_wire_encode(head, &g);
  struct iovec iov[3] = {{head, sizeof head}, {(void *)a, alen}, {(void *)b, blen}};
  int first = 0;
  while (first < 3) {
    if (iov[first].iov_len == 0) {
      first++;
      continue;
    }
    struct msghdr m = {.msg_iov = iov + first, .msg_iovlen = (size_t)(3 - first)};
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (wait_for(fd, POLLOUT, deadline_ns) == 0)
          return fl_set_error(FL_ETIMEDOUT, "parameter server %s: a %s stalled while being sent", peer,
                              ps_op_name(f->op));
        continue;
      }
      return fl_set_error(FL_ENET, "parameter server %s: connection lost while sending: %s", peer, strerror(errno));
    }
    for (size_t left = (size_t)n; left && first < 3;) {
      size_t take = left < iov[first].iov_len ? left : iov[first].iov_len;
      iov[first].iov_base = (uint8_t *)iov[first].iov_base + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) first++;
    }
  }
  return FL_OK;
}

fl_status ps_wire_read(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *peer, bool *eof) {
  size_t got = 0;
  if (eof) *eof = false;
  while (got < len) {
    ssize_t n = recv(fd, (uint8_t *)buf + got, len - got, 0);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0) {
      if (eof) *eof = got == 0;
      return fl_set_error(FL_ENET, "parameter server %s: the connection was closed", peer);
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return fl_set_error(FL_ENET, "parameter server %s: connection lost: %s", peer, strerror(errno));
    if (wait_for(fd, POLLIN, deadline_ns) == 0)
      return fl_set_error(FL_ETIMEDOUT, "parameter server %s: no answer in time", peer);
  }
  return FL_OK;
}

fl_status ps_wire_recv(int fd, ps_frame *f, fl_buf *payload, uint64_t max_len, uint64_t first_deadline_ns,
                       uint32_t timeout_ms, const char *peer, bool *eof) {
  uint8_t head[PS_WIRE_HEADER];
  fl_status st = ps_wire_read(fd, head, 1, first_deadline_ns, peer, eof);
  if (st == FL_OK) st = ps_wire_read(fd, head + 1, sizeof head - 1, ps_wire_deadline(timeout_ms), peer, NULL);
  if (st != FL_OK) return st;
  const char *bad = ps_wire_decode(head, f);
  if (bad) return fl_set_error(FL_EPROTO, "parameter server %s: %s", peer, bad);
  if (f->len > max_len)
    return fl_set_error(FL_ELIMIT, "parameter server %s: a %s of %llu bytes is over the limit of %llu bytes", peer,
                        ps_op_name(f->op), (unsigned long long)f->len, (unsigned long long)max_len);
  payload->len = 0;
  if (fl_buf_reserve(payload, (size_t)f->len) != FL_OK)
    return FL_ERR(FL_ENOMEM, "parameter server: out of memory for a %llu-byte frame", (unsigned long long)f->len);
  /* A large payload may take a while on a busy host: the timeout is for a stall, so it is
   * given again for every 64 MiB. */
  for (uint64_t done = 0; done < f->len;) {
    size_t part = f->len - done < ((size_t)64 << 20) ? (size_t)(f->len - done) : ((size_t)64 << 20);
    st = ps_wire_read(fd, payload->data + done, part, ps_wire_deadline(timeout_ms), peer, NULL);
    if (st != FL_OK) return st;
    done += part;
  }
  payload->len = (size_t)f->len;
  if (common_crc32c(0, payload->data, payload->len) != f->crc)
    return fl_set_error(FL_ECORRUPT, "parameter server %s: a %s's payload does not match its checksum", peer,
                        ps_op_name(f->op));
  return FL_OK;
}
