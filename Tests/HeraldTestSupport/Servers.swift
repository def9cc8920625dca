// The servers tests run against, each on a free loopback port: Tansu and herald-dev-broker (Kafka), redis-server, and
// TLS material.
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

/// herald-dev-broker (librdkafka's mock cluster behind a control API; docs/kafka.md, "The local and test broker") on
/// free loopback ports: broker i on `port` + i - 1, the control API on `controlPort`. Stopped by `stop()` or when the
/// last reference goes. Unlike Tansu it has no CreateTopics request: `createTopics` goes through the control API (a
/// topic produced to before it exists gets 4 partitions).
public final class DevBroker: Sendable {
    /// The port of broker 1.
    public let port: Int
    public let brokerCount: Int
    public let controlPort: Int
    public let process: ChildProcess
    public let logDirectory: String

    public var ports: [Int] { (0..<brokerCount).map { port + $0 } }
    public var brokers: [String] { ports.map { "127.0.0.1:\($0)" } }
    public var bootstrap: String { brokers.joined(separator: ",") }

    /// One broker as `GET /brokers` shows it: `leads` lists `topic/partition`.
    public struct BrokerState: Decodable, Sendable, Equatable {
        public var id: Int32
        public var port: Int
        public var up: Bool
        public var leads: [String]?
    }

    /// A partition whose leadership moved.
    public struct LeaderMove: Decodable, Sendable, Equatable {
        public var topic: String
        public var partition: Int32
        public var from: Int32
        public var to: Int32
    }

    /// What taking a broker down did: the partitions and groups whose leadership moved.
    public struct DownResult: Decodable, Sendable {
        public var broker: Int32
        public var moved: [LeaderMove]
        public var groupsMoved: [String: Int32]
        public var note: String?
    }

    /// Starts `brokers` brokers on consecutive free ports with `topics` (name, partitions) created, and returns once
    /// the process printed its ready line (ports taken meanwhile are retried with others).
    public init(brokers: Int = 3, topics: [(String, Int32)] = [], extraArguments: [String] = []) throws {
        TestProcess.prepare()
        let binary = try Paths.executable("herald-dev-broker")
        let dir = try temporaryDirectory("herald-dev-broker")
        var failure = "unknown"
        for attempt in 0..<5 {
            let ports = try Self.consecutiveFreePorts(brokers)
            let controlPort = try freePort()
            let process = ChildProcess(
                name: "herald-dev-broker", executable: binary,
                arguments: [
                    "--brokers", "\(brokers)", "--port", "\(ports[0])", "--control-port", "\(controlPort)",
                ] + topics.flatMap { ["--topic", "\($0.0):\($0.1)"] } + extraArguments,
                logPath: dir + "/dev-broker-\(attempt).log")
            try process.start()
            if Self.waitReady(process) {
                self.port = ports[0]
                self.brokerCount = brokers
                self.controlPort = controlPort
                self.process = process
                self.logDirectory = dir
                return
            }
            failure = process.isRunning ? "no ready line" : "exited: \(process.logTail(5))"
            process.killNow()
        }
        throw TestSupportError("herald-dev-broker did not start: \(failure)")
    }

    /// `init` on a thread of its own, so starting a broker does not hold a cooperative thread.
    public static func start(
        brokers: Int = 3, topics: [(String, Int32)] = [], extraArguments: [String] = []
    ) async throws -> DevBroker {
        try await offPool { try DevBroker(brokers: brokers, topics: topics, extraArguments: extraArguments) }
    }

    /// A port for a herald-dev-broker another program starts (scripts/local-stack.sh): it and the two above it
    /// handed out by `freePort()`, and the control port 100 above it accepting no connection now.
    public static func freeBasePort() throws -> Int {
        for _ in 0..<50 {
            let ports = try consecutiveFreePorts(3)
            if !portAcceptsConnections(ports[0] + 100) { return ports[0] }
        }
        throw TestSupportError("no free ports for a herald-dev-broker")
    }

