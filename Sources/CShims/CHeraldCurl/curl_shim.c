#include "CHeraldCurl.h"

int herald_curl_setopt_long(CURL *h, CURLoption option, long value) { return (int)curl_easy_setopt(h, option, value); }
int herald_curl_setopt_string(CURL *h, CURLoption option, const char *value) { return (int)curl_easy_setopt(h, option, value); }
int herald_curl_setopt_pointer(CURL *h, CURLoption option, void *value) { return (int)curl_easy_setopt(h, option, value); }
int herald_curl_setopt_slist(CURL *h, CURLoption option, struct curl_slist *value) { return (int)curl_easy_setopt(h, option, value); }

int herald_curl_set_write(CURL *h, herald_curl_data_cb cb, void *user) {
    CURLcode rc = curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, cb);
    if (rc != CURLE_OK) return (int)rc;
    return (int)curl_easy_setopt(h, CURLOPT_WRITEDATA, user);
}

int herald_curl_set_header(CURL *h, herald_curl_data_cb cb, void *user) {
    CURLcode rc = curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, cb);
    if (rc != CURLE_OK) return (int)rc;
    return (int)curl_easy_setopt(h, CURLOPT_HEADERDATA, user);
}

int herald_curl_set_body(CURL *h, const void *body, long length) {
    CURLcode rc = curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, length);
    if (rc != CURLE_OK) return (int)rc;
    return (int)curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS, body);
}

long herald_curl_response_code(CURL *h) {
    long code = 0;
    if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK) return 0;
    return code;
}

void *herald_curl_private(CURL *h) {
    char *p = NULL;
    if (curl_easy_getinfo(h, CURLINFO_PRIVATE, &p) != CURLE_OK) return NULL;
    return p;
}

int herald_curl_multi_setopt_long(CURLM *m, CURLMoption option, long value) { return (int)curl_multi_setopt(m, option, value); }

long herald_curl_http_1_1(void) { return CURL_HTTP_VERSION_1_1; }

long herald_curl_num_connects(CURL *h) {
    long n = 0;
    if (curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &n) != CURLE_OK) return 0;
    return n;
}
long herald_curl_auth_basic(void) { return (long)CURLAUTH_BASIC; }

int herald_curl_require_tls_1_2(CURL *h) { return (int)curl_easy_setopt(h, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2); }
