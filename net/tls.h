/*
 * tls.h: the TLS settings both planes share, private to net/.
 *
 * FLINT_TLS turns TLS on for every server and client of a process: gRPC's SSL credentials on
 * the control plane (rpc.c, rpc_client.c), OpenSSL under libevent on the data plane
 * (dataplane.c, dataplane_client.c). Servers present FLINT_TLS_CERT with FLINT_TLS_KEY;
 * clients check a server's certificate against FLINT_TLS_CA and for the host they dialled (or
 * FLINT_TLS_SERVER_NAME, so that one certificate can serve a whole cluster). TLS encrypts and
 * authenticates servers; the shared secret (FLINT_SECRET), now inside TLS, authenticates
 * clients, as Spark's spark.authenticate does beside spark.ssl.
 *
 * The files are read and checked when a server or client is made, so a missing file, a file
 * that is not PEM, or a key that does not match its certificate fails there with a message
 * that names the setting and the file, not at the first handshake.
 */
#ifndef FLINT_NET_TLS_H
#define FLINT_NET_TLS_H

#include "common/common.h"

typedef struct ssl_ctx_st SSL_CTX;

typedef enum net_tls_role {
  NET_TLS_SERVER, /* needs the certificate and its key */
  NET_TLS_CLIENT, /* needs the CA certificates */
} net_tls_role;

/* The settings as one process reads them. Text is NUL-terminated PEM. */
typedef struct net_tls {
  bool on;           /* FLINT_TLS */
  char *ca_pem;      /* FLINT_TLS_CA's contents, or NULL */
  char *cert_pem;    /* FLINT_TLS_CERT's contents, or NULL */
  char *key_pem;     /* FLINT_TLS_KEY's contents, or NULL */
  char *server_name; /* FLINT_TLS_SERVER_NAME, or NULL: the host dialled */
} net_tls;

/* Reads the settings into *out (zeroed first). TLS off: FL_OK with out->on false and nothing
 * read. On: reads and checks the files `role` needs (and those given beyond them); FL_EINVAL
 * naming the setting and the file for one that is missing, unreadable, not PEM, or a key that
 * does not match the certificate. Free with net_tls_free, on success or failure. */
FL_INTERNAL fl_status net_tls_read(net_tls_role role, net_tls *out);
FL_INTERNAL void net_tls_free(net_tls *t);

/* An OpenSSL context for the data plane, from settings that are on: a server's presents the
 * certificate; a client's verifies peers against the CA (the host name is set per connection,
 * net_tls_expect_host). TLS 1.2 at least. FL_EINVAL with OpenSSL's reason on failure. */
FL_INTERNAL fl_status net_tls_context(const net_tls *t, net_tls_role role, SSL_CTX **out);
/* Makes `ssl` (a client connection of a net_tls_context) accept only a certificate for
 * t->server_name, else for `host` (an IP address or a DNS name). */
typedef struct ssl_st SSL;
FL_INTERNAL fl_status net_tls_expect_host(const net_tls *t, SSL *ssl, const char *host);
/* OpenSSL's queued errors as one line ("certificate verify failed"), emptying the queue; `buf`
 * holds the text. */
FL_INTERNAL const char *net_tls_errors(char *buf, size_t cap);

/* Whether the server at `target` ("HOST:PORT") completes a TLS handshake (its certificate
 * unchecked) within timeout_ms: for a client without TLS to say why a server closed its
 * connection. Blocks up to timeout_ms; the server may log a failed handshake. tls_probe.c */
FL_INTERNAL bool net_tls_probe(const char *target, int timeout_ms);

#endif /* FLINT_NET_TLS_H */
