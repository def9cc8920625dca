// Commands and helper processes of the tests, started with posix_spawn instead of Foundation's `Process`.
//
// Foundation's `Process.run()` on Linux lists /proc/self/fd to close inherited descriptors and copies each
// directory entry's whole 256-byte name field, reading past the end of glibc's buffer when an entry sits at its end:
// a test bundle with many descriptors open (every test's sockets) crashed that way now and then ("Bad pointer
// dereference" in `Process.run()`). It also changes the whole process's working directory for
// `currentDirectoryURL`, under every other thread's feet. posix_spawn with `addclosefrom_np` and `addchdir_np` does
// neither.
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A child process with pipes to its standard streams, as asked for.
public final class SpawnedProcess: Sendable {
    /// Where a standard output stream goes.
    public enum Output: Sendable {
        /// A pipe this object reads (`readToEnd`, `readLine`).
        case pipe
        /// Appended to a file.
        case file(String)
        /// /dev/null.
        case discard
        /// (standard error only) wherever standard output goes.
        case toStandardOutput
    }

    public let pid: pid_t
    /// The write end of its standard input (a pipe when asked for, else nil: /dev/null).
    private let input: Mutex<Int32?>
    private let outputFD: Int32?
    private let errorFD: Int32?
    private let status = Mutex<Int32?>(nil)

