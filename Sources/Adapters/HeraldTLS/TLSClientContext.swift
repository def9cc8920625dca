import COpenSSL

#if canImport(Glibc)
import Glibc
#endif

/// A TLS client setting that could not be applied: an unreadable trust or key file, a key that does not match its
/// certificate, a server name OpenSSL refuses. Callers wrap it in their own module's error.
package struct TLSSetupError: Error, Sendable, Hashable, CustomStringConvertible {
    package enum Kind: Sendable, Hashable {
        /// The trust store, the server name or OpenSSL itself.
        case trust
        /// The client certificate or its private key.
        case credential
    }

    package let kind: Kind
    package let message: String

    package init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package var description: String { message }
}

/// The `SSL_CTX` every OpenSSL client of Herald starts from (Redis, APNs, FCM): TLS 1.2 or later, the server's
/// certificate always verified, and an optional client certificate.
///
/// Trust: `trustedCAFile` nil means the system trust store; a file means that file's certificates are the only
/// ones trusted (it replaces the system store, it does not add to it).
///
/// Host names: `session(verifying:)` is the one way to get an `SSL` from it, and it always names the server to
/// verify (DNS name or IP literal) and sends SNI for DNS names; when OpenSSL refuses the name the connection is
/// not made. There is no setting that turns verification off.
///
/// `@unchecked Sendable`: the context is configured in init and only read after that; OpenSSL allows `SSL_new` on
/// one `SSL_CTX` from several threads.
package final class TLSClientContext: @unchecked Sendable {
    package let ctx: OpaquePointer

    package init(
        trustedCAFile: String?, certificateFile: String? = nil, privateKeyFile: String? = nil
    )
        throws(TLSSetupError)
    {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else {
            throw TLSSetupError(.trust, "SSL_CTX_new: \(openSSLErrors())")
        }
        self.ctx = ctx
        guard SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, Int(TLS1_2_VERSION), nil) == 1 else {
            throw TLSSetupError(.trust, "cannot require TLS 1.2: \(openSSLErrors())")
        }
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        if let trustedCAFile {
            guard SSL_CTX_load_verify_locations(ctx, trustedCAFile, nil) == 1 else {
                throw TLSSetupError(.trust, "cannot load CA file \(trustedCAFile): \(openSSLErrors())")
            }
        } else if SSL_CTX_set_default_verify_paths(ctx) != 1 {
            throw TLSSetupError(.trust, "cannot load the system CA store: \(openSSLErrors())")
        }
        switch (certificateFile, privateKeyFile) {
        case (nil, nil):
            break
        case (let certificateFile?, let privateKeyFile?):
            guard SSL_CTX_use_certificate_chain_file(ctx, certificateFile) == 1 else {
                throw TLSSetupError(.credential, "cannot load certificate \(certificateFile): \(openSSLErrors())")
            }
            guard SSL_CTX_use_PrivateKey_file(ctx, privateKeyFile, SSL_FILETYPE_PEM) == 1 else {
                throw TLSSetupError(.credential, "cannot load private key \(privateKeyFile): \(openSSLErrors())")
            }
            guard SSL_CTX_check_private_key(ctx) == 1 else {
                throw TLSSetupError(.credential, "the private key does not match the certificate")
            }
        default:
            throw TLSSetupError(.credential, "a client certificate needs its private key, and a key its certificate")
        }
    }

    deinit { SSL_CTX_free(ctx) }

    /// A new `SSL` (owned by the caller: `SSL_free`, or hand it to a library that takes ownership) that verifies
    /// the server's certificate and that it names `serverName`.
    package func session(verifying serverName: String) throws(TLSSetupError) -> OpaquePointer {
        guard let ssl = SSL_new(ctx) else { throw TLSSetupError(.trust, "SSL_new: \(openSSLErrors())") }
        do {
            try Self.verifyPeer(ssl, serverName: serverName)
        } catch {
            SSL_free(ssl)
            throw error
        }
        return ssl
    }

    /// Requires the peer's certificate to verify and to name `serverName` (`SSL_set1_host` for a DNS name, with SNI;
    /// `X509_VERIFY_PARAM_set1_ip_asc` for an IP literal). Any refusal by OpenSSL is an error: the caller must not
    /// go on with the handshake.
    static func verifyPeer(_ ssl: OpaquePointer, serverName: String) throws(TLSSetupError) {
        SSL_set_verify(ssl, SSL_VERIFY_PEER, nil)
        guard !serverName.isEmpty, serverName.utf8.count <= 255,
            !serverName.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7f })
        else {
            throw TLSSetupError(.trust, "not a server name to verify: \"\(serverName)\"")
        }
        ERR_clear_error()
        if isIPAddress(serverName) {
            guard X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName) == 1 else {
                throw TLSSetupError(.trust, "cannot verify IP address \(serverName): \(openSSLErrors())")
            }
            return
        }
        let sni = serverName.withCString { name in
            SSL_ctrl(
                ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, Int(TLSEXT_NAMETYPE_host_name),
                UnsafeMutableRawPointer(mutating: name))
        }
        guard sni == 1 else {
            throw TLSSetupError(.trust, "cannot send server name \(serverName): \(openSSLErrors())")
        }
        guard SSL_set1_host(ssl, serverName) == 1 else {
            throw TLSSetupError(.trust, "cannot verify host name \(serverName): \(openSSLErrors())")
        }
    }

    /// Why a handshake on `ssl` failed: the certificate verification result when there is one (e.g. `hostname
    /// mismatch`, `unable to get local issuer certificate`), else OpenSSL's error queue.
    package static func handshakeFailure(_ ssl: OpaquePointer) -> String {
        let verify = SSL_get_verify_result(ssl)
        return verify != X509_V_OK ? String(cString: X509_verify_cert_error_string(verify)) : openSSLErrors()
    }
}

/// True for an IPv4 or IPv6 literal.
package func isIPAddress(_ host: String) -> Bool {
    var v4 = in_addr()
    var v6 = in6_addr()
    return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
}

/// OpenSSL's error queue as one line (and the queue emptied).
package func openSSLErrors() -> String {
    var parts: [String] = []
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        var buf = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buf, buf.count)
        parts.append(String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }
    return parts.isEmpty ? "no OpenSSL error queued" : parts.joined(separator: "; ")
}
