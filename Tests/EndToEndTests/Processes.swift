// Child processes of the end-to-end suite: started with their own log file, stopped (SIGTERM, then SIGKILL)
// at the end even when a test failed, and killed at process exit if anything is still running.
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A value behind a lock. `@unchecked Sendable`: every access goes through `withLock`.
final class Guarded<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// Every child pid still running, so an `atexit` hook can kill what a crashed or aborted run left behind.
enum ChildRegistry {
    static let pids = Guarded<Set<Int32>>([])
    private static let installed = Guarded(false)

    static func add(_ pid: Int32) {
        installHook()
        pids.withLock { _ = $0.insert(pid) }
    }

    static func remove(_ pid: Int32) { pids.withLock { _ = $0.remove(pid) } }

    private static func installHook() {
        let first = installed.withLock { done -> Bool in
            defer { done = true }
            return !done
        }
        guard first else { return }
        atexit {
            for pid in ChildRegistry.pids.withLock({ $0 }) { kill(pid, SIGKILL) }
        }
    }
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One child process (a server or a stage).
final class ChildProcess: @unchecked Sendable {
    // Safe: `process` is replaced only by `start()`, which the (serialized) harness calls; reads of a
    // `Process` are thread-safe in Foundation.
    let name: String
    let executable: String
    let arguments: [String]
    let environment: [String: String]
    let logPath: String
    private var process: Process?

    init(name: String, executable: String, arguments: [String], environment: [String: String] = [:], logPath: String) {
        self.name = name
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        self.logPath = logPath
    }

    var pid: Int32? { process.map(\.processIdentifier) }
    var isRunning: Bool { process?.isRunning ?? false }

    func start() throws {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw HarnessError("\(name): no executable at \(executable)")
        }
        if !FileManager.default.fileExists(atPath: logPath) {
            _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        }
        guard let log = FileHandle(forWritingAtPath: logPath) else { throw HarnessError("\(name): cannot open \(logPath)") }
        log.seekToEndOfFile()
        log.write(Data("---- start \(Date()) ----\n".utf8))
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        p.environment = env
        p.standardOutput = log
        p.standardError = log
        p.standardInput = FileHandle.nullDevice
        try p.run()
        process = p
        ChildRegistry.add(p.processIdentifier)
    }

    /// SIGKILL, and wait until it is gone.
    func kill9() async {
        guard let p = process, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        await waitExit(p, timeout: .seconds(5))
        ChildRegistry.remove(p.processIdentifier)
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns the exit status (nil when it had to be killed).
    @discardableResult
    func stop(grace: Duration = .seconds(10)) async -> Int32? {
        guard let p = process else { return nil }
        defer { ChildRegistry.remove(p.processIdentifier) }
        guard p.isRunning else { return p.terminationStatus }
        kill(p.processIdentifier, SIGTERM)
        if await waitExit(p, timeout: grace) { return p.terminationStatus }
        kill(p.processIdentifier, SIGKILL)
        await waitExit(p, timeout: .seconds(5))
        return nil
    }

    @discardableResult
    private func waitExit(_ p: Process, timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while p.isRunning {
            if ContinuousClock.now >= deadline { return false }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return true
    }

    /// The last lines of the log, for failure messages.
    func logTail(_ lines: Int = 15) -> String {
        guard let text = try? String(contentsOfFile: logPath, encoding: .utf8) else { return "(no log)" }
        return text.split(separator: "\n").suffix(lines).joined(separator: "\n")
    }
}

/// Runs a command to completion (openssl, tansu topic create) and returns its output; throws on failure.
@discardableResult
func runTool(_ executable: String, _ arguments: [String], cwd: String? = nil) throws -> String {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    if let cwd { p.currentDirectoryURL = URL(fileURLWithPath: cwd) }
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = pipe
    try p.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    let out = String(decoding: data, as: UTF8.self)
    guard p.terminationStatus == 0 else {
        throw HarnessError("\(executable) \(arguments.joined(separator: " ")) exited \(p.terminationStatus): \(out)")
    }
    return out
}

/// A free TCP port on loopback (bound then released; the small race is acceptable for tests).
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError("socket() failed") }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = 0
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let bound = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0 else { throw HarnessError("bind() failed") }
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
    }
    return Int(UInt16(bigEndian: addr.sin_port))
}

/// Whether something accepts TCP connections on 127.0.0.1:port.
func portOpen(_ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = in_port_t(UInt16(port).bigEndian)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let rc = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    return rc == 0
}

/// GET http://127.0.0.1:port/path over a plain socket; returns the status code (nil when unreachable).
func httpStatus(port: Int, path: String) -> Int? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var tv = timeval(tv_sec: 2, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = in_port_t(UInt16(port).bigEndian)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let rc = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard rc == 0 else { return nil }
    let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8)
    _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var buffer = [UInt8](repeating: 0, count: 256)
    let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
    guard n > 12 else { return nil }
    let head = String(decoding: buffer[0..<n], as: UTF8.self)
    let parts = head.split(separator: " ")
    guard parts.count > 1 else { return nil }
    return Int(parts[1])
}

/// Polls `condition` every `interval` until it is true or `timeout` passed; returns whether it became true.
func eventually(timeout: Duration, interval: Duration = .milliseconds(100),
                _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while true {
        if try await condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        try? await Task.sleep(for: interval)
    }
}
