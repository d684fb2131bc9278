/*
 * broadcast_server.c: the client's block server, which lends the values of the large
 * broadcasts in the registry (rdd_shared_lend) to the executors of its application; the
 * first large broadcast starts it. Its address's host is the one this machine uses toward
 * the driver (the server listens there only), or FLINT_CLIENT_HOST (the server listens on
 * every interface).
 *
 * Threading: the server is started under the context's lock, so once; its worker threads
 * call serve_broadcast. Stopping it returns every loan, so it stops before the registry is
 * destroyed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/config.h"

/* The executors' fetches of this client's broadcasts. Block-server worker threads. */
static fl_status serve_broadcast(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                                 uint64_t *total) {
  remote_context *c = arg;
  if (req->kind != DP_BROADCAST || req->key[0] != c->app_id)
    return FL_ERR(FL_ENOENT, "this client serves only the broadcasts of application %llu",
                  (unsigned long long)c->app_id);
  return rdd_shared_lend(c->pub.shared, req->key[1], req->offset, req->len, loan, total);
}

/* The address of this machine that packets to `peer` (HOST:PORT) leave from: a UDP socket
 * connect()ed to it sends nothing, but the kernel picks the route and so the source. */
static fl_status local_host_toward(const char *peer, char *host, size_t len) {
  char name[256];
  const char *colon = strrchr(peer, ':');
  size_t n = colon ? (size_t)(colon - peer) : 0;
  const char *h = peer;
  if (n >= 2 && peer[0] == '[' && colon[-1] == ']') {
    h++;
    n -= 2;
  }
  if (!colon || n == 0 || n >= sizeof name)
    return FL_ERR(FL_EINVAL, "the driver's address %s is not HOST:PORT", peer);
  memcpy(name, h, n);
  name[n] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(name, colon + 1, &hints, &res);
  if (rc != 0 || !res)
    return FL_ERR(FL_ENET, "cannot resolve the driver's host %s: %s", name, gai_strerror(rc));
  struct sockaddr_storage local;
  socklen_t local_len = sizeof local;
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&local, &local_len) == 0;
  int err = errno;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (ok && local.ss_family == AF_INET)
    ok = inet_ntop(AF_INET, &((struct sockaddr_in *)&local)->sin_addr, host, (socklen_t)len) != NULL;
  else if (ok && local.ss_family == AF_INET6)
    ok = inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&local)->sin6_addr, host, (socklen_t)len) != NULL;
  if (!ok)
    return FL_ERR(FL_ENET, "cannot find this machine's address toward the driver at %s: %s (set FLINT_CLIENT_HOST)",
                  peer, strerror(err));
  return FL_OK;
}

fl_status client_broadcast_server_address(remote_context *c, char address[DP_ADDRESS_MAX]) {
  client_broadcasts *b = &c->broadcasts;
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (!b->server) {
    char host[INET6_ADDRSTRLEN + 64];
    const char *env = config_string(CONFIG_CLIENT_HOST);
    if (env) {
      if (strlen(env) >= sizeof host - 2)
        st = FL_ERR(FL_EINVAL, "FLINT_CLIENT_HOST=%s is too long", env);
      else
        snprintf(host, sizeof host, "%s", env);
    } else {
      st = local_host_toward(c->driver_address, host, sizeof host);
    }
    /* A host given by name may be one this machine cannot bind (behind a NAT, say): the
     * server then listens on every interface. */
    if (st == FL_OK)
      st = dp_server_start(env && *env ? NULL : host, 0, c->secret, serve_broadcast, c, &b->server);
    if (st == FL_OK) {
      int port = dp_server_port(b->server);
      bool v6 = strchr(host, ':') != NULL;
      int n = snprintf(b->server_address, sizeof b->server_address, v6 ? "[%s]:%d" : "%s:%d", host, port);
      if (n < 0 || (size_t)n >= sizeof b->server_address) {
        st = FL_ERR(FL_EINVAL, "the broadcast server's address %s:%d is too long", host, port);
        dp_server_stop(b->server);
        b->server = NULL;
      }
    }
    if (st != FL_OK) common_error_wrap(st, "cannot serve broadcasts: ");
  }
  memcpy(address, b->server_address, DP_ADDRESS_MAX);
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return st;
}

void client_broadcast_server_stop(remote_context *c) {
  dp_server_stop(c->broadcasts.server);
  c->broadcasts.server = NULL;
}
