// Test support: TLS material, processes (herald-mock-apns, nghttpd, python3), an injectable clock.
import Foundation
import HeraldAPNs
import HeraldCore
import Testing
#if canImport(Glibc)
import Glibc
#endif

enum TestFailure: Error, CustomStringConvertible {
    case failed(String)
    var description: String { if case .failed(let s) = self { return s }; return "" }
}

struct ToolResult {
    var status: Int32
    var output: String
}

@discardableResult
func tool(_ executable: String, _ arguments: [String], cwd: String? = nil, stdin: String? = nil) throws -> ToolResult {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable.hasPrefix("/") ? executable : "/usr/bin/env")
    p.arguments = executable.hasPrefix("/") ? arguments : [executable] + arguments
    if let cwd { p.currentDirectoryURL = URL(fileURLWithPath: cwd) }
    let out = Pipe()
    p.standardOutput = out
    p.standardError = out
    let input = Pipe()
    p.standardInput = input
    try p.run()
    if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
    try? input.fileHandleForWriting.close()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return ToolResult(status: p.terminationStatus, output: String(decoding: data, as: UTF8.self))
}

/// The package's build folder ($HERALD_BIN_DIR overrides).
func binDirectory() -> String {
    if let dir = ProcessInfo.processInfo.environment["HERALD_BIN_DIR"] { return dir }
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    return root.appendingPathComponent(".build/debug").path
}

/// Server certificate (self-signed, 127.0.0.1), a client CA and client certificate (+ .p12),
/// and two provider keys (.p8) with public keys.
final class PKI: @unchecked Sendable {
    // @unchecked Sendable: immutable after init.
    let dir: String
    var serverCert: String { dir + "/cert.pem" }
    var serverKey: String { dir + "/key.pem" }
    var clientCA: String { dir + "/ca.pem" }
    var clientCert: String { dir + "/client.pem" }
    var clientKey: String { dir + "/client.key" }
    var clientP12: String { dir + "/client.p12" }
    let p12Password = "s3cret"
    var authKey: String { dir + "/AuthKey.p8" }
    var authPublic: String { dir + "/AuthKey.pub.pem" }
    var otherKey: String { dir + "/Other.p8" }
    let keyID = "KEY1234567"
    let teamID = "TEAM123456"

    init() throws {
        dir = NSTemporaryDirectory() + "herald-apns-tests-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let steps: [[String]] = [
            ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "key.pem",
             "-out", "cert.pem", "-subj", "/CN=localhost", "-days", "2", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-subj", "/CN=Herald Test CA", "-days", "2"],
            ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "client.key",
             "-out", "client.csr", "-subj", "/CN=com.example.chat"],
            ["x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "client.pem", "-days", "2"],
            ["pkcs12", "-export", "-in", "client.pem", "-inkey", "client.key", "-out", "client.p12",
             "-passout", "pass:s3cret"],
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "AuthKey.p8"],
            ["pkey", "-in", "AuthKey.p8", "-pubout", "-out", "AuthKey.pub.pem"],
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "Other.p8"],
        ]
        for s in steps {
            let r = try tool("openssl", s, cwd: dir)
            guard r.status == 0 else { throw TestFailure.failed("openssl \(s.joined(separator: " ")): \(r.output)") }
        }
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }

    func tokenCredential(key: String? = nil) throws -> APNsClientCredential {
        try APNsClientCredential.token(keyID: keyID, teamID: teamID, p8Path: key ?? authKey)
    }
}

/// A started server process, stopped (SIGTERM, then SIGKILL) by its own pid.
final class ServerProcess: @unchecked Sendable {
    // @unchecked Sendable: `process` is only used to signal and poll its own child.
    let process: Process
    let port: Int

    init(process: Process, port: Int) {
        self.process = process
        self.port = port
    }

    func stop() {
        let pid = process.processIdentifier
        kill(pid, SIGTERM)
        for _ in 0..<150 where process.isRunning { usleep(20_000) }
        if process.isRunning { kill(pid, SIGKILL) }
    }

    deinit { stop() }

    static func launch(_ executable: String, _ args: [String], logTo log: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        FileManager.default.createFile(atPath: log, contents: nil)
        let handle = FileHandle(forWritingAtPath: log)
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        return p
    }
}

