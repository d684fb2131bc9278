/*
 * http.c: a small read-only HTTP server (net.h) for the web UI and the REST API: libevent's
 * evhttp on one thread of its own, GET and HEAD only, requests over a size limit refused
 * with 413, the shared secret required when there is one, HTTPS with the cluster's
 * certificate when FLINT_TLS is on.
 *
 * The secret is accepted as a bearer token, as the password of HTTP basic auth (browsers ask
 * for it), or once as ?token=..., which also sets a cookie so that a browser's next pages
 * carry it. It is compared in constant time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include "net/dataplane_frame.h"
#include "net/net.h"
#include "net/tls.h"

struct http_server {
  struct event_base *base;
  struct evhttp *http;
  SSL_CTX *ssl;
  pthread_t thread;
  bool started;
  int port;
  char *secret;
  http_get_fn get;
  void *arg;
  size_t max_request;
  _Atomic uint64_t requests, refused;
};

#define COOKIE_NAME "flint_token"

/* Constant-time comparison of a candidate of `len` bytes with the secret. */
static bool secret_matches(const http_server *s, const char *candidate, size_t len) {
  size_t want = strlen(s->secret);
  unsigned char diff = (unsigned char)(len != want);
  for (size_t i = 0; i < want; i++) diff |= (unsigned char)(s->secret[i] ^ (i < len ? candidate[i] : 0));
  return diff == 0;
}

/* Whether "Basic base64(user:password)" carries the secret as its password. */
static bool basic_matches(const http_server *s, const char *b64) {
  size_t n = strlen(b64);
  if (n == 0 || n > 4096 || n % 4) return false;
  unsigned char decoded[3072 + 1];
  int len = EVP_DecodeBlock(decoded, (const unsigned char *)b64, (int)n);
  if (len < 0) return false;
  /* EVP_DecodeBlock counts the padding's zero bytes */
  while (n && b64[n - 1] == '=') n--, len--;
  decoded[len < 0 ? 0 : len] = 0;
  const char *colon = memchr(decoded, ':', (size_t)(len < 0 ? 0 : len));
  return colon && secret_matches(s, colon + 1, (size_t)len - (size_t)(colon + 1 - (char *)decoded));
}

/* The value of `name` in a query string ("a=1&token=x"), into buf; false when absent. */
static bool query_value(const char *query, const char *name, char *buf, size_t cap) {
  size_t nl = strlen(name);
  for (const char *p = query; p && *p;) {
    const char *end = strchr(p, '&');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
      size_t vl = len - nl - 1;
      if (vl >= cap) return false;
      memcpy(buf, p + nl + 1, vl);
      buf[vl] = 0;
      char *plain = evhttp_uridecode(buf, 1, NULL);
      if (!plain) return false;
      snprintf(buf, cap, "%s", plain);
      free(plain);
      return true;
    }
    p = end ? end + 1 : NULL;
  }
  return false;
}

/* Whether the request carries the secret; *set_cookie when it came as ?token=. */
static bool authorized(const http_server *s, struct evhttp_request *req, const char *query, bool *set_cookie) {
  *set_cookie = false;
  if (!s->secret) return true;
  struct evkeyvalq *headers = evhttp_request_get_input_headers(req);
  const char *auth = evhttp_find_header(headers, "Authorization");
  if (auth) {
    if (strncasecmp(auth, "Bearer ", 7) == 0 && secret_matches(s, auth + 7, strlen(auth + 7))) return true;
    if (strncasecmp(auth, "Basic ", 6) == 0 && basic_matches(s, auth + 6)) return true;
  }
  const char *cookie = evhttp_find_header(headers, "Cookie");
  for (const char *p = cookie; p && (p = strstr(p, COOKIE_NAME "=")); p += sizeof COOKIE_NAME) {
    if (p != cookie && p[-1] != ' ' && p[-1] != ';') continue;
    const char *v = p + sizeof COOKIE_NAME;
    if (secret_matches(s, v, strcspn(v, ";"))) return true;
  }
  char token[1024];
  if (query_value(query, "token", token, sizeof token) && secret_matches(s, token, strlen(token))) {
    *set_cookie = true;
    return true;
  }
  return false;
}

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *text) {
  struct evbuffer *body = evbuffer_new();
  if (body) evbuffer_add_printf(body, "%d %s: %s\n", code, reason, text);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; charset=utf-8");
  evhttp_send_reply(req, code, reason, body);
  if (body) evbuffer_free(body);
}

static const char *reason_of(int code) {
  switch (code) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 413: return "Payload Too Large";
  default: return "Internal Server Error";
  }
}

/* The request line's and headers' bytes. */
static size_t request_size(struct evhttp_request *req) {
  const char *uri = evhttp_request_get_uri(req);
  size_t n = uri ? strlen(uri) : 0;
  struct evkeyval *h;
  TAILQ_FOREACH(h, evhttp_request_get_input_headers(req), next) n += strlen(h->key) + strlen(h->value) + 4;
  return n;
}

