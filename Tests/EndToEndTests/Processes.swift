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

/// Every child pid still running, so nothing outlives the test process: an `atexit` hook kills them on a normal
/// exit, and a watchdog shell (started with the first child) kills the pids listed in a file when the test
/// process dies any other way (a crash in any test of the bundle).
enum ChildRegistry {
    static let pids = Guarded<Set<Int32>>([])
    private static let installed = Guarded(false)
    static let pidFile = NSTemporaryDirectory() + "herald-e2e-children-\(getpid())"

    static func add(_ pid: Int32) {
        installHooks()
        pids.withLock {
            _ = $0.insert(pid)
            write($0)
        }
    }

    static func remove(_ pid: Int32) {
        pids.withLock {
            _ = $0.remove(pid)
            write($0)
        }
    }

    private static func write(_ set: Set<Int32>) {
        let text = set.map { String($0) }.joined(separator: " ")
        try? text.write(toFile: pidFile, atomically: true, encoding: .utf8)
    }

    private static func installHooks() {
        let first = installed.withLock { done -> Bool in
            defer { done = true }
            return !done
        }
        guard first else { return }
        atexit {
            let left = ChildRegistry.pids.withLock { set -> Set<Int32> in
                let copy = set
                set.removeAll()
                try? "".write(toFile: ChildRegistry.pidFile, atomically: true, encoding: .utf8)
                return copy
            }
            for pid in left { kill(pid, SIGKILL) }
        }
        // The watchdog: polls the test process; once it is gone, SIGKILLs what the file lists, then removes it.
        let script = """
        while kill -0 \(getpid()) 2>/dev/null && ! grep -q '^State:.*Z' /proc/\(getpid())/status 2>/dev/null; do sleep 1; done
        if [ -s '\(pidFile)' ]; then kill -9 $(cat '\(pidFile)') 2>/dev/null; fi
        rm -f '\(pidFile)'
        """
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Its own process group: a Ctrl-C on the test run does not stop it before it did its job.
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))
        // No inherited stdout/stderr: `swift test` waits for its pipes to close before it reaps the test process.
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd: Int32 in [0, 1, 2] {
            posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0)
        }
        let words: [String] = ["/bin/sh", "-c", script]
        let argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        _ = posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, environ)
    }
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One child process (a server or a stage), started with `posix_spawn` so that it gets an empty signal mask
/// and default signal dispositions: the test process's threads block SIGTERM, and `Foundation.Process` would
/// pass that mask on (redis-server and Tansu would then ignore SIGTERM).
final class ChildProcess: @unchecked Sendable {
    // Safe: `pid` and `exitStatus` are behind `state`'s lock.
    let name: String
    let executable: String
    let arguments: [String]
    let environment: [String: String]
    let logPath: String
    private let state = Guarded<(pid: pid_t?, exitStatus: Int32?)>((nil, nil))

    init(name: String, executable: String, arguments: [String], environment: [String: String] = [:], logPath: String) {
        self.name = name
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        self.logPath = logPath
    }

    var pid: Int32? { state.withLock { $0.pid } }

    /// Whether the child is still running (reaps it when it has exited).
    var isRunning: Bool {
        state.withLock { s in
            guard let pid = s.pid else { return false }
            var status: Int32 = 0
            let r = waitpid(pid, &status, WNOHANG)
            if r == 0 { return true }
            if r == pid {
                // WIFEXITED / WEXITSTATUS (macros are not imported).
                s.exitStatus = (status & 0x7f) == 0 ? (status >> 8) & 0xff : nil
            }
            s.pid = nil
            return false
        }
    }

    /// Exit status of the last run when it exited normally (nil while running or when killed by a signal).
    var exitStatus: Int32? { state.withLock { $0.exitStatus } }

    func start() throws {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw HarnessError("\(name): no executable at \(executable)")
        }
        if let header = "---- start \(Date()) ----\n".data(using: .utf8) {
            if let h = FileHandle(forWritingAtPath: logPath) {
                h.seekToEndOfFile()
                h.write(header)
                h.closeFile()
            } else {
                _ = FileManager.default.createFile(atPath: logPath, contents: header)
            }
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, logPath, O_WRONLY | O_APPEND | O_CREAT, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for sig in [SIGTERM, SIGINT, SIGPIPE, SIGHUP] { sigaddset(&defaults, sig) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?] = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for p in argv { free(p) }
            for p in envp { free(p) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard rc == 0 else { throw HarnessError("\(name): posix_spawn failed: \(String(cString: strerror(rc)))") }
        state.withLock { $0 = (pid, nil) }
        ChildRegistry.add(pid)
    }

    /// SIGKILL, and wait until it is gone.
    func kill9() async {
        guard let pid, isRunning else { return }
        kill(pid, SIGKILL)
        await waitExit(timeout: .seconds(5))
        ChildRegistry.remove(pid)
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns the exit status (nil when it had to be killed).
    @discardableResult
    func stop(grace: Duration = .seconds(10)) async -> Int32? {
        guard let pid else { return exitStatus }
        defer { ChildRegistry.remove(pid) }
        guard isRunning else { return exitStatus }
        kill(pid, SIGTERM)
        if await waitExit(timeout: grace) { return exitStatus }
        kill(pid, SIGKILL)
        await waitExit(timeout: .seconds(5))
        return nil
    }

    @discardableResult
    private func waitExit(timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while isRunning {
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
