import Foundation
import HeraldRedis
import HeraldTestSupport
import Testing

/// `rediss://` against a real `redis-server` that speaks TLS only (`--port 0 --tls-port P`), with a test CA made by
/// openssl for the run: the server's certificate is issued by that CA for `localhost` and `127.0.0.1`.
@Suite("Redis over TLS against a real redis-server")
struct RedisTLSTests {
    /// The PKI and a TLS-only server; `requireClientCertificates` starts it with `--tls-auth-clients yes`.
    static func tlsServer(
        requireClientCertificates: Bool = false, extraArguments: [String] = []
    ) async throws -> (
        TestPKI, RedisServer
    ) {
        let pki = try await TestPKI.make()
        try pki.makeCASignedServerCertificate()
        let server = try await RedisServer.start(
            extraArguments: extraArguments,
            tls: RedisServer.TLS(
                certificateFile: pki.caSignedServerCert, keyFile: pki.caSignedServerKey, clientCAFile: pki.caCert,
                requireClientCertificates: requireClientCertificates))
        return (pki, server)
    }

    /// `rediss://127.0.0.1:port` trusting the test CA, with the short timeouts of `RedisServer.configuration`.
    static func configuration(_ server: RedisServer, _ pki: TestPKI, url: String? = nil) throws -> RedisConfiguration {
        var configuration = try RedisConfiguration(url: url ?? "rediss://127.0.0.1:\(server.port)")
        configuration.connectTimeout = .seconds(5)
        configuration.initialBackoff = .milliseconds(20)
        configuration.maximumBackoff = .milliseconds(200)
        try configuration.applyTLS(caFile: pki.caCert)
        return configuration
    }

    /// The connect error of a connection that must not come up (its first command opens it).
    static func connectError(_ configuration: RedisConfiguration) async -> RedisError? {
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        do {
            _ = try await redis.send("PING")
            return nil
        } catch let error as RedisError {
            #expect(!redis.isConnected)
            return error
        } catch {
            Issue.record("unexpected error \(error)")
            return nil
        }
    }

    @Test("commands and a pipeline over TLS, verified against the certificate's IP address and its DNS name")
    func commandsAndPipeline() async throws {
        let (pki, server) = try await Self.tlsServer()
        let redis = RedisConnection(configuration: try Self.configuration(server, pki))
        defer { redis.close() }
        #expect(try await redis.send("SET", "k", "v") == .status("OK"))
        #expect(try await redis.send("GET", "k") == .string(Data("v".utf8)))
        let writes = (0..<500).map { RedisCommand("SET", "key:\($0)", "value-\($0)") }
        let replies = try await redis.pipeline(writes + [RedisCommand("GET", "key:499"), RedisCommand("DBSIZE")])
        #expect(replies.count == 502)
        #expect(replies.prefix(500).allSatisfy { $0 == .status("OK") })
        #expect(replies[500] == .string(Data("value-499".utf8)))
        #expect(replies[501] == .integer(501))
        // The server has no plaintext port: every byte above went over TLS.
        #expect(
            try await redis.send("CONFIG", "GET", "port")
                == .array([.string(Data("port".utf8)), .string(Data("0".utf8))]))

