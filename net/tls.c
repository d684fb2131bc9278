/*
 * tls.c: reads and checks the TLS settings both planes use (the contract is in tls.h), and
 * makes the data plane's OpenSSL contexts.
 */
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/config.h"
#include "net/tls.h"

const char *net_tls_errors(char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    const char *reason = ERR_reason_error_string(e);
    char code[32];
    if (!reason) {
      snprintf(code, sizeof code, "error %lx", e);
      reason = code;
    }
    if (used + 1 < cap && !strstr(buf, reason)) /* the same reason queued twice reads once */
      used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? "; " : "", reason);
    if (used >= cap) used = cap - 1;
  }
  if (!buf[0]) snprintf(buf, cap, "no reason given");
  return buf;
}

/* The file of setting `id` as NUL-terminated text in *out; FL_EINVAL naming both otherwise. */
static fl_status read_pem_file(config_id id, char **out) {
  const char *name = config_setting_of(id)->name;
  const char *path = config_string(id);
  fl_buf buf = FL_BUF_INIT;
  fl_status st = common_read_file(path, &buf);
  if (st == FL_OK && buf.len == 0) st = FL_ERR(FL_EINVAL, "it is empty");
  if (st == FL_OK) st = fl_buf_append(&buf, "", 1);
  if (st != FL_OK) {
    fl_buf_free(&buf);
    return common_error_wrap(FL_EINVAL, "%s=%s cannot be used: ", name, path);
  }
  *out = (char *)buf.data;
  return FL_OK;
}

/* Parses PEM text into certificates (`want_key` false: at least one X509) or a private key. */
static fl_status check_pem(config_id id, const char *pem, bool want_key, EVP_PKEY **key_out,
                           X509 **cert_out) {
  BIO *bio = BIO_new_mem_buf(pem, -1);
  if (!bio) return FL_ERR(FL_ENOMEM, "cannot read PEM text");
  char why[256];
  fl_status st = FL_OK;
  if (want_key) {
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
    if (!key)
      st = FL_ERR(FL_EINVAL, "%s=%s holds no PEM private key (%s)", config_setting_of(id)->name,
                  config_string(id), net_tls_errors(why, sizeof why));
    else if (key_out) *key_out = key;
    else EVP_PKEY_free(key);
  } else {
    X509 *cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);
    if (!cert)
      st = FL_ERR(FL_EINVAL, "%s=%s holds no PEM certificate (%s)", config_setting_of(id)->name,
                  config_string(id), net_tls_errors(why, sizeof why));
    else if (cert_out) *cert_out = cert;
    else X509_free(cert);
  }
  ERR_clear_error();
  BIO_free(bio);
  return st;
}

static fl_status read_setting(config_id id, bool required, const char *why_required, char **out) {
  if (!config_given(id)) {
    if (!required) return FL_OK;
    return FL_ERR(FL_EINVAL, "FLINT_TLS is on but %s is not set (%s)", config_setting_of(id)->name,
                  why_required);
  }
  return read_pem_file(id, out);
}

fl_status net_tls_read(net_tls_role role, net_tls *out) {
  memset(out, 0, sizeof *out);
  out->on = config_bool(CONFIG_TLS);
  if (!out->on) return FL_OK;
  bool server = role == NET_TLS_SERVER;
  fl_status status = FL_OK;
  FL_CHECK(read_setting(CONFIG_TLS_CA, !server, "the certificates a server's must chain to", &out->ca_pem));
  FL_CHECK(read_setting(CONFIG_TLS_CERT, server, "the certificate this server presents", &out->cert_pem));
  FL_CHECK(read_setting(CONFIG_TLS_KEY, server, "the key of FLINT_TLS_CERT", &out->key_pem));
  if (!out->cert_pem != !out->key_pem)
    FL_CHECK(FL_ERR(FL_EINVAL, "%s is set but %s is not", out->cert_pem ? "FLINT_TLS_CERT" : "FLINT_TLS_KEY",
                    out->cert_pem ? "FLINT_TLS_KEY" : "FLINT_TLS_CERT"));
  if (out->ca_pem) FL_CHECK(check_pem(CONFIG_TLS_CA, out->ca_pem, false, NULL, NULL));
  if (out->cert_pem) {
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    fl_status st = check_pem(CONFIG_TLS_CERT, out->cert_pem, false, NULL, &cert);
    if (st == FL_OK) st = check_pem(CONFIG_TLS_KEY, out->key_pem, true, &key, NULL);
    if (st == FL_OK && X509_check_private_key(cert, key) != 1)
      st = FL_ERR(FL_EINVAL, "FLINT_TLS_KEY=%s is not the key of FLINT_TLS_CERT=%s", config_string(CONFIG_TLS_KEY),
                  config_string(CONFIG_TLS_CERT));
    ERR_clear_error();
    X509_free(cert);
    EVP_PKEY_free(key);
    FL_CHECK(st);
  }
  if (config_given(CONFIG_TLS_SERVER_NAME)) {
    out->server_name = common_strdup(config_string(CONFIG_TLS_SERVER_NAME));
    if (!out->server_name) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy FLINT_TLS_SERVER_NAME"));
  }
cleanup:
  return status;
}

