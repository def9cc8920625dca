// Typed wrappers over libcurl's variadic setters (curl_easy_setopt, curl_multi_setopt,
// curl_easy_getinfo), which Swift cannot call. Herald uses libcurl for HTTP/1.1 only
// (the FCM OAuth token exchange, custom webhooks); HTTP/2 goes through nghttp2.
#ifndef CHERALD_CURL_H
#define CHERALD_CURL_H

#include <curl/curl.h>
#include <stddef.h>

typedef size_t (*herald_curl_data_cb)(char *data, size_t size, size_t count, void *user);

int herald_curl_setopt_long(CURL *h, CURLoption option, long value);
int herald_curl_setopt_string(CURL *h, CURLoption option, const char *value);
int herald_curl_setopt_pointer(CURL *h, CURLoption option, void *value);
int herald_curl_setopt_slist(CURL *h, CURLoption option, struct curl_slist *value);
/// CURLOPT_WRITEFUNCTION + CURLOPT_WRITEDATA.
int herald_curl_set_write(CURL *h, herald_curl_data_cb cb, void *user);
/// CURLOPT_HEADERFUNCTION + CURLOPT_HEADERDATA.
int herald_curl_set_header(CURL *h, herald_curl_data_cb cb, void *user);
/// The POST body, copied by libcurl (CURLOPT_POSTFIELDSIZE + CURLOPT_COPYPOSTFIELDS).
int herald_curl_set_body(CURL *h, const void *body, long length);
long herald_curl_response_code(CURL *h);
/// CURLINFO_NUM_CONNECTS: new connections this transfer opened (0 when it reused one).
long herald_curl_num_connects(CURL *h);
/// CURLINFO_PRIVATE.
void *herald_curl_private(CURL *h);
int herald_curl_multi_setopt_long(CURLM *m, CURLMoption option, long value);
/// The HTTP version constant for HTTP/1.1 (a macro-free name).
long herald_curl_http_1_1(void);
/// CURLAUTH_BASIC (a macro).
long herald_curl_auth_basic(void);
/// CURLOPT_SSLVERSION = CURL_SSLVERSION_TLSv1_2: TLS 1.2 or later (returns the CURLcode).
int herald_curl_require_tls_1_2(CURL *h);
#endif
