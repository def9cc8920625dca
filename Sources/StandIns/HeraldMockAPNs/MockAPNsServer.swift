// The APNs stand-in: HTTP/2 over TLS on nghttp2's server session API and OpenSSL, with
// non-blocking sockets driven by one epoll loop on the thread that calls `run()`.
// Output of a loop pass is coalesced: each connection gets its pending frames written with
// one SSL_write per pass (a TLS record holds up to 16 KB of them).
// This file holds the server's state and its loop; the rest is by concern: ServerConnections.swift (accepting,
// TLS, reading and writing connections), ServerStreams.swift (requests and answers on HTTP/2 streams),
// RecordLine.swift (the record file's lines), MetricsEndpoint.swift (the HTTP/1.1 /metrics and control listener),
// JSONOut.swift (JSON output).
import CHeraldMockTLS
import CNghttp2
import DequeModule
import Glibc

/// @unchecked Sendable: every mutable property is touched only by the thread inside `run()`
/// (and by `init` before it); `stop()` only writes to an eventfd, which is thread-safe.
/// The state is internal rather than private so the extensions in the files named above can use it; nothing
/// outside the module sees it.
public final class MockAPNsServer: @unchecked Sendable {
    public let configuration: MockAPNsConfiguration
    /// The TCP port the HTTP/2 listener is bound to.
    public let port: Int
    /// The TCP port of the /metrics listener, if any.
    public let metricsPort: Int?

    let tlsContext: OpaquePointer
    let listenFD: Int32
    let metricsFD: Int32
    let epollFD: Int32
    let wakeFD: Int32
    let verifier: ProviderTokenVerifier
    let checker: RequestCheck
    var faults: FaultInjector
    var uuids: UUIDWriter
    var metrics = MockMetrics()
    let recorder: Recorder?
    var recordBuffer: [UInt8] = []
    var connections: [Int32: Connection] = [:]
    var dirty: [Connection] = []
    /// Connections whose read budget ran out with input left, in the order they ran out.
    var readAgain: [Connection] = []
    var pass: UInt64 = 0
    var delayed: Deque<DelayedAnswer> = []
    var httpClients: [Int32: [UInt8]] = [:]
    /// Per provider key: `iat` of the newest token accepted (for TooManyProviderTokenUpdates).
    var currentTokenIssuedAt: [String: Int64] = [:]
    let readBuffer: UnsafeMutablePointer<UInt8>
    static let readBufferSize = 1 << 16
    /// Bytes one connection may have read per loop pass before the others get their turn (about 60 requests). APNs
    /// serves each connection on its own; this stand-in serves them all on one thread, so without a budget a
    /// connection whose client keeps a thousand requests queued would make every other connection wait for all of
    /// them (a call on a connection of its own behind a fan-out on another).
    static let readBytesPerPass = 1 << 16
    /// Header names and values of an answer are assembled here (nghttp2 copies them on submit).
    let scratch: UnsafeMutablePointer<UInt8>
    let nva: UnsafeMutablePointer<nghttp2_nv>
    var nextSerial: UInt64 = 0
    /// Otherwise valid requests seen on token-auth connections (for `rejectTokenEvery`).
    var tokenRequestsValid = 0
    var nowMonotonicMicros: Int64 = 0
    var nowWallMillis: Int64 = 0
    var stopping = false
    /// Seeded draws for `resetRate` (kept apart from the answer faults' sequence).
    var resetRandom: SeededRandom
    /// While `nowMonotonicMicros` is below this, answers are held back (a pause).
    var pausedUntilMicros: Int64 = 0

    // Scratch layout (offsets).
    static let statusName = 0, apnsIDName = 8, contentTypeName = 16, contentTypeValue = 32
    static let statusValue = 64, apnsIDValue = 72

