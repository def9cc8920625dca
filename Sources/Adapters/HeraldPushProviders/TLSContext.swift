import COpenSSL
import Foundation
import HeraldCore
import HeraldTLS

#if canImport(Glibc)
import Glibc
#endif

/// The client's `SSL_CTX` for APNs and FCM: the shared client context (TLS 1.2+, peer verification against the
/// system store or, instead of it, a given CA file) with ALPN h2 and the client certificate for certificate auth.
final class TLSContext: @unchecked Sendable {
    // @unchecked Sendable: the context is configured once in init and only read after that;
    // OpenSSL allows SSL_new on one SSL_CTX from several threads.
    let client: TLSClientContext
    var ctx: OpaquePointer { client.ctx }

    /// `credential` is an APNs client certificate (`.certificateFiles`, `.pkcs12File`) to present, or nil (a token
    /// credential, FCM, Web Push: the server authenticates the bearer header, not the TLS client).
    init(credential: APNsClientCredential? = nil, trustedCAFile: String?) throws(PushError) {
        var certificateFiles: (certificate: String?, key: String?) = (nil, nil)
        if case .certificateFiles(let certificatePath, let privateKeyPath) = credential {
            certificateFiles = (certificatePath, privateKeyPath)
        }
        do {
            client = try TLSClientContext(
                trustedCAFile: trustedCAFile, certificateFile: certificateFiles.certificate,
                privateKeyFile: certificateFiles.key)
        } catch {
            throw PushError(error.kind == .credential ? .credential : .tls, error.message)
        }
        let ctx = client.ctx
        SSL_CTX_ctrl(ctx, SSL_CTRL_MODE, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER), nil)
        // Read ahead (SSL_CTX_set_read_ahead): one read(2) takes in as many TLS records as a 64 KB buffer holds,
        // instead of one or two system calls per record.
        SSL_CTX_ctrl(ctx, SSL_CTRL_SET_READ_AHEAD, 1, nil)
        SSL_CTX_set_default_read_buffer_len(ctx, 64 * 1024)
        let alpn: [UInt8] = [2, UInt8(ascii: "h"), UInt8(ascii: "2")]
        guard SSL_CTX_set_alpn_protos(ctx, alpn, UInt32(alpn.count)) == 0 else {
            throw PushError(.tls, "cannot set ALPN h2")
        }
        if case .pkcs12File(let path, let password) = credential {
            try Self.usePKCS12(ctx: ctx, path: path, password: password)
        }
    }

    private static func usePKCS12(ctx: OpaquePointer, path: String, password: String) throws(PushError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw PushError(.credential, "cannot read .p12 file \(path)")
        }
        let bytes = [UInt8](data)
        let p12: OpaquePointer? = bytes.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return d2i_PKCS12_bio(bio, nil)
        }
        guard let p12 else { throw PushError(.credential, "\(path) is not a PKCS#12 file: \(openSSLErrors())") }
        defer { PKCS12_free(p12) }
        var key: OpaquePointer? = nil
        var cert: OpaquePointer? = nil
        var chain: OpaquePointer? = nil
        guard PKCS12_parse(p12, password, &key, &cert, &chain) == 1, let key, let cert else {
            throw PushError(.credential, "cannot open \(path) (wrong password?): \(openSSLErrors())")
        }
        defer {
            EVP_PKEY_free(key)
            X509_free(cert)
            if let chain { OPENSSL_sk_pop_free(chain, { X509_free(OpaquePointer($0)) }) }
        }
        guard SSL_CTX_use_certificate(ctx, cert) == 1, SSL_CTX_use_PrivateKey(ctx, key) == 1,
            SSL_CTX_check_private_key(ctx) == 1
        else {
            throw PushError(.credential, "the .p12 certificate or key is unusable: \(openSSLErrors())")
        }
        if let chain {
            let count = OPENSSL_sk_num(chain)
            var i: Int32 = 0
            while i < count {
                if let extra = OPENSSL_sk_value(chain, i) {
                    // SSL_CTX_add1_chain_cert is a macro over SSL_CTX_ctrl.
                    SSL_CTX_ctrl(ctx, SSL_CTRL_CHAIN_CERT, 1, extra)
                }
                i += 1
            }
        }
    }
}

/// A TLS connection over a TCP socket, owned here: the `SSL` and the file descriptor.
final class TLSSocket {
    let fd: Int32
    let ssl: OpaquePointer

    private init(fd: Int32, ssl: OpaquePointer) {
        self.fd = fd
        self.ssl = ssl
    }

    deinit {
        SSL_free(ssl)
        close(fd)
    }

    /// Connects, handshakes and checks ALPN, blocking (bounded by `timeout`); call it on a
    /// thread of its own, never on the I/O loop or Swift's cooperative pool. The socket is
    /// switched to non-blocking before it is returned.
    static func connect(
        endpoint: ServiceEndpoint, context: TLSContext, timeout: Duration
    ) throws(PushError) -> TLSSocket {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>? = nil
        let rc = getaddrinfo(endpoint.host, String(endpoint.port), &hints, &list)
        guard rc == 0, let list else {
            throw PushError(.io, "cannot resolve \(endpoint.host): \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(list) }
        var lastError = "no address"
        var cursor: UnsafeMutablePointer<addrinfo>? = list
        var fd: Int32 = -1
        while let ai = cursor {
            cursor = ai.pointee.ai_next
            let s = socket(ai.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            if s < 0 { lastError = String(cString: strerror(errno)); continue }
            setTimeouts(s, timeout)
            if Glibc.connect(s, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 { fd = s; break }
            lastError = String(cString: strerror(errno))
            close(s)
        }
        guard fd >= 0 else { throw PushError(.io, "cannot connect to \(endpoint): \(lastError)") }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let ssl: OpaquePointer
        do {
            ssl = try context.client.session(verifying: endpoint.host)
        } catch {
            close(fd)
            throw PushError(.tls, error.message)
        }
        let sock = TLSSocket(fd: fd, ssl: ssl)
        SSL_set_fd(ssl, fd)
        ERR_clear_error()
        guard SSL_connect(ssl) == 1 else {
            throw PushError(.tls, "TLS handshake with \(endpoint) failed: \(TLSClientContext.handshakeFailure(ssl))")
        }
        var proto: UnsafePointer<UInt8>? = nil
        var protoLength: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &proto, &protoLength)
        guard let proto, protoLength == 2, proto[0] == UInt8(ascii: "h"), proto[1] == UInt8(ascii: "2") else {
            throw PushError(.tls, "\(endpoint) did not agree to HTTP/2 (ALPN h2)")
        }
        setTimeouts(fd, .zero)
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        return sock
    }

    private static func setTimeouts(_ fd: Int32, _ timeout: Duration) {
        let micros = timeout.microseconds
        var tv = timeval(tv_sec: Int(micros / 1_000_000), tv_usec: Int(micros % 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }
}
