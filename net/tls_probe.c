/*
 * tls_probe.c: asks a server whether it speaks TLS, so that a client without TLS can say why
 * a server closed its connection (the contract is in tls.h). Only failure paths use it.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "net/tls.h"

/* Waits until fd is ready for `events` or the deadline passes: true when ready. */
static bool probe_wait(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    uint64_t now = common_now_ns();
    if (now >= deadline_ns) return false;
    struct pollfd p = {fd, events, 0};
    int ms = (int)((deadline_ns - now + 999999) / 1000000);
    int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
  }
}

/* A TCP connection to host:port, or -1. */
static int probe_connect(const char *host, const char *port, uint64_t deadline_ns) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, port, &hints, &res) != 0) return -1;
  int fd = -1;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int err = 0;
    socklen_t len = sizeof err;
    bool ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
              (errno == EINPROGRESS && probe_wait(fd, POLLOUT, deadline_ns) &&
               getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
    if (!ok) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

bool net_tls_probe(const char *target, int timeout_ms) {
  uint64_t deadline = common_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
  char host[256];
  const char *colon = target ? strrchr(target, ':') : NULL;
  if (!colon || (size_t)(colon - target) >= sizeof host) return false;
  memcpy(host, target, (size_t)(colon - target));
  host[colon - target] = '\0';
  char *name = host;
  size_t n = strlen(name);
  if (n >= 2 && name[0] == '[' && name[n - 1] == ']') { /* "[::1]:7077" */
    name[n - 1] = '\0';
    name++;
  }
  int fd = probe_connect(name, colon + 1, deadline);
  if (fd < 0) return false;
  /* OpenSSL writes with write(2), and a server that does not speak TLS may have closed the
   * connection: the SIGPIPE that raises is held on this thread and dropped, leaving the
   * process's handling of signals alone. */
  sigset_t pipe_set, old_mask, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
  bool pipe_was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
  bool tls = false;
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  SSL *ssl = ctx ? SSL_new(ctx) : NULL;
  if (ssl && SSL_set_fd(ssl, fd) == 1) {
    /* Whether it speaks TLS, not who it is: the certificate is not checked. A gRPC server
     * wants HTTP/2 named (ALPN). */
    SSL_set_verify(ssl, SSL_VERIFY_NONE, NULL);
    static const unsigned char alpn[] = {2, 'h', '2'};
    SSL_set_alpn_protos(ssl, alpn, sizeof alpn);
    for (;;) {
      int rc = SSL_connect(ssl);
      if (rc == 1) {
        tls = true;
        break;
      }
      int e = SSL_get_error(ssl, rc);
      if (e == SSL_ERROR_WANT_READ ? !probe_wait(fd, POLLIN, deadline)
          : e == SSL_ERROR_WANT_WRITE ? !probe_wait(fd, POLLOUT, deadline)
                                      : true)
        break;
    }
  }
  ERR_clear_error(); /* a server that does not speak TLS leaves reasons queued */
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  if (!pipe_was_pending) {
    struct timespec now = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &now) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
  return tls;
}
