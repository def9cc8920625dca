import Foundation
import HeraldTestSupport
import Synchronization
import Testing

@testable import HeraldRedis

#if canImport(Glibc)
import Glibc
#endif

/// A TCP listener on `host`, port chosen by the kernel: its descriptor and port.
private func loopbackListener(_ host: String) -> (fd: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr(host)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
    }
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    listen(fd, 16)
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}

/// A one-node "cluster" on loopback that owns every slot and answers every other command with a redirection to
/// `target`: what a compromised or misconfigured node could send.
private final class RedirectingNode: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let redirection: String

    init(redirectTo target: String, ask: Bool = false) throws {
        (listener, port) = loopbackListener("127.0.0.1")
        redirection = "-\(ask ? "ASK" : "MOVED") 866 \(target)\r\n"
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 { return }
            Thread { [self] in serve(client) }.start()
        }
    }

    /// Answers each command of whatever arrives: the slot map for CLUSTER SLOTS, +PONG for PING, the redirection
    /// for anything else.
    private func serve(_ client: Int32) {
        defer { close(client) }
        var pending = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return }
            pending += buffer.prefix(n)
            while let (command, used) = Self.parseCommand(pending) {
                pending.removeFirst(used)
                let name = command.joined(separator: " ").uppercased()
                let answer: String
                if name.hasPrefix("CLUSTER SLOTS") {
                    answer = "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:\(port)\r\n"
                } else if name.hasPrefix("PING") || name.hasPrefix("ASKING") {
                    answer = name.hasPrefix("PING") ? "+PONG\r\n" : "+OK\r\n"
                } else {
                    answer = redirection
                }
                _ = Array(answer.utf8).withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
        }
    }

    /// One RESP command (an array of bulk strings) from the front of `bytes`, and how many bytes it took.
    static func parseCommand(_ bytes: [UInt8]) -> ([String], Int)? {
        func line(from start: Int) -> (String, Int)? {
            var i = start
            while i + 1 < bytes.count {
                if bytes[i] == 13 && bytes[i + 1] == 10 {
                    return (String(decoding: bytes[start..<i], as: UTF8.self), i + 2)
                }
                i += 1
            }
            return nil
        }
        guard let (header, afterHeader) = line(from: 0), header.hasPrefix("*"), let count = Int(header.dropFirst())
        else { return nil }
        var position = afterHeader
        var parts: [String] = []
        for _ in 0..<count {
            guard let (size, afterSize) = line(from: position), size.hasPrefix("$"), let length = Int(size.dropFirst()),
                afterSize + length + 2 <= bytes.count
            else { return nil }
            parts.append(String(decoding: bytes[afterSize..<(afterSize + length)], as: UTF8.self))
            position = afterSize + length + 2
        }
        return (parts, position)
    }
}

/// A listener that only counts the connections made to it (nothing may connect).
private final class CountingListener: @unchecked Sendable {
    let port: Int
    let accepted = Atomic<Int>(0)
    private let listener: Int32

    init(host: String) {
        (listener, port) = loopbackListener(host)
        let thread = Thread { [self] in
            while true {
                let client = accept(listener, nil, nil)
                if client < 0 { return }
                accepted.add(1, ordering: .relaxed)
                close(client)
            }
        }
        thread.start()
    }
}

@Suite("Redis Cluster redirections go only to the cluster's own nodes")
struct RedisClusterRedirectionTests {
    @Test(
        "MOVED or ASK to an address outside the slot map is an error, and no connection is made to it",
        arguments: [false, true])
    func redirectionOutsideTheCluster(ask: Bool) async throws {
        let stranger = CountingListener(host: "127.0.0.2")
        let node = try RedirectingNode(redirectTo: "127.0.0.2:\(stranger.port)", ask: ask)
        var configuration = try RedisConfiguration(url: "redis+cluster://127.0.0.1:\(node.port)")
        configuration.connectTimeout = .seconds(2)
        configuration.commandTimeout = .seconds(5)
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        await #expect {
            _ = try await redis.send("GET", "user:{u1}:devices")
        } throws: { error in
            "\(error)".contains("not a node of the cluster")
        }
        #expect(stranger.accepted.load(ordering: .relaxed) == 0, "the client connected where the reply pointed")
    }
}