    public init(configuration: MockAPNsConfiguration) throws {
        self.configuration = configuration
        var err = [CChar](repeating: 0, count: 512)
        guard
            let ctx = hmt_ctx_new(
                configuration.certificatePath, configuration.privateKeyPath,
                configuration.clientCAPath, &err, err.count)
        else {
            throw MockSetupError(Self.cString(err))
        }
        tlsContext = ctx
        do {
            verifier = try ProviderTokenVerifier(keys: configuration.providerKeys)
            recorder = try configuration.recordPath.map { try Recorder(path: $0) }
        } catch {
            hmt_ctx_free(ctx)
            throw error
        }
        checker = RequestCheck(
            topics: configuration.topics, deadTokens: configuration.deadTokens,
            registered: configuration.registeredTokens, environment: configuration.environment)
        faults = FaultInjector(rates: configuration.faults, seed: configuration.seed)
        uuids = UUIDWriter(random: SeededRandom(seed: configuration.seed ^ 0xA5A5_5A5A_1234_5678))
        resetRandom = SeededRandom(seed: configuration.seed ^ 0x5EED_0F_0000_4E57)

        var listen: (fd: Int32, port: Int)
        do {
            listen = try Self.bindListener(host: configuration.host, port: configuration.port)
        } catch {
            hmt_ctx_free(ctx)
            recorder?.close()
            throw error
        }
        listenFD = listen.fd
        port = listen.port
        if let mp = configuration.metricsPort {
            do {
                let m = try Self.bindListener(host: configuration.host, port: mp)
                metricsFD = m.fd
                metricsPort = m.port
            } catch {
                Glibc.close(listen.fd)
                hmt_ctx_free(ctx)
                recorder?.close()
                throw error
            }
        } else {
            metricsFD = -1
            metricsPort = nil
        }
        epollFD = hmt_epoll_create()
        wakeFD = hmt_eventfd()
        readBuffer = .allocate(capacity: Self.readBufferSize)
        scratch = .allocate(capacity: 256)
        scratch.initialize(repeating: 0, count: 256)
        nva = .allocate(capacity: 4)
        Self.put(":status", at: Self.statusName, in: scratch)
        Self.put("apns-id", at: Self.apnsIDName, in: scratch)
        Self.put("content-type", at: Self.contentTypeName, in: scratch)
        Self.put("application/json", at: Self.contentTypeValue, in: scratch)
        recordBuffer.reserveCapacity(1 << 16)
        addToEpoll(listenFD)
        addToEpoll(wakeFD)
        if metricsFD >= 0 { addToEpoll(metricsFD) }
    }

    deinit {
        for c in connections.values { closeConnection(c, abort: false) }
        for fd in httpClients.keys { Glibc.close(fd) }
        Glibc.close(listenFD)
        if metricsFD >= 0 { Glibc.close(metricsFD) }
        Glibc.close(epollFD)
        Glibc.close(wakeFD)
        hmt_ctx_free(tlsContext)
        readBuffer.deallocate()
        scratch.deallocate()
        nva.deallocate()
        recorder?.close()
    }

