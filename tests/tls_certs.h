/*
 * tls_certs.h: certificates for the TLS tests, made by scripts/make-tls-certs (the same tool
 * users run) in a fresh temporary folder, and the environment that turns TLS on with them.
 */
#ifndef FLINT_TESTS_TLS_CERTS_H
#define FLINT_TESTS_TLS_CERTS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes a CA and a certificate for `names` ("127.0.0.1 localhost") in a new folder under
 * $TMPDIR, whose path goes to dir (cap >= 64). False (and a message on stderr) on failure. */
static inline bool tls_make_certs(char *dir, size_t cap, const char *names) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, cap, "%s/flint-tls-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return false;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s/scripts/make-tls-certs' '%s' %s", FLINT_SOURCE_DIR, dir, names ? names : "");
  if (system(cmd) != 0) {
    fprintf(stderr, "tls_make_certs: %s failed\n", cmd);
    return false;
  }
  return true;
}

/* Points FLINT_TLS_CA, _CERT and _KEY at the files of `dir` and sets FLINT_TLS=1. */
static inline void tls_env_on(const char *dir) {
  char path[512];
  setenv("FLINT_TLS", "1", 1);
  snprintf(path, sizeof path, "%s/ca.pem", dir);
  setenv("FLINT_TLS_CA", path, 1);
  snprintf(path, sizeof path, "%s/cert.pem", dir);
  setenv("FLINT_TLS_CERT", path, 1);
  snprintf(path, sizeof path, "%s/key.pem", dir);
  setenv("FLINT_TLS_KEY", path, 1);
}

static inline void tls_env_off(void) {
  unsetenv("FLINT_TLS");
  unsetenv("FLINT_TLS_CA");
  unsetenv("FLINT_TLS_CERT");
  unsetenv("FLINT_TLS_KEY");
  unsetenv("FLINT_TLS_SERVER_NAME");
}

/* Removes a folder of tls_make_certs. */
static inline void tls_remove_certs(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "tls_remove_certs: cannot remove %s\n", dir);
}

#endif /* FLINT_TESTS_TLS_CERTS_H */