static void on_request(struct evhttp_request *req, void *arg) {
  http_server *s = arg;
  atomic_fetch_add(&s->requests, 1);
  if (request_size(req) > s->max_request) {
    char why[96];
    snprintf(why, sizeof why, "a request's line and headers may take %zu bytes", s->max_request);
    reply_text(req, 413, reason_of(413), why);
    return;
  }
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
    reply_text(req, 405, reason_of(405), "the UI is read-only: GET and HEAD only");
    return;
  }
  const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
  const char *raw_path = uri ? evhttp_uri_get_path(uri) : NULL;
  const char *query = uri ? evhttp_uri_get_query(uri) : NULL;
  bool set_cookie;
  if (!authorized(s, req, query, &set_cookie)) {
    atomic_fetch_add(&s->refused, 1);
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Basic realm=\"flint\"");
    reply_text(req, 401, reason_of(401), "this UI needs the cluster's shared secret (docs/ui.md)");
    return;
  }
  char *path = evhttp_uridecode(raw_path && *raw_path ? raw_path : "/", 0, NULL);
  if (!path) {
    reply_text(req, 400, reason_of(400), "malformed path");
    return;
  }
  fl_buf body = FL_BUF_INIT;
  const char *type = "text/plain; charset=utf-8";
  int code = s->get(s->arg, path, query, &body, &type);
  free(path);
  struct evkeyvalq *out = evhttp_request_get_output_headers(req);
  evhttp_add_header(out, "Content-Type", type);
  evhttp_add_header(out, "Cache-Control", "no-store");
  evhttp_add_header(out, "X-Content-Type-Options", "nosniff");
  if (set_cookie) {
    char cookie[1200];
    snprintf(cookie, sizeof cookie, COOKIE_NAME "=%s; Path=/; HttpOnly; SameSite=Strict", s->secret);
    evhttp_add_header(out, "Set-Cookie", cookie);
  }
  struct evbuffer *buf = evbuffer_new();
  if (buf && body.len) evbuffer_add(buf, body.data, body.len);
  evhttp_send_reply(req, code, reason_of(code), buf);
  if (buf) evbuffer_free(buf);
  fl_buf_free(&body);
}

/* HTTPS: each connection's bufferevent speaks TLS. */
static struct bufferevent *tls_bufferevent(struct event_base *base, void *arg) {
  SSL *ssl = SSL_new(arg);
  if (!ssl) return NULL;
  return bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
}

static void *loop_main(void *arg) {
  http_server *s = arg;
  pthread_setname_np(pthread_self(), "fl-http");
  /* the lowest priority: a page never takes a core from the scheduler or the tasks */
  struct sched_param none = {0};
  if (sched_setscheduler(0, SCHED_IDLE, &none) != 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  event_base_dispatch(s->base);
  return NULL;
}

fl_status http_server_start(const http_server_config *cfg, http_server **out) {
  *out = NULL;
  fl_status status = FL_OK;
  dp_evthread_setup(); /* the stop's loopbreak comes from another thread */
  http_server *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory");
  s->get = cfg->get;
  s->arg = cfg->arg;
  if (cfg->secret && *cfg->secret && !(s->secret = common_strdup(cfg->secret)))
    FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory"));
  net_tls tls;
  status = net_tls_read(NET_TLS_SERVER, &tls);
  if (status == FL_OK && tls.on) status = net_tls_context(&tls, NET_TLS_SERVER, &s->ssl);
  net_tls_free(&tls);
  FL_CHECK(status);
  if (!(s->base = event_base_new()) || !(s->http = evhttp_new(s->base)))
    FL_CHECK(FL_ERR(FL_ENOMEM, "cannot create the HTTP server"));
  s->max_request = cfg->max_request ? cfg->max_request : HTTP_MAX_REQUEST;
  /* libevent answers headers over its limit with 400: it takes 16 times ours, and
   * on_request refuses what is over ours with 413. Bodies over ours get libevent's 413. */
  evhttp_set_max_headers_size(s->http, (ev_ssize_t)(16 * s->max_request));
  evhttp_set_max_body_size(s->http, (ev_ssize_t)s->max_request);
  evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                          EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH | EVHTTP_REQ_OPTIONS);
  evhttp_set_timeout(s->http, 30);
  evhttp_set_gencb(s->http, on_request, s);
  if (s->ssl) evhttp_set_bevcb(s->http, tls_bufferevent, s->ssl);
  const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
  struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(s->http, host, (ev_uint16_t)cfg->port);
  if (!bound)
    FL_CHECK(FL_ERR(FL_ENET, "the web UI cannot listen on %s:%d: %s", host, cfg->port, strerror(errno)));
  struct sockaddr_storage addr;
  socklen_t len = sizeof addr;
  if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&addr, &len) != 0)
    FL_CHECK(FL_ERR(FL_ENET, "getsockname: %s", strerror(errno)));
  s->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                             : ((struct sockaddr_in *)&addr)->sin_port);
  if (pthread_create(&s->thread, NULL, loop_main, s) != 0)
    FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start the web UI's thread"));
  s->started = true;
  *out = s;
  return FL_OK;
cleanup:
  http_server_stop(s);
  return status;
}

int http_server_port(const http_server *s) { return s ? s->port : -1; }

/* Runs on the loop's thread. */
static void on_stop(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  event_base_loopbreak(arg);
}

void http_server_stop(http_server *s) {
  if (!s) return;
  if (s->started) {
    /* An event, not event_base_loopbreak from here: the loop clears its break flag as it
     * starts, so a stop that came before the thread (at the lowest priority) reached the loop
     * was lost and the join waited for ever. A queued event runs whenever the loop does. */
    if (event_base_once(s->base, -1, EV_TIMEOUT, on_stop, s->base, &(struct timeval){0, 0}) != 0)
      event_base_loopbreak(s->base); /* out of memory: the old way */
    FL_PCHECK(pthread_join(s->thread, NULL));
  }
  if (s->http) evhttp_free(s->http);
  if (s->base) event_base_free(s->base);
  if (s->ssl) SSL_CTX_free(s->ssl);
  common_free(s->secret);
  common_free(s);
}
