// The hostile-api scenario, and the clients that attack the registry API on purpose for it: connections that send
// half a request head and stall, and unauthenticated POSTs that announce a 1 MiB body, both from 127.0.0.2, while a
// well-behaved back end on 127.0.0.1 keeps reading preferences and the load flows through the pipeline.
import Foundation
import HeraldBenchSupport
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

extension ChaosRunner {
    /// Under load, stalled connections and unauthenticated 1 MiB POSTs (from 127.0.0.2) attack the registry API
    /// while a well-behaved client (from 127.0.0.1) reads preferences. Nothing may be lost; the attackers are
    /// disconnected (read timeout) or refused at the head (401, or 429 once over the failed-authentication budget);
    /// every well-behaved request is answered 200; herald-registry grows by less than 64 MB; and the notifications'
    /// latency while attacked stays within twice that of the seconds before, plus 250 ms.
    func hostileAPI() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        guard let port = session.info.apiPort, let token = session.info.apiToken else {
            throw BenchError("the stack does not run the registry API (no API_PORT in stack.env)")
        }
        let rate = reduced ? 100.0 : 300.0
        let calm = 6.0
        // Longer than the read timeout (HERALD_HTTP_READ_TIMEOUT_MS, 10 s), so stalled clients are disconnected.
        let attacked = reduced ? 16.0 : 40.0
        let clients = HostileAPIClients(
            port: port, token: token, stalled: reduced ? 300 : 900, floodPerSecond: reduced ? 20 : 40)
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        let memory = startFault(at: calm, watching: "registry", driver: driver, session: session) {
            clients.start()
            faults.add(.init(stage: "registry", action: "attack", at: nowMillis(), status: nil))
        }
        let r = try await driver.run(
            mode: .rate(rate, calm + attacked), mixed: nil, drainTimeout: drainTimeout)
        await clients.stop()
        let f = clients.snapshot
        var problems = faults.allNotes
        if f.stalledClosed == 0 { problems.append("no stalled connection was closed by the server") }
        let refused = (f.floodAnswers[401] ?? 0) + (f.floodAnswers[429] ?? 0)
        let floods = f.floodAnswers.values.reduce(0, +)
        if floods == 0 || refused != floods {
            let seen = f.floodAnswers.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }
            problems.append("unauthenticated POSTs answered \(seen.joined(separator: ", ")) (all must be 401 or 429)")
        }
        if f.probesFailed > 0 || f.probesOK == 0 {
            problems.append("well-behaved requests: \(f.probesOK) answered 200, \(f.probesFailed) not")
        }
        let growthMB = memory.growthMB
        if growthMB >= 64 { problems.append(String(format: "herald-registry grew by %.0f MB", growthMB)) }
        // The notifications' per-second p99 before the attack and while it lasted (by creation time).
        func medianP99(_ range: Range<Double>) -> UInt64 {
            let p = r.series.filter { range.contains(Double($0.second)) && $0.count > 0 }.map(\.p99).sorted()
            return p.isEmpty ? 0 : p[p.count / 2]
        }
        let before = medianP99(2..<calm)
        let during = medianP99((calm + 1)..<(calm + attacked))
        if during > before * 2 + 250 {
            problems.append("latency p99 rose from \(before) ms to \(during) ms under attack")
        }
        let probes = f.probeMillis.sorted()
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        return outcome(
            r, extraProblems: problems,
            detail: String(
                format:
                    "%d stalled connections opened, %d closed by the server; %d unauthenticated 1 MiB POSTs refused; "
                    + "%d well-behaved requests answered (slowest %d ms); registry RSS +%.0f MB; "
                    + "notification p99 %d ms before, %d ms under attack",
                f.stalledOpened, f.stalledClosed, refused, f.probesOK, probes.last ?? 0, growthMB, before, during))
    }
}

final class HostileAPIClients: Sendable {
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
    /// What the client threads count, and whether they are to stop.
    private struct State {
        var figures = Figures()
        var stopping = false
        var running = 0
    }

    private let state = Mutex(State())

    init(port: Int, token: String, stalled: Int, floodPerSecond: Double) {
        self.port = port
        self.token = token
        self.stalled = stalled
        self.floodPerSecond = floodPerSecond
    }

    var snapshot: Figures { state.withLock { $0.figures } }

    func start() {
        for body in [stallLoop, floodLoop, probeLoop] {
            state.withLock { $0.running += 1 }
            let thread = Thread { [self] in
                body()
                state.withLock { $0.running -= 1 }
            }
            thread.start()
        }
    }

    /// Stops the clients and waits for their threads to end.
    func stop() async {
        state.withLock { $0.stopping = true }
        while state.withLock({ $0.running }) > 0 { try? await Task.sleep(for: .milliseconds(50)) }
    }

    private var stopped: Bool { state.withLock { $0.stopping } }

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
                state.withLock { $0.figures.stalledOpened += 1 }
            }
            var polls = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            guard poll(&polls, nfds_t(polls.count), 200) > 0 else { continue }
            var buf = [UInt8](repeating: 0, count: 4096)
            for p in polls where p.revents != 0 {
                let n = buf.withUnsafeMutableBytes { recv(p.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if n <= 0 {
                    close(p.fd)
                    fds.removeAll { $0 == p.fd }
                    state.withLock { $0.figures.stalledClosed += 1 }
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
                state.withLock { $0.figures.floodAnswers[0, default: 0] += 1 }
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
            state.withLock { $0.figures.floodAnswers[status, default: 0] += 1 }
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
            state.withLock {
                if status == 200 { $0.figures.probesOK += 1 } else { $0.figures.probesFailed += 1 }
                $0.figures.probeMillis.append(millis)
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