    /// Starts `executable` (a path; a bare name is looked up on PATH through /usr/bin/env) with `arguments`.
    /// `environment` entries are added to (and override) the test process's own, or with `inheritEnvironment`
    /// false are the whole environment.
    public init(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:],
        inheritEnvironment: Bool = true, cwd: String? = nil,
        stdin: Bool = false, stdout: Output = .pipe, stderr: Output = .toStandardOutput
    ) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var parentEnds: [Int32] = []  // closed on failure
        var childEnds: [Int32] = []  // closed in the parent after the spawn

        func pipePair() throws -> (read: Int32, write: Int32) {
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else { throw TestSupportError("pipe: \(String(cString: strerror(errno)))") }
            // (Children spawned meanwhile by other tests close everything above 2 anyway: `closeInheritedDescriptors`.)
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
            return (fds[0], fds[1])
        }

        var inputEnd: Int32?
        if stdin {
            let p = try pipePair()
            posix_spawn_file_actions_adddup2(&actions, p.read, 0)
            childEnds.append(p.read)
            parentEnds.append(p.write)
            inputEnd = p.write
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        func route(_ output: Output, to fd: Int32) throws -> Int32? {
            switch output {
            case .pipe:
                let p = try pipePair()
                posix_spawn_file_actions_adddup2(&actions, p.write, fd)
                childEnds.append(p.write)
                parentEnds.append(p.read)
                return p.read
            case .file(let path):
                posix_spawn_file_actions_addopen(&actions, fd, path, O_WRONLY | O_APPEND | O_CREAT, 0o644)
            case .discard:
                posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_WRONLY, 0)
            case .toStandardOutput:
                posix_spawn_file_actions_adddup2(&actions, 1, fd)
            }
            return nil
        }
        let outputEnd = try route(stdout, to: 1)
        let errorEnd = try route(stderr, to: 2)
        closeInheritedDescriptors(&actions)
        if let cwd { changeDirectory(&actions, cwd) }

        let path = executable.hasPrefix("/") ? executable : "/usr/bin/env"
        let words = executable.hasPrefix("/") ? [executable] + arguments : ["env", executable] + arguments
        var env = inheritEnvironment ? ProcessInfo.processInfo.environment : [:]
        for (k, v) in environment { env[k] = v }
        var pid: pid_t = 0
        let rc = spawnChild(&pid, path, words, environment: env, actions: &actions)
        for fd in childEnds { close(fd) }
        guard rc == 0 else {
            for fd in parentEnds { close(fd) }
            throw TestSupportError("\(executable): posix_spawn failed: \(String(cString: strerror(rc)))")
        }
        self.pid = pid
        self.input = Mutex(inputEnd)
        self.outputFD = outputEnd
        self.errorFD = errorEnd
        ChildRegistry.add(pid)
    }

    deinit {
        if let fd = input.withLock({ $0 }) { close(fd) }
        if let outputFD { close(outputFD) }
        if let errorFD { close(errorFD) }
    }

    /// Writes `text` to its standard input and closes it.
    public func writeInputAndClose(_ text: String) {
        input.withLock { fd in
            guard let end = fd else { return }
            let bytes = Array(text.utf8)
            var sent = 0
            while sent < bytes.count {
                let n = bytes[sent...].withUnsafeBytes { write(end, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                sent += n
            }
            close(end)
            fd = nil
        }
    }

    /// Everything it writes to its piped standard output and error, until both are closed (blocks; both pipes are
    /// read at once, so neither can fill up and stall the child).
    public func readToEnd() -> (stdout: [UInt8], stderr: [UInt8]) {
        var out: [UInt8] = []
        var err: [UInt8] = []
        var open: [(fd: Int32, isError: Bool)] = []
        if let outputFD { open.append((outputFD, false)) }
        if let errorFD { open.append((errorFD, true)) }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !open.isEmpty {
            var fds = open.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            if poll(&fds, nfds_t(fds.count), -1) < 0 {
                if errno == EINTR { continue }
                break
            }
            var closed: Set<Int32> = []
            for (i, p) in fds.enumerated() where p.revents != 0 {
                let n = buffer.withUnsafeMutableBytes { read(p.fd, $0.baseAddress, $0.count) }
                if n > 0 {
                    if open[i].isError { err += buffer[0..<n] } else { out += buffer[0..<n] }
                } else if n == 0 || errno != EINTR {
                    closed.insert(p.fd)
                }
            }
            open.removeAll { closed.contains($0.fd) }
        }
        return (out, err)
    }

    /// One line of its piped standard output (without the newline); nil at end of file. Reads a byte at a time,
    /// so what follows the line stays in the pipe.
    public func readLine() -> String? {
        guard let outputFD else { return nil }
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while true {
            let n = read(outputFD, &byte, 1)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return line.isEmpty ? nil : String(decoding: line, as: UTF8.self) }
            if byte == 0x0A { return String(decoding: line, as: UTF8.self) }
            line.append(byte)
        }
    }

    /// Waits for it to end; its exit status (128 + the signal when a signal ended it).
    @discardableResult
    public func waitForExit() -> Int32 {
        if let known = status.withLock({ $0 }) { return known }
        var raw: Int32 = 0
        var r: pid_t
        repeat { r = waitpid(pid, &raw, 0) } while r < 0 && errno == EINTR
        // WIFEXITED / WEXITSTATUS / WTERMSIG (macros are not imported).
        let code = (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
        let result = status.withLock { s -> Int32 in
            if s == nil { s = r == pid ? code : -1 }
            return s!
        }
        ChildRegistry.remove(pid)
        return result
    }

    /// Whether it still runs (reaps it when it ended).
    public var isRunning: Bool {
        if status.withLock({ $0 }) != nil { return false }
        var raw: Int32 = 0
        let r = waitpid(pid, &raw, WNOHANG)
        if r == 0 { return true }
        let code = (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
        status.withLock { if $0 == nil { $0 = r == pid ? code : -1 } }
        ChildRegistry.remove(pid)
        return false
    }

    /// Sends `signal` (SIGTERM by default) if it still runs.
    public func signal(_ signal: Int32 = SIGTERM) {
        if isRunning { kill(pid, signal) }
    }
}

/// Starts `path` with `words` as its argv (the first its own name), exactly `environment` as its environment and
/// `actions` applied, with an empty signal mask and default dispositions for SIGTERM, SIGINT, SIGPIPE and SIGHUP:
/// the test process's threads block SIGTERM, and a child that inherited that mask (redis-server, Tansu) would
/// ignore it. Sets `pid` and returns `posix_spawn`'s result (0, or an error number).
func spawnChild(
    _ pid: inout pid_t, _ path: String, _ words: [String], environment: [String: String],
    actions: inout posix_spawn_file_actions_t
) -> Int32 {
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
    let argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
    let envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer {
        for p in argv { free(p) }
        for p in envp { free(p) }
    }
    return posix_spawn(&pid, path, &actions, &attributes, argv, envp)
}

/// Sets the child's working directory (`posix_spawn_file_actions_addchdir_np`, glibc 2.29), without touching the
/// test process's own.
func changeDirectory(_ actions: inout posix_spawn_file_actions_t, _ directory: String) {
    typealias AddChdir =
        @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) ->
        Int32
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addchdir_np") else {
        return
    }
    _ = directory.withCString { unsafeBitCast(symbol, to: AddChdir.self)(&actions, $0) }
}
