// Loopback ports for test servers.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A failure of the test harness itself (a server that did not start, a tool that failed).
public struct TestSupportError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A TCP port on 127.0.0.1 that nothing is bound to now and that this process has not handed out before.
///
/// Ports come from below Linux's ephemeral range (32768-60999), so neither an outgoing connection nor another
/// server binding port 0 can take one between this call and the caller binding it. Each port is handed out once per
/// process (tests run in parallel in one process), starting at a random point so that two test processes seldom
/// walk the same ports. Another program may still take a port first; callers that start a server retry with a new
/// port when that happens.
public func freePort() throws -> Int {
    try PortAllocator.shared.next()
}

final class PortAllocator: @unchecked Sendable {
    static let shared = PortAllocator()

    private static let range = 15_000..<32_000
    private let lock = NSLock()
    private var cursor = Int.random(in: PortAllocator.range)

    func next() throws -> Int {
        lock.lock()
        defer { lock.unlock() }
        for _ in 0..<PortAllocator.range.count {
            let port = cursor
            cursor = cursor + 1 == PortAllocator.range.upperBound ? PortAllocator.range.lowerBound : cursor + 1
            if try isUnbound(port) { return port }
        }
        throw TestSupportError("no unbound port left in \(PortAllocator.range)")
    }

    private func isUnbound(_ port: Int) throws -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError("socket() failed: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var address = loopback(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:port.
public func portAcceptsConnections(_ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = loopback(port: port)
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
        }
    }
}

func loopback(port: Int) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return address
}
