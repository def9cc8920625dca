// A TCP relay on loopback that delays what it passes on: a network hop between a client and a server on the same
// host (herald-bench redis-callers, herald-bench pipeline --redis-rtt-ms).
import Foundation
import Glibc
import Synchronization

/// A TCP relay on loopback that holds every chunk for `oneWay` before passing it on, in both directions: a
/// network hop of twice that round trip between a client and a server on the same host.
package final class DelayRelay: @unchecked Sendable {
    package let port: Int
    private let listener: Int32
    private let target: Int
    private let oneWay: Duration
    private let stopped = Atomic<Bool>(false)

    package init(to target: Int, oneWay: Duration) throws {
        self.target = target
        self.oneWay = oneWay
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.loopback(0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 64) == 0 else { throw BenchError("relay: bind/listen failed") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        listener = fd
        let thread = Thread { [self] in self.acceptLoop() }
        thread.start()
    }

    package func stop() {
        stopped.store(true, ordering: .relaxed)
        shutdown(listener, Int32(SHUT_RDWR))
    }

    private static func loopback(_ port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return address
    }

    private func acceptLoop() {
        while !stopped.load(ordering: .relaxed) {
            let client = accept(listener, nil, nil)
            if client < 0 { break }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = Self.loopback(target)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard connected == 0 else {
                close(client)
                close(server)
                continue
            }
            var yes: Int32 = 1
            for fd in [client, server] {
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &yes, socklen_t(MemoryLayout<Int32>.size))
            }
            let up = DelayedPipe(from: client, to: server, delay: oneWay)
            let down = DelayedPipe(from: server, to: client, delay: oneWay)
            up.start()
            down.start()
        }
        close(listener)
    }
}

/// One direction of the relay: a reader thread stamps each chunk, a writer thread sends it once it is due.
private final class DelayedPipe: @unchecked Sendable {
    private let from: Int32
    private let to: Int32
    private let delay: Duration
    private let condition = NSCondition()
    private var chunks: [(due: ContinuousClock.Instant, bytes: [UInt8])] = []
    private var ended = false

    init(from: Int32, to: Int32, delay: Duration) {
        self.from = from
        self.to = to
        self.delay = delay
    }

    func start() {
        Thread { [self] in self.read() }.start()
        Thread { [self] in self.write() }.start()
    }

    private func read() {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = Glibc.read(from, &buffer, buffer.count)
            condition.lock()
            if n <= 0 {
                ended = true
            } else {
                chunks.append((ContinuousClock.now + delay, Array(buffer[0..<n])))
            }
            condition.signal()
            condition.unlock()
            if n <= 0 { return }
        }
    }

    private func write() {
        while true {
            condition.lock()
            while chunks.isEmpty && !ended { condition.wait() }
            if chunks.isEmpty {
                condition.unlock()
                shutdown(to, Int32(SHUT_WR))
                return
            }
            let chunk = chunks.removeFirst()
            condition.unlock()
            let wait = chunk.due - .now
            if wait > .zero { Thread.sleep(forTimeInterval: wait.timeInterval) }
            var sent = 0
            while sent < chunk.bytes.count {
                let n = chunk.bytes[sent...].withUnsafeBytes { Glibc.write(to, $0.baseAddress, $0.count) }
                if n <= 0 { return }
                sent += n
            }
        }
    }
}
