/*
 * ui_client.h: a test's HTTP client of the web UI (libcurl): GET or another method with one
 * extra header, the JSON of an API path, a page's status. Fails the test on a transport error.
 */
#ifndef FLINT_TESTS_UI_CLIENT_H
#define FLINT_TESTS_UI_CLIENT_H

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <jansson.h>

#include "flint/flint.h"

typedef struct reply {
  long code;
  fl_buf body;
  char cookie[256];
} reply;

static inline size_t on_body(char *data, size_t size, size_t n, void *arg) {
  fl_buf_append(&((reply *)arg)->body, data, size * n);
  return size * n;
}

static inline size_t on_header(char *data, size_t size, size_t n, void *arg) {
  reply *r = arg;
  if (size * n > 12 && strncasecmp(data, "Set-Cookie: ", 12) == 0)
    snprintf(r->cookie, sizeof r->cookie, "%.*s", (int)strcspn(data + 12, ";\r\n"), data + 12);
  return size * n;
}

/* GET url (method "POST" etc. when given; extra: one more header, or NULL). */
static inline reply http(const char *method, const char *url, const char *extra_header) {
  reply r = {0};
  CURL *c = curl_easy_init();
  assert_non_null(c);
  struct curl_slist *headers = extra_header ? curl_slist_append(NULL, extra_header) : NULL;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
  if (method) curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  if (headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) fail_msg("GET %s: %s", url, curl_easy_strerror(rc));
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  fl_buf_append(&r.body, "", 1);
  return r;
}

/* The JSON at base + path, which must answer 200. */
static inline json_t *get_json(const char *base, const char *path) {
  char url[512];
  snprintf(url, sizeof url, "%s%s", base, path);
  reply r = http(NULL, url, NULL);
  if (r.code != 200) fail_msg("GET %s: %ld %s", url, r.code, (char *)r.body.data);
  json_error_t err;
  json_t *v = json_loads((char *)r.body.data, 0, &err);
  if (!v) fail_msg("GET %s: not JSON (%s): %.200s", url, err.text, (char *)r.body.data);
  fl_buf_free(&r.body);
  return v;
}

static inline long get_code(const char *base, const char *path) {
  char url[512];
  snprintf(url, sizeof url, "%s%s", base, path);
  reply r = http(NULL, url, NULL);
  fl_buf_free(&r.body);
  return r.code;
}

#endif /* FLINT_TESTS_UI_CLIENT_H */
