// Test support of the APNs client tests: herald-mock-apns and nghttpd as servers, requests, an injectable clock.
// Ports, processes, TLS material and the freezing proxy come from HeraldTestSupport.
import Foundation
import HeraldCore
import HeraldPushProviders
import HeraldTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

enum TestFailure: Error, CustomStringConvertible {
    case failed(String)
    var description: String { if case .failed(let s) = self { return s }; return "" }
}

/// TLS material and provider keys (HeraldTestSupport's `TestPKI`) under the names these tests use.
typealias PKI = TestPKI

extension TestPKI {
    func tokenCredential(key: String? = nil) throws -> APNsClientCredential {
        try APNsClientCredential.token(keyID: keyID, teamID: teamID, p8Path: key ?? providerKey)
    }
}

/// A started server and the port it listens on; stopped (SIGTERM, then SIGKILL) by `stop()` or when dropped.
final class ServerProcess: Sendable {
    let child: ChildProcess
    let port: Int

    init(child: ChildProcess, port: Int) {
        self.child = child
        self.port = port
    }

    func stop() { child.stopNow() }

    deinit { child.stopNow() }
}

/// herald-mock-apns on an ephemeral port, with the agreed CLI (started on a thread of its own).
func startMock(_ pki: PKI, _ extra: [String] = [], authKeys: Bool = true) async throws -> ServerProcess {
    try await offPool { try startMockBlocking(pki, extra, authKeys: authKeys) }
}

func startMockBlocking(_ pki: PKI, _ extra: [String], authKeys: Bool) throws -> ServerProcess {
    TestProcess.prepare()
    let binary = try Paths.executable("herald-mock-apns")
    let portFile = pki.dir + "/port-\(UUID().uuidString)"
    var args = [
        "--port", "0", "--port-file", portFile, "--cert", pki.serverCert, "--key", pki.serverKey,
        "--topic", "com.example.chat",
    ]
    if authKeys { args += ["--auth-key", "\(pki.keyID):\(pki.teamID):\(pki.providerPublicKey)"] }
    let child = ChildProcess(
        name: "herald-mock-apns", executable: binary, arguments: args + extra, logPath: portFile + ".log")
    try child.start()
    var port: Int?
    _ = eventuallyBlocking(timeout: .seconds(60)) {
        port = (try? String(contentsOfFile: portFile, encoding: .utf8)).flatMap {
            Int($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return port != nil || !child.isRunning
    }
    guard let port else {
        child.killNow()
        throw TestFailure.failed("herald-mock-apns did not start: \(child.logTail())")
    }
    return ServerProcess(child: child, port: port)
}

/// nghttpd serving `3/device/<token>` files (POSTs to them answer 200), started on a thread of its own.
func startNghttpd(_ pki: PKI, tokens: [String]) async throws -> ServerProcess {
    try await offPool { try startNghttpdBlocking(pki, tokens: tokens) }
}

func startNghttpdBlocking(_ pki: PKI, tokens: [String]) throws -> ServerProcess {
    TestProcess.prepare()
    let www = pki.dir + "/www-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: www + "/3/device", withIntermediateDirectories: true)
    for t in tokens {
        guard FileManager.default.createFile(atPath: www + "/3/device/" + t, contents: Data("ok".utf8)) else {
            throw TestFailure.failed("cannot write \(www)/3/device/\(t)")
        }
    }
    let nghttpd = try Paths.tool("nghttpd")
    for attempt in 0..<5 {
        let port = try freePort()
        let child = ChildProcess(
            name: "nghttpd", executable: nghttpd,
            arguments: [
                "-d", www, "--address=127.0.0.1",
                "--max-concurrent-streams=1000", String(port), pki.serverKey, pki.serverCert,
            ], logPath: www + "-\(attempt).log")
        try child.start()
        if eventuallyBlocking(timeout: .seconds(5), { !child.isRunning || portAcceptsConnections(port) }),
            child.isRunning
        {
            return ServerProcess(child: child, port: port)
        }
        child.killNow()
    }
    throw TestFailure.failed("nghttpd did not start")
}

/// A wall clock the test moves by hand.
final class TestClock: @unchecked Sendable {
    // @unchecked Sendable: guarded by `lock`.
    private let lock = NSLock()
    private var current: Date
    init(_ start: Date) { current = start }
    var now: Date { lock.withLock { current } }
    func set(_ d: Date) { lock.withLock { current = d } }
    func advance(_ seconds: TimeInterval) { lock.withLock { current += seconds } }
}

/// A hex device token derived from `i`.
func deviceToken(_ i: Int) -> String {
    let hex = String(i, radix: 16)
    return String(repeating: "0", count: 64 - hex.count) + hex
}

let alertPayload = Array(#"{"aps":{"alert":{"title":"Cindy","body":"Hi"}}}"#.utf8)

func request(
    _ i: Int, timeout: Duration = .seconds(20), apnsID: String? = nil, collapseID: String? = nil
) -> PushDelivery {
    PushDelivery(
        deviceToken: deviceToken(i), topic: "com.example.chat", pushType: .alert, priority: .immediately,
        expiration: 0, collapseID: collapseID, apnsID: apnsID, payload: alertPayload, timeout: timeout,
        tag: UInt64(i))
}

func client(
    _ pki: PKI, port: Int, credential: APNsClientCredential? = nil, connections: Int = 1,
    retry: BackoffPolicy = BackoffPolicy(
        initialDelay: .milliseconds(20), maxDelay: .milliseconds(200), maxAttempts: 8),
    pingInterval: Duration = .seconds(60), pingTimeout: Duration = .seconds(10),
    clock: TestClock? = nil, maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 2000
) throws -> APNsClient {
    let cred: APNsClientCredential = try credential ?? pki.tokenCredential()
    let now: @Sendable () -> Date
    if let clock { now = { clock.now } } else { now = { Date() } }
    let config = APNsClientConfiguration(
        credential: cred, environment: .sandbox,
        endpoint: ServiceEndpoint(host: "127.0.0.1", port: port), trustedCAFile: pki.serverCert,
        connections: connections, maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight,
        pingInterval: pingInterval, pingTimeout: pingTimeout,
        reconnectBackoff: BackoffPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(500)),
        retry: retry, now: now)
    return try APNsClient(configuration: config)
}

/// Sends all requests as one batch and returns the responses by tag.
func sendAll(_ client: APNsClient, _ requests: [PushDelivery]) async -> [UInt64: PushResponse] {
    var out: [UInt64: PushResponse] = [:]
    for await r in client.responses(for: requests) {
        #expect(out[r.tag] == nil, "request \(r.tag) completed twice")
        out[r.tag] = r
    }
    return out
}

/// The mock's record file as (token, status) lines.
func recordedLines(_ path: String) throws -> [[String: Any]] {
    let text = try String(contentsOfFile: path, encoding: .utf8)
    return text.split(separator: "\n").compactMap {
        try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
    }
}

/// Waits until the record file has at least `n` lines (the mock writes it from its own thread).
func waitForRecords(_ path: String, atLeast n: Int) async throws -> [[String: Any]] {
    var lines: [[String: Any]] = []
    _ = await eventually(timeout: .seconds(60)) {
        lines = (try? recordedLines(path)) ?? []
        return lines.count >= n
    }
    return lines
}

final class TestCount: @unchecked Sendable {
    // @unchecked Sendable: guarded by `lock`.
    private let lock = NSLock()
    private var n = 0
    @discardableResult func add(_ d: Int) -> Int {
        lock.withLock {
            n += d; return n
        }
    }
    var value: Int { lock.withLock { n } }
}