/// herald-mock-apns on an ephemeral port, with the agreed CLI.
func startMock(_ pki: PKI, _ extra: [String] = [], authKeys: Bool = true) throws -> ServerProcess {
    let binary = binDirectory() + "/herald-mock-apns"
    guard FileManager.default.isExecutableFile(atPath: binary) else {
        throw TestFailure.failed("\(binary) is missing: swift build --product herald-mock-apns")
    }
    let portFile = pki.dir + "/port-\(UUID().uuidString)"
    var args = ["--port", "0", "--port-file", portFile, "--cert", pki.serverCert, "--key", pki.serverKey,
                "--topic", "com.example.chat"]
    if authKeys { args += ["--auth-key", "\(pki.keyID):\(pki.teamID):\(pki.authPublic)"] }
    let p = try ServerProcess.launch(binary, args + extra, logTo: portFile + ".log")
    for _ in 0..<300 {
        if let text = try? String(contentsOfFile: portFile, encoding: .utf8),
           let port = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
            return ServerProcess(process: p, port: port)
        }
        if !p.isRunning { break }
        usleep(20_000)
    }
    kill(p.processIdentifier, SIGKILL)
    let log = (try? String(contentsOfFile: portFile + ".log", encoding: .utf8)) ?? ""
    throw TestFailure.failed("herald-mock-apns did not start: \(log)")
}

/// nghttpd serving `3/device/<token>` files (POSTs to them answer 200).
func startNghttpd(_ pki: PKI, tokens: [String]) throws -> ServerProcess {
    let www = pki.dir + "/www-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: www + "/3/device", withIntermediateDirectories: true)
    for t in tokens { FileManager.default.createFile(atPath: www + "/3/device/" + t, contents: Data("ok".utf8)) }
    for _ in 0..<5 {
        let port = freePort()
        let p = try ServerProcess.launch("/usr/sbin/nghttpd", ["-d", www, "--address=127.0.0.1",
            "--max-concurrent-streams=1000", String(port), pki.serverKey, pki.serverCert], logTo: www + ".log")
        for _ in 0..<100 {
            if canConnect(port) { return ServerProcess(process: p, port: port) }
            if !p.isRunning { break }
            usleep(20_000)
        }
        kill(p.processIdentifier, SIGKILL)
    }
    throw TestFailure.failed("nghttpd did not start")
}

func freePort() -> Int {
    let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(s) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, len) } }
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &len) } }
    return Int(UInt16(bigEndian: addr.sin_port))
}

func canConnect(_ port: Int) -> Bool {
    let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(s) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = UInt16(port).bigEndian
    return withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    } == 0
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

func request(_ i: Int, timeout: Duration = .seconds(20), apnsID: String? = nil, collapseID: String? = nil) -> APNsDelivery {
    APNsDelivery(deviceToken: deviceToken(i), topic: "com.example.chat", pushType: .alert, priority: .immediately,
                expiration: 0, collapseID: collapseID, apnsID: apnsID, payload: alertPayload, timeout: timeout,
                tag: UInt64(i))
}

func client(_ pki: PKI, port: Int, credential: APNsClientCredential? = nil, connections: Int = 1,
            retry: APNsBackoffPolicy = APNsBackoffPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(200), maxAttempts: 8),
            pingInterval: Duration = .seconds(60), pingTimeout: Duration = .seconds(10),
            clock: TestClock? = nil, maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 2000) throws -> APNsClient {
    let cred: APNsClientCredential = try credential ?? pki.tokenCredential()
    let now: @Sendable () -> Date
    if let clock { now = { clock.now } } else { now = { Date() } }
    let config = APNsClientConfiguration(
        credential: cred, environment: .sandbox,
        endpoint: APNsEndpoint(host: "127.0.0.1", port: port), trustedCAFile: pki.serverCert,
        connections: connections, maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight, pingInterval: pingInterval, pingTimeout: pingTimeout,
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
    for _ in 0..<100 {
        lines = (try? recordedLines(path)) ?? []
        if lines.count >= n { return lines }
        try await Task.sleep(for: .milliseconds(50))
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
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard ok, listen(fd, 16) == 0 else { throw TestFailure.failed("proxy cannot listen") }
        port = Int(UInt16(bigEndian: addr.sin_port))
        listener = fd
        Thread { [self] in
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 { return }
                let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var up = sockaddr_in()
                up.sin_family = sa_family_t(AF_INET)
                up.sin_addr.s_addr = inet_addr("127.0.0.1")
                up.sin_port = UInt16(upstreamPort).bigEndian
                let rc = withUnsafeMutablePointer(to: &up) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                }
                if rc != 0 { close(client); close(upstream); continue }
                let index = lock.withLock { accepted += 1; return accepted }
                for (from, to) in [(client, upstream), (upstream, client)] {
                    Thread { [self] in self.pump(from: from, to: to, index: index) }.start()
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
        let wasClosed = lock.withLock { let c = closed; closed = true; return c }
        if !wasClosed {
            shutdown(listener, Int32(SHUT_RDWR))
            close(listener)
        }
    }

    deinit { stop() }
}

final class TestCount: @unchecked Sendable {
    // @unchecked Sendable: guarded by `lock`.
    private let lock = NSLock()
    private var n = 0
    @discardableResult func add(_ d: Int) -> Int { lock.withLock { n += d; return n } }
    var value: Int { lock.withLock { n } }
}
