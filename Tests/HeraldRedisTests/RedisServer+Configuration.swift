import Foundation
import HeraldRedis

#if canImport(Glibc)
import Glibc
#endif

/// A real `redis-server` on a free loopback port, started for one test and stopped after it.
final class RedisServerProcess: @unchecked Sendable {
    // @unchecked Sendable: `process` is replaced only by `kill()`/`restart()`, which the owning test calls
    // sequentially; nothing else touches it.
    let port: Int
    private var process: Process?

    init() throws {
        self.port = try Self.freePort()
        try start()
    }

    deinit {
        kill()
    }

    var configuration: RedisConfiguration {
        RedisConfiguration(host: "127.0.0.1", port: port, connectTimeout: .seconds(1), commandTimeout: .seconds(5),
                           initialBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
    }

    func start(extraArguments: [String] = []) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.redisServerPath)
        process.arguments = ["--port", "\(port)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--daemonize", "no", "--loglevel", "warning"] + extraArguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        try waitUntilAccepting()
    }

    /// SIGKILL, as a crash would.
    func kill() {
        guard let process else { return }
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        self.process = nil
    }

    private func waitUntilAccepting() throws {
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if Self.canConnect(port: port) { return }
            usleep(20_000)
        }
        throw RedisError(.connectFailed, "redis-server did not start on port \(port)")
    }

    static var redisServerPath: String {
        for path in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] where FileManager.default.isExecutableFile(atPath: path) {
            return path
        }
        return "/usr/bin/redis-server"
    }

    static func canConnect(port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// Binds port 0 on loopback, reads the port the kernel chose, closes the socket.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw RedisError(.connectFailed, "socket() failed") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0 else { throw RedisError(.connectFailed, "bind() failed") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                getsockname(fd, $0, &length)
            }
        }
        guard named == 0 else { throw RedisError(.connectFailed, "getsockname() failed") }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
