#define _GNU_SOURCE
#include "CHeraldMockTLS.h"
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <errno.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/ecdsa.h>
#include <openssl/bn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct hmt_ctx { SSL_CTX *ssl_ctx; int client_auth; };
struct hmt_conn { SSL *ssl; };
struct hmt_pubkey { EVP_PKEY *pkey; };

void hmt_last_error(char *buf, size_t len) {
  unsigned long e = ERR_get_error();
  if (len == 0) return;
  if (e == 0) { snprintf(buf, len, "unknown OpenSSL error"); return; }
  ERR_error_string_n(e, buf, len);
  ERR_clear_error();
}

static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg) {
  (void)ssl; (void)arg;
  // Find "h2" in the client's list (length-prefixed entries).
  unsigned int i = 0;
  while (i < inlen) {
    unsigned int l = in[i];
    if (i + 1 + l > inlen) break;
    if (l == 2 && in[i + 1] == 'h' && in[i + 2] == '2') {
      *out = in + i + 1; *outlen = 2; return SSL_TLSEXT_ERR_OK;
    }
    i += 1 + l;
  }
  return SSL_TLSEXT_ERR_ALERT_FATAL;
}

static int accept_any_verify(int preverify_ok, X509_STORE_CTX *x) {
  // Keep the handshake going without a valid certificate: such a connection falls back to
  // token auth. SSL_get_verify_result tells whether the certificate verified.
  (void)preverify_ok; (void)x;
  return 1;
}

hmt_ctx *hmt_ctx_new(const char *cert_path, const char *key_path, const char *client_ca_path,
                     char *err, size_t errlen) {
  SSL_CTX *c = SSL_CTX_new(TLS_server_method());
  if (!c) { hmt_last_error(err, errlen); return NULL; }
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(c, cert_path) != 1) {
    char e[200]; hmt_last_error(e, sizeof e);
    snprintf(err, errlen, "cannot load certificate %s: %s", cert_path, e);
    SSL_CTX_free(c); return NULL;
  }
  if (SSL_CTX_use_PrivateKey_file(c, key_path, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(c) != 1) {
    char e[200]; hmt_last_error(e, sizeof e);
    snprintf(err, errlen, "cannot load private key %s: %s", key_path, e);
    SSL_CTX_free(c); return NULL;
  }
  SSL_CTX_set_alpn_select_cb(c, alpn_select, NULL);
  int client_auth = 0;
  if (client_ca_path) {
    if (SSL_CTX_load_verify_locations(c, client_ca_path, NULL) != 1) {
      char e[200]; hmt_last_error(e, sizeof e);
      snprintf(err, errlen, "cannot load client CA %s: %s", client_ca_path, e);
      SSL_CTX_free(c); return NULL;
    }
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca_path);
    if (names) SSL_CTX_set_client_CA_list(c, names);
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, accept_any_verify);
    client_auth = 1;
  }
  hmt_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) { SSL_CTX_free(c); snprintf(err, errlen, "out of memory"); return NULL; }
  ctx->ssl_ctx = c; ctx->client_auth = client_auth;
  return ctx;
}

void hmt_ctx_free(hmt_ctx *ctx) {
  if (!ctx) return;
  SSL_CTX_free(ctx->ssl_ctx);
  free(ctx);
}

hmt_conn *hmt_conn_new(hmt_ctx *ctx, int fd) {
  SSL *s = SSL_new(ctx->ssl_ctx);
  if (!s) return NULL;
  if (SSL_set_fd(s, fd) != 1) { SSL_free(s); return NULL; }
  SSL_set_accept_state(s);
  hmt_conn *conn = calloc(1, sizeof *conn);
  if (!conn) { SSL_free(s); return NULL; }
  conn->ssl = s;
  return conn;
}

void hmt_conn_free(hmt_conn *conn) {
  if (!conn) return;
  SSL_free(conn->ssl);
  free(conn);
}

static int map_error(SSL *s, int rv) {
  int e = SSL_get_error(s, rv);
  switch (e) {
  case SSL_ERROR_WANT_READ: return HMT_WANT_READ;
  case SSL_ERROR_WANT_WRITE: return HMT_WANT_WRITE;
  case SSL_ERROR_ZERO_RETURN: return HMT_CLOSED;
  case SSL_ERROR_SYSCALL:
    ERR_clear_error();
    return HMT_CLOSED; // EOF or reset: the peer went away
  default:
    ERR_clear_error();
    return HMT_ERROR;
  }
}

int hmt_conn_handshake(hmt_conn *conn) {
  int rv = SSL_do_handshake(conn->ssl);
  if (rv == 1) return HMT_OK;
  return map_error(conn->ssl, rv);
}