    /// `count` consecutive ports that `freePort()` handed out (it walks the port range in order).
    private static func consecutiveFreePorts(_ count: Int) throws -> [Int] {
        for _ in 0..<50 {
            var ports = [try freePort()]
            while ports.count < count {
                let next = try freePort()
                guard next == ports[ports.count - 1] + 1 else { break }
                ports.append(next)
            }
            if ports.count == count { return ports }
        }
        throw TestSupportError("no \(count) consecutive free ports")
    }

    /// Whether the run started last printed its ready line (60 s at most, less if it exits).
    private static func waitReady(_ process: ChildProcess) -> Bool {
        eventuallyBlocking(timeout: .seconds(60)) {
            guard process.isRunning else { return true }
            let text = (try? String(contentsOfFile: process.logPath, encoding: .utf8)) ?? ""
            let run = text.components(separatedBy: "---- start ").last ?? ""
            return run.contains("herald-dev-broker ready")
        } && process.isRunning
    }

    /// Creates topics (name, partitions) through the control API; existing ones are left alone.
    public func createTopics(_ topics: [(String, Int32)]) async throws {
        for (name, partitions) in topics {
            _ = try await control("POST", "/topics?name=\(name)&partitions=\(partitions)")
        }
    }

    /// The brokers, whether each is up and which partitions it leads.
    public func brokerStates() async throws -> [BrokerState] {
        try decode([BrokerState].self, try await control("GET", "/brokers"))
    }

    /// Takes broker `broker` (1-based) down: the partitions it leads, and those of `groups` it coordinates, move to
    /// brokers that are up first.
    @discardableResult
    public func setDown(broker: Int32, groups: [String] = []) async throws -> DownResult {
        let query = groups.isEmpty ? "" : "?groups=" + groups.joined(separator: ",")
        return try decode(DownResult.self, try await control("POST", "/brokers/\(broker)/down\(query)"))
    }

    /// Lets broker `broker` accept connections again (leadership stays where it was moved).
    public func setUp(broker: Int32) async throws {
        _ = try await control("POST", "/brokers/\(broker)/up")
    }

    /// Makes `broker` the leader of `topic`/`partition`.
    public func moveLeader(topic: String, partition: Int32, to broker: Int32) async throws {
        _ = try await control("POST", "/partitions/leader?topic=\(topic)&partition=\(partition)&broker=\(broker)")
    }

    /// The broker coordinating `group` (as FindCoordinator answers).
    public func coordinator(ofGroup group: String) async throws -> Int32 {
        struct Answer: Decodable { var coordinator: Int32 }
        return try decode(Answer.self, try await control("GET", "/groups/\(group)")).coordinator
    }

    /// Makes `broker` the coordinator of `group`.
    public func pinCoordinator(group: String, to broker: Int32) async throws {
        _ = try await control("POST", "/groups/\(group)/coordinator?broker=\(broker)")
    }

    /// One control request; throws unless it was answered 200.
    public func control(_ method: String, _ target: String) async throws -> String {
        let answer = try await TestHTTP.request(port: controlPort, method: method, path: target)
        guard answer.status == 200 else {
            throw TestSupportError("\(method) \(target) on herald-dev-broker: \(answer.status) \(answer.body)")
        }
        return answer.body
    }

    private func decode<T: Decodable>(_ type: T.Type, _ body: String) throws -> T {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(type, from: Data(body.utf8))
    }

    /// SIGTERM (SIGKILL after 3 s): the cluster is in memory, so nothing is lost that a test needs.
    public func stop() { process.stopNow() }

    /// Starts the stopped broker again on the same ports (empty but for the start-up topics: everything is in
    /// memory), on a thread of its own; returns once it printed its ready line.
    public func restart() async throws {
        try await offPool {
            try self.process.start()
            guard Self.waitReady(self.process) else {
                throw TestSupportError(
                    "herald-dev-broker did not start again on port \(self.port): \(self.process.logTail(5))")
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
