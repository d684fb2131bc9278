/* test_tls.c: the TLS settings (net/tls.c): what is read when, and the errors for files that
 * cannot serve. The planes' handshakes are tested in test_rpc.c and test_dataplane.c. */
#include "test_util.h"
#include "tls_certs.h"

#include <openssl/ssl.h>

#include "net/tls.h"

static char certs[256], other[256];

static int make_all(void **state) {
  (void)state;
  return tls_make_certs(certs, sizeof certs, NULL) && tls_make_certs(other, sizeof other, NULL) ? 0 : -1;
}

static int remove_all(void **state) {
  (void)state;
  tls_remove_certs(certs);
  tls_remove_certs(other);
  return 0;
}

static void off_reads_nothing(void **state) {
  (void)state;
  tls_env_off();
  setenv("FLINT_TLS_CA", "/nonexistent/ca.pem", 1); /* not read while off */
  net_tls t;
  assert_ok(net_tls_read(NET_TLS_SERVER, &t));
  assert_false(t.on);
  assert_null(t.ca_pem);
  net_tls_free(&t);
  tls_env_off();
}

static void on_reads_the_files(void **state) {
  (void)state;
  tls_env_on(certs);
  net_tls t;
  assert_ok(net_tls_read(NET_TLS_SERVER, &t));
  assert_true(t.on);
  assert_non_null(strstr(t.ca_pem, "BEGIN CERTIFICATE"));
  assert_non_null(strstr(t.cert_pem, "BEGIN CERTIFICATE"));
  assert_non_null(strstr(t.key_pem, "PRIVATE KEY"));
  assert_null(t.server_name);
  SSL_CTX *ctx = NULL;
  assert_ok(net_tls_context(&t, NET_TLS_SERVER, &ctx));
  assert_non_null(ctx);
  net_tls_free(&t);

  /* A client needs the CA only. */
  unsetenv("FLINT_TLS_CERT");
  unsetenv("FLINT_TLS_KEY");
  setenv("FLINT_TLS_SERVER_NAME", "flint.example", 1);
  assert_ok(net_tls_read(NET_TLS_CLIENT, &t));
  assert_null(t.cert_pem);
  assert_string_equal(t.server_name, "flint.example");
  net_tls_free(&t);
  tls_env_off();
  SSL_CTX_free(ctx);
}

static void missing_settings_are_named(void **state) {
  (void)state;
  net_tls t;
  tls_env_on(certs);
  unsetenv("FLINT_TLS_CA");
  assert_fails_with(net_tls_read(NET_TLS_CLIENT, &t), FL_EINVAL, "FLINT_TLS is on but FLINT_TLS_CA is not set");
  net_tls_free(&t);
  tls_env_on(certs);
  unsetenv("FLINT_TLS_CERT");
  assert_fails_with(net_tls_read(NET_TLS_SERVER, &t), FL_EINVAL, "FLINT_TLS_CERT is not set");
  net_tls_free(&t);
  tls_env_on(certs);
  unsetenv("FLINT_TLS_KEY");
  assert_fails_with(net_tls_read(NET_TLS_CLIENT, &t), FL_EINVAL, "FLINT_TLS_CERT is set but FLINT_TLS_KEY is not");
  net_tls_free(&t);
  tls_env_off();
}

static void bad_files_are_named(void **state) {
  (void)state;
  char path[512], other_key[512];
  net_tls t;

  tls_env_on(certs);
  setenv("FLINT_TLS_CA", "/nonexistent/ca.pem", 1);
  assert_fails_with(net_tls_read(NET_TLS_CLIENT, &t), FL_EINVAL, "FLINT_TLS_CA=/nonexistent/ca.pem cannot be used");
  net_tls_free(&t);

  /* A key where a certificate belongs, and a certificate where the key belongs. */
  tls_env_on(certs);
  snprintf(path, sizeof path, "%s/key.pem", certs);
  setenv("FLINT_TLS_CA", path, 1);
  assert_fails_with(net_tls_read(NET_TLS_CLIENT, &t), FL_EINVAL, "holds no PEM certificate");
  net_tls_free(&t);
  tls_env_on(certs);
  snprintf(path, sizeof path, "%s/cert.pem", certs);
  setenv("FLINT_TLS_KEY", path, 1);
  assert_fails_with(net_tls_read(NET_TLS_SERVER, &t), FL_EINVAL, "holds no PEM private key");
  net_tls_free(&t);

  /* An empty file. */
  tls_env_on(certs);
  snprintf(path, sizeof path, "%s/empty.pem", certs);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  setenv("FLINT_TLS_CERT", path, 1);
  assert_fails_with(net_tls_read(NET_TLS_SERVER, &t), FL_EINVAL, "it is empty");
  net_tls_free(&t);

  /* Another pair's key. */
  tls_env_on(certs);
  snprintf(other_key, sizeof other_key, "%s/key.pem", other);
  setenv("FLINT_TLS_KEY", other_key, 1);
  assert_fails_with(net_tls_read(NET_TLS_SERVER, &t), FL_EINVAL, "is not the key of FLINT_TLS_CERT");
  net_tls_free(&t);
  tls_env_off();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(off_reads_nothing),
      cmocka_unit_test(on_reads_the_files),
      cmocka_unit_test(missing_settings_are_named),
      cmocka_unit_test(bad_files_are_named),
  };
  return cmocka_run_group_tests(tests, make_all, remove_all);
}
