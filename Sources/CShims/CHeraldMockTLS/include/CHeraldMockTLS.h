// Small C helpers for herald-mock-apns: OpenSSL server context setup (several OpenSSL
// setters are macros Swift cannot import), non-blocking TLS I/O steps and ES256 verification.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hmt_ctx hmt_ctx;   // wraps SSL_CTX
typedef struct hmt_conn hmt_conn; // wraps SSL bound to a socket
typedef struct hmt_pubkey hmt_pubkey; // wraps EVP_PKEY (P-256 public key)

/// Creates a TLS server context offering only ALPN "h2", TLS 1.2+.
/// `client_ca_path` may be NULL; when set, clients are asked for a certificate (optional)
/// and it is verified against that CA. Returns NULL and fills `err` on failure.
hmt_ctx *hmt_ctx_new(const char *cert_path, const char *key_path, const char *client_ca_path,
                     char *err, size_t errlen);
void hmt_ctx_free(hmt_ctx *ctx);

/// Wraps an accepted non-blocking socket. Returns NULL on failure.
hmt_conn *hmt_conn_new(hmt_ctx *ctx, int fd);
void hmt_conn_free(hmt_conn *conn);

enum {
  HMT_OK = 0,         // handshake done / bytes transferred
  HMT_WANT_READ = -1, // retry when readable
  HMT_WANT_WRITE = -2,// retry when writable
  HMT_CLOSED = -3,    // clean close_notify or EOF
  HMT_ERROR = -4      // fatal
};

/// One handshake step. HMT_OK when done.
int hmt_conn_handshake(hmt_conn *conn);
/// 1 when ALPN negotiated "h2".
int hmt_conn_is_h2(hmt_conn *conn);
/// 1 when the peer presented a certificate that verified against the client CA.
int hmt_conn_peer_verified(hmt_conn *conn);
/// Reads up to len bytes: >0 bytes read, or one of the HMT_* codes.
int hmt_conn_read(hmt_conn *conn, uint8_t *buf, int len);
/// Writes up to len bytes (partial writes allowed): >0 bytes written, or HMT_* code.
int hmt_conn_write(hmt_conn *conn, const uint8_t *buf, int len);
/// Bytes of decrypted data buffered inside OpenSSL.
int hmt_conn_pending(hmt_conn *conn);

/// Loads a P-256 public key from a PEM file holding a public key, a certificate or a
/// private key (.p8). Returns NULL on failure.
hmt_pubkey *hmt_pubkey_load(const char *path, char *err, size_t errlen);
void hmt_pubkey_free(hmt_pubkey *key);
/// Verifies an ES256 JOSE signature (raw r||s, 64 bytes) over data. 1 valid, 0 not.
int hmt_es256_verify(hmt_pubkey *key, const uint8_t *data, size_t len, const uint8_t *sig, size_t siglen);

// epoll, eventfd and accept4 (Swift's Glibc module does not export them).
enum { HMT_EV_IN = 1, HMT_EV_OUT = 2, HMT_EV_HUP = 4 };
int hmt_epoll_create(void);
/// op: 0 add, 1 modify, 2 delete. events: HMT_EV_IN | HMT_EV_OUT.
int hmt_epoll_ctl(int epfd, int op, int fd, int events);
/// Fills fds/events (HMT_EV_* bits) with up to max ready descriptors; returns their count or -1.
int hmt_epoll_wait(int epfd, int *fds, int *events, int max, int timeout_ms);
int hmt_eventfd(void);
/// accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC and TCP_NODELAY set; -1 when none is pending.
int hmt_accept(int listen_fd, int nodelay);

/// Last OpenSSL error as text (for logs), into buf.
void hmt_last_error(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
