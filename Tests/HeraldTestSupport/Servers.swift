// The servers tests run against, each on a free loopback port: Tansu (Kafka), redis-server, and TLS material.
import Foundation
import HeraldKafka

#if canImport(Glibc)
import Glibc
#endif

/// A Tansu broker with memory storage on a free loopback port, for one test or suite. Stopped by `stop()` or when
/// the last reference goes.
public final class TansuBroker: Sendable {
    public let port: Int
    public let process: ChildProcess
    public let logDirectory: String

    public var bootstrap: String { "127.0.0.1:\(port)" }
    public var brokers: [String] { [bootstrap] }

    /// Starts the broker and returns once it accepts connections (a port taken meanwhile is retried with another).
    public init() throws {
        TestProcess.prepare()
        let binary = try Paths.tansu()
        let dir = try temporaryDirectory("herald-tansu")
        var failure = "unknown"
        for attempt in 0..<5 {
            let port = try freePort()
            let process = ChildProcess(
                name: "tansu", executable: binary,
                arguments: [
                    "broker", "--listener-url", "tcp://127.0.0.1:\(port)",
                    "--advertised-listener-url", "tcp://127.0.0.1:\(port)", "--storage-engine", "memory://tansu/",
                ], logPath: dir + "/tansu-\(attempt).log")
            try process.start()
            if eventuallyBlocking(timeout: .seconds(60), { !process.isRunning || portAcceptsConnections(port) }),
                process.isRunning
            {
                self.port = port
                self.process = process
                self.logDirectory = dir
                return
            }
            failure = process.isRunning ? "port \(port) never opened" : "exited: \(process.logTail(5))"
            process.killNow()
        }
        throw TestSupportError("Tansu did not start: \(failure)")
    }

    /// `init()` on a thread of its own, so starting a broker does not hold a cooperative thread.
    public static func start() async throws -> TansuBroker {
        try await offPool { try TansuBroker() }
    }

    /// Creates topics (name, partitions), retrying while the broker settles.
    public func createTopics(_ topics: [(String, Int32)]) async throws {
        var configuration = KafkaAdminConfiguration(brokers: brokers)
        configuration.requestTimeout = .seconds(10)
        var lastError: (any Error)?
        let created = await eventually(timeout: .seconds(120), interval: .milliseconds(100)) {
            do {
                _ = try await KafkaAdmin.createTopics(
                    topics.map { TopicSpec(name: $0.0, partitions: $0.1) },
                    configuration: configuration)
                return true
            } catch {
                lastError = error
                return false
            }
        }
        guard created else {
            throw TestSupportError("could not create topics on Tansu :\(port): \(lastError.map { "\($0)" } ?? "")")
        }
    }

    /// SIGKILL: the storage is in memory, so nothing is lost that a test needs.
    public func stop() { process.killNow() }

    /// Starts the stopped broker again on the same port (empty: its storage is in memory), on a thread of its own;
    /// returns once it accepts connections.
    public func restart() async throws {
        try await offPool {
            try self.process.start()
            guard
                eventuallyBlocking(
                    timeout: .seconds(60), { !self.process.isRunning || portAcceptsConnections(self.port) }),
                self.process.isRunning
            else {
                throw TestSupportError("Tansu did not start again on port \(self.port): \(self.process.logTail(5))")
            }
        }
    }

    deinit { process.killNow() }
}

/// A real `redis-server` on a free loopback port, without persistence unless `extraArguments` ask for it.
public final class RedisServer: Sendable {
    public let port: Int
    public let process: ChildProcess

    /// A server that speaks TLS only (`--port 0 --tls-port P`), with this certificate and key; `clientCA`
    /// verifies client certificates, required when `requireClientCertificates` (`--tls-auth-clients yes`).
    public struct TLS: Sendable {
        public var certificateFile: String
        public var keyFile: String
        public var clientCAFile: String
        public var requireClientCertificates: Bool

        public init(certificateFile: String, keyFile: String, clientCAFile: String, requireClientCertificates: Bool) {
            self.certificateFile = certificateFile
            self.keyFile = keyFile
            self.clientCAFile = clientCAFile
            self.requireClientCertificates = requireClientCertificates
        }

        var arguments: [String] {
            [
                "--tls-cert-file", certificateFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", clientCAFile,
                "--tls-auth-clients", requireClientCertificates ? "yes" : "no",
            ]
        }
    }

    public init(extraArguments: [String] = [], tls: TLS? = nil) throws {
        TestProcess.prepare()
        let dir = try temporaryDirectory("herald-redis")
        // A free port can be taken by another process before redis-server binds it (parallel suites open many
        // connections): then try another port, a few times.
        var attempt = 0
        while true {
            let port = try freePort()
            let process = ChildProcess(
                name: "redis", executable: try Paths.tool("redis-server"),
                arguments: (tls.map { ["--port", "0", "--tls-port", "\(port)"] + $0.arguments } ?? [
                    "--port", "\(port)",
                ])
                    + [
                        "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
                        "--loglevel", "warning",
                    ] + extraArguments, logPath: dir + "/redis-\(attempt).log")
            do {
                try Self.start(process, port: port)
                self.port = port
                self.process = process
                return
            } catch {
                attempt += 1
                process.killNow()
                if attempt >= 3 || !process.logTail(20).contains("Address already in use") { throw error }
            }
        }
    }