void net_tls_free(net_tls *t) {
  if (!t) return;
  common_free(t->ca_pem);
  common_free(t->cert_pem);
  if (t->key_pem) OPENSSL_cleanse(t->key_pem, strlen(t->key_pem));
  common_free(t->key_pem);
  common_free(t->server_name);
  memset(t, 0, sizeof *t);
}

/* Adds every certificate of the PEM text to the context's trust store. */
static bool trust_pem(SSL_CTX *ctx, const char *pem) {
  BIO *bio = BIO_new_mem_buf(pem, -1);
  if (!bio) return false;
  X509_STORE *store = SSL_CTX_get_cert_store(ctx);
  int added = 0;
  X509 *cert;
  while ((cert = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
    if (X509_STORE_add_cert(store, cert) == 1) added++;
    X509_free(cert);
  }
  ERR_clear_error(); /* the end of the text reads as an error */
  BIO_free(bio);
  return added > 0;
}

/* Uses the PEM chain (leaf first) and key as the context's own certificate. */
static bool use_pem_chain(SSL_CTX *ctx, const char *cert_pem, const char *key_pem) {
  BIO *bio = BIO_new_mem_buf(cert_pem, -1);
  BIO *kbio = BIO_new_mem_buf(key_pem, -1);
  bool ok = bio && kbio;
  X509 *leaf = ok ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
  ok = ok && leaf && SSL_CTX_use_certificate(ctx, leaf) == 1;
  X509 *extra;
  while (ok && (extra = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL)
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      ok = false;
    }
  if (ok) ERR_clear_error(); /* the end of the chain reads as an error */
  EVP_PKEY *key = ok ? PEM_read_bio_PrivateKey(kbio, NULL, NULL, NULL) : NULL;
  ok = ok && key && SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  X509_free(leaf);
  BIO_free(bio);
  BIO_free(kbio);
  return ok;
}

fl_status net_tls_context(const net_tls *t, net_tls_role role, SSL_CTX **out) {
  FL_ASSERT(t->on);
  char why[256];
  bool server = role == NET_TLS_SERVER;
  SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!ctx) return FL_ERR(FL_ENOMEM, "cannot make a TLS context: %s", net_tls_errors(why, sizeof why));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  /* A connection may be written from a moved buffer after a partial write (libevent does). */
  SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
  fl_status st = FL_OK;
  if (server && !use_pem_chain(ctx, t->cert_pem, t->key_pem))
    st = FL_ERR(FL_EINVAL, "cannot use FLINT_TLS_CERT and FLINT_TLS_KEY: %s", net_tls_errors(why, sizeof why));
  if (st == FL_OK && !server) {
    if (!trust_pem(ctx, t->ca_pem))
      st = FL_ERR(FL_EINVAL, "FLINT_TLS_CA holds no usable certificate: %s", net_tls_errors(why, sizeof why));
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  }
  if (st != FL_OK) {
    SSL_CTX_free(ctx);
    return st;
  }
  *out = ctx;
  return FL_OK;
}

fl_status net_tls_expect_host(const net_tls *t, SSL *ssl, const char *host) {
  const char *name = t->server_name ? t->server_name : host;
  X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
  ASN1_OCTET_STRING *ip = a2i_IPADDRESS(name); /* NULL: not an address but a name */
  int ok;
  if (ip) {
    ok = X509_VERIFY_PARAM_set1_ip(param, ASN1_STRING_get0_data(ip), (size_t)ASN1_STRING_length(ip));
    ASN1_OCTET_STRING_free(ip);
  } else {
    ERR_clear_error();
    ok = X509_VERIFY_PARAM_set1_host(param, name, 0);
    if (ok == 1 && SSL_set_tlsext_host_name(ssl, name) != 1) ok = 0; /* SNI, for names only */
  }
  if (ok != 1) {
    char why[256];
    return FL_ERR(FL_EINVAL, "cannot expect a TLS certificate for %s: %s", name, net_tls_errors(why, sizeof why));
  }
  return FL_OK;
}
