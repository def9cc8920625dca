// Test support of the APNs client tests: herald-mock-apns and nghttpd as servers, requests, an injectable clock,
// a freezing proxy. Ports, processes and TLS material come from HeraldTestSupport.
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
    for t in tokens { FileManager.default.createFile(atPath: www + "/3/device/" + t, contents: Data("ok".utf8)) }
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
) -> APNsDelivery {
    APNsDelivery(
        deviceToken: deviceToken(i), topic: "com.example.chat", pushType: .alert, priority: .immediately,
        expiration: 0, collapseID: collapseID, apnsID: apnsID, payload: alertPayload, timeout: timeout,
        tag: UInt64(i))
}

func client(
    _ pki: PKI, port: Int, credential: APNsClientCredential? = nil, connections: Int = 1,
    retry: APNsBackoffPolicy = APNsBackoffPolicy(
        initialDelay: .milliseconds(20), maxDelay: .milliseconds(200), maxAttempts: 8),
    pingInterval: Duration = .seconds(60), pingTimeout: Duration = .seconds(10),
    clock: TestClock? = nil, maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 2000
) throws -> APNsClient {
    let cred: APNsClientCredential = try credential ?? pki.tokenCredential()
    let now: @Sendable () -> Date
    if let clock { now = { clock.now } } else { now = { Date() } }
    let config = APNsClientConfiguration(
        credential: cred, environment: .sandbox,
        endpoint: APNsEndpoint(host: "127.0.0.1", port: port), trustedCAFile: pki.serverCert,
        connections: connections, maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight,
        pingInterval: pingInterval, pingTimeout: pingTimeout,
        reconnectBackoff: APNsBackoffPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(500)),
        retry: retry, now: now)
    return try APNsClient(configuration: config)
}

/// Sends all requests as one batch and returns the responses by tag.
func sendAll(_ client: APNsClient, _ requests: [APNsDelivery]) async -> [UInt64: APNsResponse] {
    var out: [UInt64: APNsResponse] = [:]
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

/// A TCP relay on loopback in front of a server. `freeze()` makes the connections open at that
/// moment silently swallow everything in both directions (a peer that stopped answering, as
/// behind a dead NAT entry); connections opened later relay normally.
final class FreezingProxy: @unchecked Sendable {
    // @unchecked Sendable: `frozenBefore` and `accepted` are guarded by `lock`; sockets are
    // owned by the threads that pump them.
    let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var accepted = 0
    private var frozenBefore = 0
    private var closed = false

    init(upstreamPort: Int) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0
            }
        }
        guard ok, listen(fd, 16) == 0 else { throw TestFailure.failed("proxy cannot listen") }
        port = Int(UInt16(bigEndian: addr.sin_port))
        listener = fd
        Thread { [self] in
            // The listener is closed here, by its only user, once `stop` has shut it down: closed in `stop`, its
            // number could be reused by another socket of the test process while this loop still accepts on it.
            defer { close(fd) }
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 { return }
                let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var up = sockaddr_in()
                up.sin_family = sa_family_t(AF_INET)
                up.sin_addr.s_addr = inet_addr("127.0.0.1")
                up.sin_port = UInt16(upstreamPort).bigEndian
                let rc = withUnsafeMutablePointer(to: &up) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
                if rc != 0 { close(client); close(upstream); continue }
                let index = lock.withLock {
                    accepted += 1; return accepted
                }
                let pair = SocketPair(client, upstream)
                for (from, to) in [(client, upstream), (upstream, client)] {
                    Thread { [self] in
                        self.pump(from: from, to: to, index: index)
                        pair.release()
                    }.start()
                }
            }
        }.start()
    }

    private func pump(from: Int32, to: Int32, index: Int) {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(from, &buffer, buffer.count)
            if n <= 0 { break }
            let frozen = lock.withLock { index <= frozenBefore }
            if frozen { continue }
            var off = 0
            while off < n {
                let w = buffer.withUnsafeBufferPointer { write(to, $0.baseAddress! + off, n - off) }
                if w <= 0 { break }
                off += w
            }
        }
        shutdown(to, Int32(SHUT_WR))
    }

    /// Connections accepted so far go silent.
    func freeze() { lock.withLock { frozenBefore = accepted } }

    var connectionsAccepted: Int { lock.withLock { accepted } }

    func stop() {
        let wasClosed = lock.withLock {
            let c = closed; closed = true; return c
        }
        if !wasClosed { shutdown(listener, Int32(SHUT_RDWR)) }
    }

    deinit { stop() }
}

/// A relayed connection's two sockets, closed together once both directions' pumps have ended.
private final class SocketPair: @unchecked Sendable {
    // @unchecked Sendable: `pumping` is guarded by `lock`.
    private let lock = NSLock()
    private let sockets: (Int32, Int32)
    private var pumping = 2

    init(_ a: Int32, _ b: Int32) { sockets = (a, b) }

    func release() {
        let last = lock.withLock {
            pumping -= 1
            return pumping == 0
        }
        guard last else { return }
        close(sockets.0)
        close(sockets.1)
    }
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