    /// `init(extraArguments:)` on a thread of its own, so starting a server does not hold a cooperative thread.
    public static func start(extraArguments: [String] = [], tls: TLS? = nil) async throws -> RedisServer {
        try await offPool { try RedisServer(extraArguments: extraArguments, tls: tls) }
    }

    /// `start()` on a thread of its own.
    public func restart() async throws {
        try await offPool { try self.start() }
    }

    /// Starts it (again) on the same port and returns once it accepts connections.
    public func start() throws {
        try Self.start(process, port: port)
    }

    private static func start(_ process: ChildProcess, port: Int) throws {
        try process.start()
        guard eventuallyBlocking(timeout: .seconds(60), { !process.isRunning || portAcceptsConnections(port) }),
            process.isRunning
        else {
            throw TestSupportError("redis-server did not start on port \(port): \(process.logTail(5))")
        }
    }

    /// SIGKILL, as a crash would; returns once it is gone.
    public func kill() { process.killNow() }

    deinit { process.killNow() }
}

/// A temporary directory of TLS material and provider keys, removed when the last reference goes:
/// a self-signed server certificate for 127.0.0.1 / localhost, a client CA with a client certificate (PEM and
/// a .p12 with password `p12Password`), and two ES256 provider keys (.p8), the first with its public key.
public final class TestPKI: Sendable {
    public let dir: String
    public var serverCert: String { dir + "/cert.pem" }
    public var serverKey: String { dir + "/key.pem" }
    public var caCert: String { dir + "/ca.pem" }
    public var clientCert: String { dir + "/client.pem" }
    public var clientKey: String { dir + "/client.key" }
    public var clientP12: String { dir + "/client.p12" }
    public let p12Password = "s3cret"
    /// The provider signing key (PKCS#8 PEM, as Apple's AuthKey_*.p8) and its public key.
    public var providerKey: String { dir + "/AuthKey.p8" }
    public var providerPublicKey: String { dir + "/AuthKey.pub.pem" }
    /// A second provider key, for "signed by the wrong key" cases.
    public var otherProviderKey: String { dir + "/Other.p8" }
    public let keyID = "KEY1234567"
    public let teamID = "TEAM123456"

    public init() throws {
        dir = try temporaryDirectory("herald-pki")
        let steps: [[String]] = [
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "key.pem",
                "-out", "cert.pem", "-subj", "/CN=localhost", "-days", "2", "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ],
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
                "-out", "ca.pem", "-subj", "/CN=Herald Test CA", "-days", "2",
            ],
            [
                "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "client.key",
                "-out", "client.csr", "-subj", "/CN=com.example.chat",
            ],
            [
                "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "client.pem", "-days", "2",
            ],
            [
                "pkcs12", "-export", "-in", "client.pem", "-inkey", "client.key", "-out", "client.p12",
                "-passout", "pass:\(p12Password)",
            ],
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "AuthKey.p8"],
            ["pkey", "-in", "AuthKey.p8", "-pubout", "-out", "AuthKey.pub.pem"],
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "Other.p8"],
        ]
        for step in steps {
            try runToolChecked("openssl", step, cwd: dir)
        }
    }

    /// `init()` on a thread of its own: the eight `openssl` runs do not hold a cooperative thread.
    public static func make() async throws -> TestPKI {
        try await offPool { try TestPKI() }
    }

    /// A server certificate and key issued by the test CA (`caCert`) for `localhost` and `127.0.0.1`, made on the
    /// first call (`caSignedServerCert`, `caSignedServerKey`); the plain `serverCert` is self-signed.
    public var caSignedServerCert: String { dir + "/server-by-ca.pem" }
    public var caSignedServerKey: String { dir + "/server-by-ca.key" }

    public func makeCASignedServerCertificate() throws {
        if FileManager.default.fileExists(atPath: caSignedServerCert) { return }
        let extensions = try write("server-by-ca.ext", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        try runToolChecked(
            "openssl",
            [
                "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server-by-ca.key",
                "-out", "server-by-ca.csr", "-subj", "/CN=localhost",
            ], cwd: dir)
        try runToolChecked(
            "openssl",
            [
                "x509", "-req", "-in", "server-by-ca.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "server-by-ca.pem", "-days", "2", "-extfile", extensions,
            ], cwd: dir)
    }

    /// Writes a file into the directory and returns its path.
    public func write(_ name: String, _ text: String) throws -> String {
        let path = dir + "/" + name
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }
}