        // By DNS name: connect to 127.0.0.1, verify (and send SNI) for "localhost".
        var byName = try Self.configuration(server, pki)
        try byName.applyTLS(serverName: "localhost")
        let named = RedisConnection(configuration: byName)
        defer { named.close() }
        #expect(try await named.send("GET", "k") == .string(Data("v".utf8)))
    }

    @Test("a certificate for another host name is refused, and nothing is sent")
    func wrongHostName() async throws {
        let (pki, server) = try await Self.tlsServer()
        var configuration = try Self.configuration(server, pki)
        try configuration.applyTLS(serverName: "redis.example.org")
        let error = try #require(await Self.connectError(configuration))
        #expect(error.code == .connectFailed, "\(error)")
        #expect(error.message.contains("hostname mismatch"), "\(error)")

        // An IP literal is checked against the certificate's IP addresses: 127.0.0.2 is not among them.
        var otherIP = try Self.configuration(server, pki)
        try otherIP.applyTLS(serverName: "127.0.0.2")
        let ipError = try #require(await Self.connectError(otherIP))
        #expect(ipError.message.contains("IP address mismatch"), "\(ipError)")
    }

    @Test("a server certificate from a CA that is not trusted is refused (a CA file replaces the system store)")
    func untrustedCA() async throws {
        let (pki, server) = try await Self.tlsServer()
        // Trusting another certificate only: the test CA is not in it.
        var otherCA = try RedisConfiguration(url: "rediss://127.0.0.1:\(server.port)")
        try otherCA.applyTLS(caFile: pki.serverCert)
        let error = try #require(await Self.connectError(otherCA))
        #expect(error.code == .connectFailed, "\(error)")
        // redis-server sends its chain up to the test CA, so OpenSSL reports that self-signed root as untrusted.
        #expect(
            error.message.contains("self-signed certificate in certificate chain")
                || error.message.contains("unable to get local issuer certificate"), "\(error)")

        // The system trust store does not hold the test CA either.
        let systemStore = try #require(
            await Self.connectError(try RedisConfiguration(url: "rediss://127.0.0.1:\(server.port)")))
        #expect(systemStore.message.contains("certificate"), "\(systemStore)")
    }

    @Test("a server that requires client certificates refuses a client without one and accepts one with one")
    func clientCertificate() async throws {
        let (pki, server) = try await Self.tlsServer(requireClientCertificates: true)
        let without = RedisConnection(configuration: try Self.configuration(server, pki))
        defer { without.close() }
        // With TLS 1.3 the server may refuse only after the client's side of the handshake ended: the handshake or
        // the first command fails.
        await #expect(throws: RedisError.self) { try await without.send("PING") }

        var configuration = try Self.configuration(server, pki)
        try configuration.applyTLS(certificateFile: pki.clientCert, keyFile: pki.clientKey)
        let with = RedisConnection(configuration: configuration)
        defer { with.close() }
        #expect(try await with.send("PING") == .status("PONG"))
    }

    @Test("an ACL user and database from a rediss:// URL are applied over TLS")
    func aclUserOverTLS() async throws {
        let (pki, server) = try await Self.tlsServer(extraArguments: [
            "--user", "default", "off", "--user", "herald", "on", ">p4ss", "~herald:*", "+@all",
        ])
        let configuration = try Self.configuration(server, pki, url: "rediss://herald:p4ss@127.0.0.1:\(server.port)/2")
        #expect("\(configuration)".hasPrefix("rediss://herald:***@") && !"\(configuration)".contains("p4ss"))
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        #expect(try await redis.send("ACL", "WHOAMI").text == "herald")
        #expect(try await redis.send("SET", "herald:x", "1") == .status("OK"))
        #expect((try await redis.send("CLIENT", "INFO").text ?? "").contains("db=2"))

        let wrongPassword = try Self.configuration(server, pki, url: "rediss://herald:nope@127.0.0.1:\(server.port)")
        let refused = try #require(await Self.connectError(wrongPassword))
        #expect(refused.message.contains("AUTH refused"), "\(refused)")
    }

    @Test("after the server restarts the connection reconnects with a new TLS handshake")
    func reconnectAfterRestart() async throws {
        let (pki, server) = try await Self.tlsServer()
        let redis = RedisConnection(configuration: try Self.configuration(server, pki))
        defer { redis.close() }
        #expect(try await redis.send("SET", "a", "1") == .status("OK"))
        server.kill()
        try await server.restart()

        do {
            _ = try await redis.send("GET", "a")
            Issue.record("the command on the dead connection should have failed")
        } catch let error as RedisError {
            #expect(error.isRetryable, "\(error)")
        }
        #expect(!redis.isConnected)
        let replies = try await redis.pipeline([RedisCommand("SET", "b", "2"), RedisCommand("GET", "b")])
        #expect(replies == [.status("OK"), .string(Data("2".utf8))])
        // The restarted server started empty: the retry went to the new process, over TLS (its only port).
        #expect(try await redis.send("GET", "a") == .null)
    }

    @Test("rediss:// turns TLS on; TLS settings beside a plaintext URL, or a certificate without its key, are refused")
    func configurationRules() throws {
        let pki = try TestPKI()
        #expect(try RedisConfiguration(url: "redis://127.0.0.1:6379").tls == nil)
        let tls = try RedisConfiguration(url: "rediss://user:pw@redis.internal:6380/1")
        #expect(tls.tls == RedisTLSConfiguration())
        #expect(tls.host == "redis.internal" && tls.port == 6380 && tls.database == 1 && tls.username == "user")

        var plain = try RedisConfiguration(url: "redis://127.0.0.1:6379")
        #expect(throws: RedisError.self) { try plain.applyTLS(caFile: pki.caCert) }
        #expect(throws: RedisError.self) { try plain.applyTLS(serverName: "redis.internal") }
        #expect(plain.tls == nil)

        var secure = try RedisConfiguration(url: "rediss://127.0.0.1:6379")
        #expect(throws: RedisError.self) { try secure.applyTLS(certificateFile: pki.clientCert) }
        #expect(throws: RedisError.self) { try secure.applyTLS(caFile: pki.dir + "/missing.pem") }
        #expect(throws: RedisError.self) { try secure.applyTLS(serverName: "two words") }
        try secure.applyTLS(
            caFile: pki.caCert, certificateFile: pki.clientCert, keyFile: pki.clientKey, serverName: "redis.internal")
        #expect(
            secure.tls
                == RedisTLSConfiguration(
                    caFile: pki.caCert, certificateFile: pki.clientCert, keyFile: pki.clientKey,
                    serverName: "redis.internal"))
    }
}
