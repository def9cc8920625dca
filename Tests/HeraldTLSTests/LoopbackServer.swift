// A TLS server on loopback for the client context's tests: OpenSSL's server side over a listening socket on an
// ephemeral port, one handshake per accepted connection on a thread of its own.
import COpenSSL
import Foundation
import HeraldTLS
import HeraldTestSupport
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What the server saw of one handshake.
struct ServerHandshake: Sendable {
    /// `SSL_accept` completed.
    var completed: Bool
    /// The protocol ALPN selected ("" when none).
    var alpn: String
    /// The client presented a certificate that verified against the server's client CA.
    var clientVerified: Bool
}

/// A TLS server on 127.0.0.1 with `certificate` and `key`. `alpn` lists the protocols it accepts, in its order
/// of preference (none: it ignores ALPN). With `clientCA` it asks for a client certificate and verifies it
/// against that file. `accept()` serves the next connection.
final class LoopbackTLSServer: @unchecked Sendable {
    // @unchecked Sendable: `ctx` and `listener` are set in init and only read after; OpenSSL allows `SSL_new` on
    // one `SSL_CTX` from several threads.
    let port: Int
    private let listener: Int32
    private let ctx: OpaquePointer
    /// The ALPN selection callback's argument: retained while the server lives.
    private let accepted: Unmanaged<AcceptedProtocols>

    init(certificate: String, key: String, alpn: [String] = [], clientCA: String? = nil) throws {
        // A peer that closes while the other side still writes (an alert, a close_notify) raises no SIGPIPE.
        TestProcess.prepare()
        guard let ctx = SSL_CTX_new(TLS_server_method()) else { throw TestSupportError("SSL_CTX_new failed") }
        guard SSL_CTX_use_certificate_chain_file(ctx, certificate) == 1,
            SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1
        else {
            SSL_CTX_free(ctx)
            throw TestSupportError("server certificate: \(openSSLErrors())")
        }
        if let clientCA {
            guard SSL_CTX_load_verify_locations(ctx, clientCA, nil) == 1 else {
                SSL_CTX_free(ctx)
                throw TestSupportError("client CA: \(openSSLErrors())")
            }
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nil)
        }
        self.ctx = ctx
        accepted = Unmanaged.passRetained(AcceptedProtocols(alpn))
        if !alpn.isEmpty { SSL_CTX_set_alpn_select_cb(ctx, selectALPN, accepted.toOpaque()) }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && listen(fd, 8) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard fd >= 0, bound else {
            if fd >= 0 { close(fd) }
            SSL_CTX_free(ctx)
            accepted.release()
            throw TestSupportError("listen on 127.0.0.1 failed (errno \(errno))")
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit {
        close(listener)
        SSL_CTX_free(ctx)
        accepted.release()
    }

    /// Accepts the next connection and runs the server side of its handshake (on a thread of its own); returns
    /// what the server saw once the handshake ended either way and the connection is closed.
    func accept() async throws -> ServerHandshake {
        try await offPool { try self.acceptBlocking() }
    }

    private func acceptBlocking() throws -> ServerHandshake {
        let fd = Glibc.accept(listener, nil, nil)
        guard fd >= 0 else { throw TestSupportError("accept failed (errno \(errno))") }
        defer { close(fd) }
        // A client that stops mid-handshake fails the test instead of holding this thread.
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard let ssl = SSL_new(ctx) else { throw TestSupportError("SSL_new failed") }
        defer { SSL_free(ssl) }
        SSL_set_fd(ssl, fd)
        let completed = SSL_accept(ssl) == 1
        let protocolName = selectedProtocol(ssl)
        var clientVerified = false
        if completed, let peer = SSL_get1_peer_certificate(ssl) {
            clientVerified = SSL_get_verify_result(ssl) == X509_V_OK
            X509_free(peer)
        }
        if completed { SSL_shutdown(ssl) }
        return ServerHandshake(completed: completed, alpn: protocolName, clientVerified: clientVerified)
    }
}

/// The server's ALPN protocols, in its order of preference.
private final class AcceptedProtocols {
    let names: [String]
    init(_ names: [String]) { self.names = names }
}

/// OpenSSL's ALPN selection callback: the server's first protocol (`arg`: its `AcceptedProtocols`) that the
/// client offered, else no protocol (the handshake goes on without ALPN).
private func selectALPN(
    _ ssl: OpaquePointer?, _ out: UnsafeMutablePointer<UnsafePointer<UInt8>?>?,
    _ outLength: UnsafeMutablePointer<UInt8>?, _ offered: UnsafePointer<UInt8>?, _ offeredLength: UInt32,
    _ arg: UnsafeMutableRawPointer?
) -> Int32 {
    guard let out, let outLength, let offered, let arg else { return SSL_TLSEXT_ERR_NOACK }
    for name in Unmanaged<AcceptedProtocols>.fromOpaque(arg).takeUnretainedValue().names {
        var at = 0
        while at < Int(offeredLength) {
            let length = Int(offered[at])
            let start = at + 1
            guard start + length <= Int(offeredLength) else { break }
            if Array(UnsafeBufferPointer(start: offered + start, count: length)) == Array(name.utf8) {
                out.pointee = offered + start  // OpenSSL copies the selection before the buffer goes
                outLength.pointee = UInt8(length)
                return SSL_TLSEXT_ERR_OK
            }
            at = start + length
        }
    }
    return SSL_TLSEXT_ERR_NOACK
}

/// The protocol ALPN selected on `ssl` ("" when none).
private func selectedProtocol(_ ssl: OpaquePointer) -> String {
    var selected: UnsafePointer<UInt8>?
    var length: UInt32 = 0
    SSL_get0_alpn_selected(ssl, &selected, &length)
    guard let selected else { return "" }
    return String(decoding: UnsafeBufferPointer(start: selected, count: Int(length)), as: UTF8.self)
}

/// The outcome of a client handshake.
struct ClientHandshake: Sendable {
    var completed: Bool
    /// `TLSClientContext.handshakeFailure` when it failed.
    var failure: String
    /// The protocol ALPN selected ("" when none).
    var alpn: String
}

/// Connects to 127.0.0.1:`port` and runs the client side of a handshake with a session of `context` that
/// verifies `serverName`, offering `alpn` (on a thread of its own).
func clientHandshake(
    _ context: TLSClientContext, port: Int, serverName: String, alpn: [String] = []
) async throws -> ClientHandshake {
    TestProcess.prepare()
    return try await offPool {
        let fd = try TestHTTP.connectLoopback(port: port, receiveTimeoutSeconds: 30)
        defer { close(fd) }
        let ssl = try context.session(verifying: serverName)
        defer { SSL_free(ssl) }
        if !alpn.isEmpty {
            let wire = alpn.flatMap { [UInt8($0.utf8.count)] + Array($0.utf8) }
            guard SSL_set_alpn_protos(ssl, wire, UInt32(wire.count)) == 0 else {
                throw TestSupportError("SSL_set_alpn_protos failed")
            }
        }
        SSL_set_fd(ssl, fd)
        let completed = SSL_connect(ssl) == 1
        let failure = completed ? "" : TLSClientContext.handshakeFailure(ssl)
        let selected = selectedProtocol(ssl)
        if completed { SSL_shutdown(ssl) }
        return ClientHandshake(completed: completed, failure: failure, alpn: selected)
    }
}
