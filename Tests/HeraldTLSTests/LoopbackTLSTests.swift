// The client context against a real TLS server on loopback: the test CA's certificates (HeraldTestSupport's
// TestPKI), a wrong CA, a wrong name, client certificates and ALPN.
import COpenSSL
import HeraldTLS
import HeraldTestSupport
import Testing

@Suite("The TLS client context against a server on loopback")
struct LoopbackTLSTests {
    /// TLS material with a server certificate issued by the test CA.
    static func pki() async throws -> TestPKI {
        let pki = try await TestPKI.make()
        try await offPool { try pki.makeCASignedServerCertificate() }
        return pki
    }

    @Test("a server certificate issued by the trusted CA verifies, by DNS name and by IP address")
    func trustedCA() async throws {
        let pki = try await Self.pki()
        let server = try LoopbackTLSServer(certificate: pki.caSignedServerCert, key: pki.caSignedServerKey)
        let context = try TLSClientContext(trustedCAFile: pki.caCert)
        for name in ["localhost", "127.0.0.1"] {
            async let served = server.accept()
            let client = try await clientHandshake(context, port: server.port, serverName: name)
            #expect(client.completed, "\(name): \(client.failure)")
            #expect(try await served.completed)
        }
    }

    @Test(
        "a certificate the client cannot verify fails the handshake, and the reason says why",
        arguments: [
            // The server presents its self-signed certificate; the client trusts only the test CA.
            (false, "localhost", "certificate"),
            // Issued by the test CA for localhost and 127.0.0.1, not for the name the client verifies.
            (true, "api.push.apple.com", "hostname mismatch"),
        ])
    func unverifiable(caSigned: Bool, serverName: String, reason: String) async throws {
        let pki = try await Self.pki()
        let server = try LoopbackTLSServer(
            certificate: caSigned ? pki.caSignedServerCert : pki.serverCert,
            key: caSigned ? pki.caSignedServerKey : pki.serverKey)
        let context = try TLSClientContext(trustedCAFile: pki.caCert)
        async let served = server.accept()
        let client = try await clientHandshake(context, port: server.port, serverName: serverName)
        #expect(!client.completed)
        #expect(client.failure.contains(reason), "\(client.failure)")
        #expect(try await !served.completed)
    }

    @Test("ALPN: the server's choice among the offered protocols is what the session reports")
    func alpn() async throws {
        let pki = try await Self.pki()
        let server = try LoopbackTLSServer(
            certificate: pki.caSignedServerCert, key: pki.caSignedServerKey, alpn: ["h2"])
        let context = try TLSClientContext(trustedCAFile: pki.caCert)

        async let h2 = server.accept()
        let offered = try await clientHandshake(
            context, port: server.port, serverName: "localhost", alpn: ["h2", "http/1.1"])
        #expect(offered.completed, "\(offered.failure)")
        #expect(offered.alpn == "h2")
        #expect(try await h2.alpn == "h2")

        // A client offering only what the server does not speak gets no protocol, not an error.
        async let none = server.accept()
        let other = try await clientHandshake(context, port: server.port, serverName: "localhost", alpn: ["http/1.1"])
        #expect(other.completed, "\(other.failure)")
        #expect(other.alpn == "")
        #expect(try await none.alpn == "")
    }

    @Test("a client certificate issued by the server's client CA is presented and verified")
    func clientCertificate() async throws {
        let pki = try await Self.pki()
        let server = try LoopbackTLSServer(
            certificate: pki.caSignedServerCert, key: pki.caSignedServerKey, clientCA: pki.caCert)
        let context = try TLSClientContext(
            trustedCAFile: pki.caCert, certificateFile: pki.clientCert, privateKeyFile: pki.clientKey)
        async let served = server.accept()
        let client = try await clientHandshake(context, port: server.port, serverName: "localhost")
        #expect(client.completed, "\(client.failure)")
        let seen = try await served
        #expect(seen.completed && seen.clientVerified)
    }

    @Test("a server that requires a client certificate refuses a client without one")
    func clientCertificateRequired() async throws {
        let pki = try await Self.pki()
        let server = try LoopbackTLSServer(
            certificate: pki.caSignedServerCert, key: pki.caSignedServerKey, clientCA: pki.caCert)
        let context = try TLSClientContext(trustedCAFile: pki.caCert)
        async let served = server.accept()
        // Under TLS 1.3 the client's side may finish before the server's refusal arrives: the server's is the
        // verdict.
        _ = try await clientHandshake(context, port: server.port, serverName: "localhost")
        #expect(try await !served.completed)
    }
}

@Suite("Client certificate loading")
struct ClientCertificateLoadingTests {
    /// The kind of `TLSSetupError` that making the context throws; nil when it is made.
    static func kind(_ body: () throws -> TLSClientContext) -> TLSSetupError.Kind? {
        do {
            _ = try body()
            return nil
        } catch let error as TLSSetupError {
            return error.kind
        } catch {
            Issue.record("not a TLSSetupError: \(error)")
            return nil
        }
    }

    @Test("a missing, unreadable or mismatched client certificate or key is a credential error")
    func credentialErrors() async throws {
        let pki = try await TestPKI.make()
        let garbage = try pki.write(
            "garbage.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        let cases: [(String, String, String)] = [
            ("missing certificate", pki.dir + "/absent.pem", pki.clientKey),
            ("missing key", pki.clientCert, pki.dir + "/absent.key"),
            ("certificate file that is no certificate", garbage, pki.clientKey),
            ("key file that is no key", pki.clientCert, garbage),
            ("key of another certificate", pki.clientCert, pki.serverKey),
        ]
        for (name, certificate, key) in cases {
            let kind = Self.kind {
                try TLSClientContext(trustedCAFile: pki.caCert, certificateFile: certificate, privateKeyFile: key)
            }
            #expect(kind == .credential, "\(name)")
        }
    }

    @Test("a trust file that does not load is a trust error, not a credential error")
    func trustError() async throws {
        let pki = try await TestPKI.make()
        let kind = Self.kind {
            try TLSClientContext(
                trustedCAFile: pki.dir + "/absent-ca.pem", certificateFile: pki.clientCert,
                privateKeyFile: pki.clientKey)
        }
        #expect(kind == .trust)
    }

    @Test("the client certificate and its key load together")
    func loads() async throws {
        let pki = try await TestPKI.make()
        #expect(
            Self.kind {
                try TLSClientContext(
                    trustedCAFile: pki.caCert, certificateFile: pki.clientCert, privateKeyFile: pki.clientKey)
            } == nil)
    }
}
