// A TCP relay for tests that need to see or cut the traffic between a client and a server.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The relay could not listen on loopback.
public enum ProxyError: Error { case cannotListen }

/// A TCP relay on loopback in front of a server, counting the connections it accepted. `freeze()` makes the
/// connections open at that moment silently swallow everything in both directions (a peer that stopped answering,
/// as behind a dead NAT entry); connections opened later relay normally.
public final class FreezingProxy: @unchecked Sendable {
    // @unchecked Sendable: `frozenBefore` and `accepted` are guarded by `lock`; sockets are
    // owned by the threads that pump them.
    public let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var accepted = 0
    private var frozenBefore = 0
    private var closed = false

    public init(upstreamPort: Int) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = loopback(port: 0)
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0
            }
        }
        guard ok, listen(fd, 16) == 0 else { throw ProxyError.cannotListen }
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
                var up = loopback(port: upstreamPort)
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
    public func freeze() { lock.withLock { frozenBefore = accepted } }

    public var connectionsAccepted: Int { lock.withLock { accepted } }

    public func stop() {
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