    /// Asks `run()` to return; safe from any thread or a signal-handling thread.
    public func stop() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    /// Serves until `stop()`; blocks the calling thread (give it a thread of its own).
    /// `stop()` drains: every connection gets GOAWAY (NO_ERROR, last processed stream,
    /// `{"reason":"Shutdown"}`), requests already received are still answered (up to
    /// `--latency-ms` + 1 s), then connections close and the record file is flushed.
    public func run() {
        let maxEvents: Int32 = 256
        let readyFDs = UnsafeMutablePointer<Int32>.allocate(capacity: Int(maxEvents))
        let readyEvents = UnsafeMutablePointer<Int32>.allocate(capacity: Int(maxEvents))
        defer { readyFDs.deallocate(); readyEvents.deallocate() }
        updateClock()
        if configuration.initialPauseMilliseconds > 0 { pause(milliseconds: configuration.initialPauseMilliseconds) }
        var drainDeadline: Int64?
        while true {
            if stopping && drainDeadline == nil {
                drainDeadline = nowMonotonicMicros + Int64(configuration.latencyMilliseconds + 1000) * 1000
                beginShutdown()
            }
            if let deadline = drainDeadline, connections.isEmpty || nowMonotonicMicros >= deadline { break }
            var timeout: Int32 = recorder == nil && drainDeadline == nil ? 1000 : 100
            if !readAgain.isEmpty { timeout = 0 }
            if let next = delayed.first {
                // Round up: waking before the due time would only spin.
                let wait = (next.due - nowMonotonicMicros + 999) / 1000
                timeout = Int32(clamping: max(0, min(Int64(timeout), wait)))
            }
            let n = hmt_epoll_wait(epollFD, readyFDs, readyEvents, maxEvents, timeout)
            updateClock()
            if n < 0 { break }
            pass &+= 1
            let unfinished = readAgain
            readAgain.removeAll(keepingCapacity: true)
            for conn in unfinished { conn.moreToRead = false }
            for i in 0..<Int(n) {
                let fd = readyFDs[i]
                let ev = readyEvents[i]
                if fd == listenFD {
                    acceptConnections()
                } else if fd == wakeFD {
                    var value: UInt64 = 0
                    _ = read(wakeFD, &value, 8)
                    stopping = true
                } else if fd == metricsFD {
                    acceptHTTPClients()
                } else if let conn = connections[fd] {
                    handleEvents(conn, ev)
                } else if httpClients[fd] != nil {
                    handleHTTPClient(fd)
                }
            }
            // Input left over from the last pass, for connections epoll did not report again in this one.
            for conn in unfinished where !conn.closed && conn.readInPass != pass { readAvailable(conn) }
            if metrics.paused && nowMonotonicMicros >= pausedUntilMicros { metrics.paused = false }
            fireDelayedAnswers()
            flushDirty()
            if let recorder, !recordBuffer.isEmpty { recorder.submit(&recordBuffer) }
        }
        for c in Array(connections.values) {
            flush(c)
            closeConnection(c, abort: false)
        }
        if let recorder {
            recorder.submit(&recordBuffer)
            recorder.close()
        }
    }

    // MARK: Helpers

    func addToEpoll(_ fd: Int32) {
        hmt_epoll_ctl(epollFD, 0, fd, Int32(HMT_EV_IN))
    }

    func updateClock() {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        nowMonotonicMicros = Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
        clock_gettime(CLOCK_REALTIME, &ts)
        nowWallMillis = Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }

    private static func put(_ s: StaticString, at offset: Int, in p: UnsafeMutablePointer<UInt8>) {
        (p + offset).update(from: s.utf8Start, count: s.utf8CodeUnitCount)
    }

    static func cString(_ chars: [CChar]) -> String {
        String(decoding: chars.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func bindListener(host: String, port: Int) throws -> (fd: Int32, port: Int) {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        var res: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(host, String(port), &hints, &res)
        guard rc == 0, let first = res else {
            throw MockSetupError("cannot resolve --host \(host): \(String(cString: gai_strerror(rc)))")
        }
        defer { freeaddrinfo(res) }
        let ai = first.pointee
        let fd = socket(
            ai.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw MockSetupError("socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bind(fd, ai.ai_addr, ai.ai_addrlen) == 0 else {
            let e = String(cString: strerror(errno))
            Glibc.close(fd)
            throw MockSetupError("cannot bind \(host):\(port): \(e)")
        }
        guard Glibc.listen(fd, 512) == 0 else {
            let e = String(cString: strerror(errno))
            Glibc.close(fd)
            throw MockSetupError("cannot listen on \(host):\(port): \(e)")
        }
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let bound: Int = withUnsafeMutablePointer(to: &storage) { sp in
            sp.withMemoryRebound(to: sockaddr.self, capacity: 1) { p -> Int in
                guard getsockname(fd, p, &len) == 0 else { return port }
                if p.pointee.sa_family == sa_family_t(AF_INET) {
                    return p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                        Int(UInt16(bigEndian: $0.pointee.sin_port))
                    }
                }
                return p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    Int(UInt16(bigEndian: $0.pointee.sin6_port))
                }
            }
        }
        return (fd, bound)
    }
}