int hmt_conn_is_h2(hmt_conn *conn) {
  const unsigned char *p = NULL; unsigned int l = 0;
  SSL_get0_alpn_selected(conn->ssl, &p, &l);
  return (p && l == 2 && p[0] == 'h' && p[1] == '2') ? 1 : 0;
}

int hmt_conn_peer_verified(hmt_conn *conn) {
  X509 *peer = SSL_get1_peer_certificate(conn->ssl);
  if (!peer) return 0;
  X509_free(peer);
  return SSL_get_verify_result(conn->ssl) == X509_V_OK ? 1 : 0;
}

int hmt_conn_read(hmt_conn *conn, uint8_t *buf, int len) {
  ERR_clear_error();
  int rv = SSL_read(conn->ssl, buf, len);
  if (rv > 0) return rv;
  return map_error(conn->ssl, rv);
}

int hmt_conn_write(hmt_conn *conn, const uint8_t *buf, int len) {
  ERR_clear_error();
  int rv = SSL_write(conn->ssl, buf, len);
  if (rv > 0) return rv;
  return map_error(conn->ssl, rv);
}

int hmt_conn_pending(hmt_conn *conn) { return SSL_pending(conn->ssl); }

hmt_pubkey *hmt_pubkey_load(const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) { snprintf(err, errlen, "cannot open %s", path); return NULL; }
  EVP_PKEY *k = PEM_read_PUBKEY(f, NULL, NULL, NULL);
  if (!k) {
    rewind(f); ERR_clear_error();
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    if (x) { k = X509_get_pubkey(x); X509_free(x); }
  }
  if (!k) {
    rewind(f); ERR_clear_error();
    k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
  }
  fclose(f);
  if (!k) { snprintf(err, errlen, "%s holds no PEM public key, certificate or private key", path); ERR_clear_error(); return NULL; }
  if (EVP_PKEY_get_base_id(k) != EVP_PKEY_EC || EVP_PKEY_get_bits(k) != 256) {
    snprintf(err, errlen, "%s is not a P-256 key", path);
    EVP_PKEY_free(k); return NULL;
  }
  hmt_pubkey *pk = calloc(1, sizeof *pk);
  if (!pk) { EVP_PKEY_free(k); return NULL; }
  pk->pkey = k;
  return pk;
}

void hmt_pubkey_free(hmt_pubkey *key) {
  if (!key) return;
  EVP_PKEY_free(key->pkey);
  free(key);
}

int hmt_es256_verify(hmt_pubkey *key, const uint8_t *data, size_t len, const uint8_t *sig, size_t siglen) {
  if (!key || siglen != 64) return 0;
  int ok = 0;
  ECDSA_SIG *es = ECDSA_SIG_new();
  BIGNUM *r = BN_bin2bn(sig, 32, NULL), *s = BN_bin2bn(sig + 32, 32, NULL);
  unsigned char *der = NULL;
  EVP_MD_CTX *md = NULL;
  if (!es || !r || !s) goto done;
  if (ECDSA_SIG_set0(es, r, s) != 1) goto done;
  r = s = NULL; // owned by es
  int derlen = i2d_ECDSA_SIG(es, &der);
  if (derlen <= 0) goto done;
  md = EVP_MD_CTX_new();
  if (!md) goto done;
  if (EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, key->pkey) != 1) goto done;
  ok = EVP_DigestVerify(md, der, (size_t)derlen, data, len) == 1 ? 1 : 0;
done:
  ERR_clear_error();
  EVP_MD_CTX_free(md);
  OPENSSL_free(der);
  BN_free(r); BN_free(s);
  ECDSA_SIG_free(es);
  return ok;
}

int hmt_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int hmt_epoll_ctl(int epfd, int op, int fd, int events) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = ((events & HMT_EV_IN) ? EPOLLIN : 0) | ((events & HMT_EV_OUT) ? EPOLLOUT : 0);
  ev.data.fd = fd;
  int o = op == 0 ? EPOLL_CTL_ADD : (op == 1 ? EPOLL_CTL_MOD : EPOLL_CTL_DEL);
  return epoll_ctl(epfd, o, fd, &ev);
}

int hmt_epoll_wait(int epfd, int *fds, int *events, int max, int timeout_ms) {
  struct epoll_event evs[256];
  if (max > 256) max = 256;
  int n = epoll_wait(epfd, evs, max, timeout_ms);
  if (n < 0) return errno == EINTR ? 0 : -1;
  for (int i = 0; i < n; i++) {
    fds[i] = evs[i].data.fd;
    int e = 0;
    if (evs[i].events & EPOLLIN) e |= HMT_EV_IN;
    if (evs[i].events & EPOLLOUT) e |= HMT_EV_OUT;
    if (evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) e |= HMT_EV_HUP;
    events[i] = e;
  }
  return n;
}

int hmt_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int hmt_accept(int listen_fd, int nodelay) {
  int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return -1;
  if (nodelay) { int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); }
  return fd;
}
