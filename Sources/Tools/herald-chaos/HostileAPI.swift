// Clients that attack the registry API on purpose, for the fault suite's hostile-api scenario: connections that send
// half a request head and stall, and unauthenticated POSTs that announce a 1 MiB body, both from 127.0.0.2, while a
// well-behaved back end on 127.0.0.1 keeps reading preferences and the load flows through the pipeline.
import Foundation
import HeraldBenchSupport

#if canImport(Glibc)
import Glibc
#endif

final class HostileAPIClients: @unchecked Sendable {
    struct Figures {
        /// Stalled connections the server closed (its read timeout), and those opened in all.
        var stalledClosed = 0
        var stalledOpened = 0
        /// Answers to the unauthenticated POSTs, by status (0: no answer).
        var floodAnswers: [Int: Int] = [:]
        /// The well-behaved client's requests: answered 200, otherwise, and the slowest answer.
        var probesOK = 0
        var probesFailed = 0
        var probeMillis: [Int] = []
    }

    let port: Int
    let token: String
    let stalled: Int
    let floodPerSecond: Double
    private let lock = NSLock()
    private var figures = Figures()
    private var stopping = false
    private var running = 0

    init(port: Int, token: String, stalled: Int, floodPerSecond: Double) {
        self.port = port
        self.token = token
        self.stalled = stalled
        self.floodPerSecond = floodPerSecond
    }

    var snapshot: Figures { lock.withLock { figures } }

    func start() {
        for body in [stallLoop, floodLoop, probeLoop] {
            lock.withLock { running += 1 }
            let thread = Thread { [self] in
                body()
                lock.withLock { running -= 1 }
            }
            thread.start()
        }
    }

    /// Stops the clients and waits for their threads to end.
    func stop() async {
        lock.withLock { stopping = true }
        while lock.withLock({ running }) > 0 { try? await Task.sleep(for: .milliseconds(50)) }
    }

    private var stopped: Bool { lock.withLock { stopping } }

    // MARK: The clients

    /// Keeps `stalled` connections open, each having sent half a request head; one the server closes is counted
    /// and replaced.
    private func stallLoop() {
        let half = Array("POST /v1/apps/app1/users/u1/devices HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty".utf8)
        var fds: [Int32] = []
        defer { fds.forEach { _ = close($0) } }
        while !stopped {
            while fds.count < stalled, let fd = connectTo(port, from: "127.0.0.2") {
                _ = half.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                fds.append(fd)
                lock.withLock { figures.stalledOpened += 1 }
            }
            var polls = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            guard poll(&polls, nfds_t(polls.count), 200) > 0 else { continue }
            var buf = [UInt8](repeating: 0, count: 4096)
            for p in polls where p.revents != 0 {
                let n = buf.withUnsafeMutableBytes { recv(p.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if n <= 0 {
                    close(p.fd)
                    fds.removeAll { $0 == p.fd }
                    lock.withLock { figures.stalledClosed += 1 }
                }
            }
        }
    }

    /// Unauthenticated POSTs announcing a 1 MiB body, `floodPerSecond` of them.
    private func floodLoop() {
        let head = Array(
            ("POST /v1/apps/app1/users/u1/devices HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + "Content-Length: 1048576\r\n\r\n").utf8)
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 65536)
        var next = Date()
        while !stopped {
            let wait = next.timeIntervalSinceNow
            if wait > 0 { Thread.sleep(forTimeInterval: wait) }
            next = next.addingTimeInterval(1 / floodPerSecond)
            guard let fd = connectTo(port, from: "127.0.0.2") else {
                lock.withLock { figures.floodAnswers[0, default: 0] += 1 }
                continue
            }
            // The body goes out as far as the socket takes it without waiting: the server is to answer at the
            // head, without reading it.
            var sent = head.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == head.count
            var bodySent = 0
            while sent && bodySent < 1_048_576 {
                let n = chunk.withUnsafeBytes {
                    send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
                }
                if n <= 0 { sent = false } else { bodySent += n }
            }
            let status = Self.readStatus(fd)
            close(fd)
            lock.withLock { figures.floodAnswers[status, default: 0] += 1 }
        }
    }

    /// A well-behaved back end: reads a user's preferences twice a second and times each answer.
    private func probeLoop() {
        let request = Array(
            ("GET /v1/apps/app1/users/u1/preferences HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(token)\r\n"
                + "Connection: close\r\n\r\n").utf8)
        while !stopped {
            let started = DispatchTime.now().uptimeNanoseconds
            var status = 0
            if let fd = connectTo(port, from: "127.0.0.1") {
                if request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count
                {
                    status = Self.readStatus(fd)
                }
                close(fd)
            }
            let millis = Int((DispatchTime.now().uptimeNanoseconds - started) / 1_000_000)
            lock.withLock {
                if status == 200 { figures.probesOK += 1 } else { figures.probesFailed += 1 }
                figures.probeMillis.append(millis)
            }
            Thread.sleep(forTimeInterval: 0.5)
        }
    }

    // MARK: Sockets

    /// A blocking TCP connection to 127.0.0.1:`port` from the loopback address `source`, with 20 s send and
    /// receive timeouts; nil when it cannot be made.
    private func connectTo(_ port: Int, from source: String) -> Int32? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var tv = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        let len = socklen_t(MemoryLayout<sockaddr_in>.size)
        var local = sockaddr_in()
        local.sin_family = sa_family_t(AF_INET)
        local.sin_addr.s_addr = inet_addr(source)
        var remote = sockaddr_in()
        remote.sin_family = sa_family_t(AF_INET)
        remote.sin_addr.s_addr = inet_addr("127.0.0.1")
        remote.sin_port = UInt16(port).bigEndian
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) }
        }
        let connected =
            bound == 0
            && withUnsafePointer(to: &remote) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, len) }
            } == 0
        guard connected else {
            close(fd)
            return nil
        }
        return fd
    }

    /// The status code of the answer on `fd` (0 when none arrives).
    private static func readStatus(_ fd: Int32) -> Int {
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 1024)
        while out.count < 12 {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            out.append(contentsOf: buf[0..<n])
        }
        guard out.count >= 12, out.starts(with: Array("HTTP/1.".utf8)) else { return 0 }
        return Int(String(decoding: out[9..<12], as: UTF8.self)) ?? 0
    }
}
