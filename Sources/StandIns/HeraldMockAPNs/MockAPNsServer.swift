// The APNs stand-in: HTTP/2 over TLS on nghttp2's server session API and OpenSSL, with
// non-blocking sockets driven by one epoll loop on the thread that calls `run()`.
// Output of a loop pass is coalesced: each connection gets its pending frames written with
// one SSL_write per pass (a TLS record holds up to 16 KB of them).
import CHeraldMockTLS
import CNghttp2
import DequeModule
import Glibc

/// @unchecked Sendable: every mutable property is touched only by the thread inside `run()`
/// (and by `init` before it); `stop()` only writes to an eventfd, which is thread-safe.
public final class MockAPNsServer: @unchecked Sendable {
    public let configuration: MockAPNsConfiguration
    /// The TCP port the HTTP/2 listener is bound to.
    public let port: Int
    /// The TCP port of the /metrics listener, if any.
    public let metricsPort: Int?

    private let tlsContext: OpaquePointer
    private let listenFD: Int32
    private let metricsFD: Int32
    private let epollFD: Int32
    private let wakeFD: Int32
    private let verifier: ProviderTokenVerifier
    private let checker: RequestCheck
    private var faults: FaultInjector
    private var uuids: UUIDWriter
    private var metrics = MockMetrics()
    private let recorder: Recorder?
    private var recordBuffer: [UInt8] = []
    private var connections: [Int32: Connection] = [:]
    private var dirty: [Connection] = []
    /// Connections whose read budget ran out with input left, in the order they ran out.
    private var readAgain: [Connection] = []
    private var pass: UInt64 = 0
    private var delayed: Deque<DelayedAnswer> = []
    private var httpClients: [Int32: [UInt8]] = [:]
    /// Per provider key: `iat` of the newest token accepted (for TooManyProviderTokenUpdates).
    private var currentTokenIssuedAt: [String: Int64] = [:]
    private let readBuffer: UnsafeMutablePointer<UInt8>
    private static let readBufferSize = 1 << 16
    /// Bytes one connection may have read per loop pass before the others get their turn (about 60 requests). APNs
    /// serves each connection on its own; this stand-in serves them all on one thread, so without a budget a
    /// connection whose client keeps a thousand requests queued would make every other connection wait for all of
    /// them (a call on a connection of its own behind a fan-out on another).
    private static let readBytesPerPass = 1 << 16
    /// Header names and values of an answer are assembled here (nghttp2 copies them on submit).
    private let scratch: UnsafeMutablePointer<UInt8>
    private let nva: UnsafeMutablePointer<nghttp2_nv>
    private var nextSerial: UInt64 = 0
    /// Otherwise valid requests seen on token-auth connections (for `rejectTokenEvery`).
    private var tokenRequestsValid = 0
    private var nowMonotonicMicros: Int64 = 0
    private var nowWallMillis: Int64 = 0
    private var stopping = false
    /// Seeded draws for `resetRate` (kept apart from the answer faults' sequence).
    private var resetRandom: SeededRandom
    /// While `nowMonotonicMicros` is below this, answers are held back (a pause).
    private var pausedUntilMicros: Int64 = 0

    struct DelayedAnswer {
        /// Monotonic microseconds.
        let due: Int64
        let connection: Connection
        let slot: Int
        let generation: UInt32
        let verdict: MockVerdict
    }

    // Scratch layout (offsets).
    private static let statusName = 0, apnsIDName = 8, contentTypeName = 16, contentTypeValue = 32
    private static let statusValue = 64, apnsIDValue = 72

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
        checker = RequestCheck(topics: configuration.topics, deadTokens: configuration.deadTokens)
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

    // MARK: Connections

    private func beginShutdown() {
        hmt_epoll_ctl(epollFD, 2, listenFD, 0)
        let reason = Array(#"{"reason":"Shutdown"}"#.utf8)
        for conn in connections.values {
            guard let session = conn.session else {
                closeConnection(conn, abort: false)
                continue
            }
            let last = nghttp2_session_get_last_proc_stream_id(session)
            if conn.goawayLastStreamID.map({ last < $0 }) ?? true { conn.goawayLastStreamID = last }
            reason.withUnsafeBufferPointer { r in
                _ = nghttp2_submit_goaway(
                    session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, NGHTTP2_NO_ERROR.rawValue,
                    r.baseAddress, r.count)
            }
            markDirty(conn)
        }
    }

    private func acceptConnections() {
        while true {
            let fd = hmt_accept(listenFD, 1)
            if fd < 0 { return }
            guard let tls = hmt_conn_new(tlsContext, fd) else {
                Glibc.close(fd)
                continue
            }
            nextSerial += 1
            let conn = Connection(fd: fd, serial: nextSerial, server: self, tls: tls)
            connections[fd] = conn
            metrics.connectionsAccepted += 1
            metrics.connectionsOpen += 1
            addToEpoll(fd)
            handshake(conn)
        }
    }

    private func handleEvents(_ conn: Connection, _ ev: Int32) {
        if conn.handshaking {
            handshake(conn)
            return
        }
        if ev & Int32(HMT_EV_IN | HMT_EV_HUP) != 0 {
            readAvailable(conn)
        }
        if !conn.closed && ev & Int32(HMT_EV_OUT) != 0 {
            markDirty(conn)
        }
    }

    private func handshake(_ conn: Connection) {
        guard let tls = conn.tls else { return }
        let r = hmt_conn_handshake(tls)
        switch r {
        case Int32(HMT_OK):
            conn.handshaking = false
            guard hmt_conn_is_h2(tls) == 1 else {
                metrics.handshakeFailures += 1
                closeConnection(conn, abort: false)
                return
            }
            conn.certificateAuth = configuration.clientCAPath != nil && hmt_conn_peer_verified(tls) == 1
            if conn.certificateAuth {
                metrics.connectionsCertificateAuth += 1
            }
            let initial =
                conn.certificateAuth ? configuration.maxConcurrentStreams : configuration.initialConcurrentStreams
            guard conn.startSession(initialConcurrentStreams: initial) else {
                closeConnection(conn, abort: false)
                return
            }
            setWatchWritable(conn, false)
            markDirty(conn)
            readAvailable(conn)
        case Int32(HMT_WANT_READ):
            setWatchWritable(conn, false)
        case Int32(HMT_WANT_WRITE):
            setWatchWritable(conn, true)
        default:
            metrics.handshakeFailures += 1
            closeConnection(conn, abort: false)
        }
    }

    private func readAvailable(_ conn: Connection) {
        guard let tls = conn.tls, let session = conn.session else { return }
        guard conn.readInPass != pass else { return }
        conn.readInPass = pass
        var taken = 0
        while !conn.closed {
            if taken >= Self.readBytesPerPass {
                // Budget spent: the rest waits for the next pass, after every other connection had its turn.
                if !conn.moreToRead {
                    conn.moreToRead = true
                    readAgain.append(conn)
                    metrics.readBudgetSpent += 1
                }
                break
            }
            let r = hmt_conn_read(tls, readBuffer, Int32(Self.readBufferSize))
            if r > 0 {
                taken += Int(r)
                let rv = nghttp2_session_mem_recv(session, readBuffer, Int(r))
                if rv < 0 {
                    conn.failed = true
                    break
                }
                if conn.resetRequested { break }
            } else if r == HMT_WANT_READ {
                break
            } else if r == HMT_WANT_WRITE {
                setWatchWritable(conn, true)
                break
            } else {
                // The peer closed or reset the connection: nothing more can be delivered.
                closeConnection(conn, abort: false)
                return
            }
        }
        if conn.resetRequested {
            flush(conn)
            metrics.resets += 1
            closeConnection(conn, abort: true)
            return
        }
        markDirty(conn)
    }

    private func markDirty(_ conn: Connection) {
        guard !conn.inDirtyList, !conn.closed else { return }
        conn.inDirtyList = true
        dirty.append(conn)
    }

    private func flushDirty() {
        guard !dirty.isEmpty else { return }
        let list = dirty
        dirty.removeAll(keepingCapacity: true)
        for conn in list {
            conn.inDirtyList = false
            flush(conn)
        }
    }

    /// Takes every frame nghttp2 has ready and writes the lot with as few SSL_write calls as
    /// possible (one per 16 KB record); closes the connection when the session is finished.
    private func flush(_ conn: Connection) {
        guard !conn.closed, let session = conn.session, let tls = conn.tls else { return }
        if conn.failed {
            closeConnection(conn, abort: false)
            return
        }
        while conn.pendingOutput < (1 << 20) {
            var p: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &p)
            if n < 0 {
                closeConnection(conn, abort: false)
                return
            }
            guard n > 0, let p else {
                let before = conn.advertisedStreams
                if conn.submitScheduledMaxConcurrentStreams() {
                    if conn.advertisedStreams > before {
                        metrics.streamLimitRaises += 1
                    } else {
                        metrics.streamLimitLowerings += 1
                    }
                    continue
                }
                break
            }
            conn.appendOutput(p, n)
        }
        while conn.outStart < conn.outEnd {
            let len = Int32(min(conn.outEnd - conn.outStart, Int(Int32.max)))
            let r = hmt_conn_write(tls, conn.out + conn.outStart, len)
            if r > 0 {
                conn.outStart += Int(r)
            } else if r == HMT_WANT_WRITE || r == HMT_WANT_READ {
                setWatchWritable(conn, true)
                return
            } else {
                closeConnection(conn, abort: false)
                return
            }
        }
        conn.outStart = 0
        conn.outEnd = 0
        setWatchWritable(conn, false)
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            closeConnection(conn, abort: false)
        }
    }

    private func setWatchWritable(_ conn: Connection, _ on: Bool) {
        guard conn.watchingWritable != on, !conn.closed else { return }
        conn.watchingWritable = on
        hmt_epoll_ctl(epollFD, 1, conn.fd, Int32(on ? (HMT_EV_IN | HMT_EV_OUT) : HMT_EV_IN))
    }

    private func closeConnection(_ conn: Connection, abort: Bool) {
        guard !conn.closed else { return }
        conn.closed = true
        hmt_epoll_ctl(epollFD, 2, conn.fd, 0)
        if abort {
            // SO_LINGER 0: close sends a TCP RST, like a connection lost mid-flight.
            var lg = linger(l_onoff: 1, l_linger: 0)
            setsockopt(conn.fd, SOL_SOCKET, SO_LINGER, &lg, socklen_t(MemoryLayout<linger>.size))
        }
        Glibc.close(conn.fd)
        connections.removeValue(forKey: conn.fd)
        metrics.connectionsOpen -= 1
    }

    // MARK: Streams (called from nghttp2 callbacks on the loop thread)

    func beginStream(_ conn: Connection, streamID: Int32) {
        let slot = conn.openSlot(streamID: streamID)
        metrics.streams += 1
        if let last = conn.goawayLastStreamID, streamID > last {
            conn.slots[slot].refused = true
            return
        }
        conn.streamsSeen += 1
        if configuration.resetEvery > 0 && conn.streamsSeen >= configuration.resetEvery {
            conn.resetRequested = true
            return
        }
        if configuration.resetRate > 0 && resetRandom.unit() < configuration.resetRate {
            metrics.randomResets += 1
            conn.resetRequested = true
            return
        }
        if configuration.goawayEvery > 0 && conn.goawayLastStreamID == nil
            && conn.streamsSeen >= configuration.goawayEvery
        {
            conn.goawayLastStreamID = streamID
            metrics.goaways += 1
            nghttp2_submit_goaway(
                conn.session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID,
                NGHTTP2_NO_ERROR.rawValue, nil, 0)
        }
    }

    func countRefusedStream() { metrics.refusedStreams += 1 }

    /// A client opened a stream while `over - 1` streams above the acknowledged limit were open.
    func countStreamOverLimit(_ conn: Connection, over: Int) {
        metrics.streamsOverLimit += 1
        conn.maxStreamsOverLimit = max(conn.maxStreamsOverLimit, over)
        metrics.maxStreamsOverLimit = max(metrics.maxStreamsOverLimit, over)
    }

    func requestComplete(_ conn: Connection, slot: Int) {
        if conn.resetRequested { return }
        let verdict = evaluate(conn, slot: slot)
        if configuration.latencyMilliseconds > 0 || nowMonotonicMicros < pausedUntilMicros {
            // Held answers stay in arrival order: a pause's end is never earlier than an answer
            // already queued (`resume` moves queued ones to now).
            let due = max(nowMonotonicMicros + Int64(configuration.latencyMilliseconds) * 1000, pausedUntilMicros)
            delayed.append(
                DelayedAnswer(
                    due: due, connection: conn, slot: slot,
                    generation: conn.slots[slot].generation, verdict: verdict))
            metrics.heldAnswers = delayed.count
        } else {
            answer(conn, slot: slot, verdict: verdict)
        }
    }

    private func evaluate(_ conn: Connection, slot: Int) -> MockVerdict {
        let now = nowWallMillis
        var verdict = conn.slots[slot].body.withUnsafeBytes { body in
            checker.check(
                head: conn.slots[slot].head, body: body, bodyLength: conn.slots[slot].bodyLength,
                certificateAuth: conn.certificateAuth, nowMillis: now
            ) { authorization in
                self.authorize(conn, authorization)
            }
        }
        if verdict.status == 200, configuration.rejectTokenEvery > 0, !conn.certificateAuth {
            tokenRequestsValid += 1
            if tokenRequestsValid % configuration.rejectTokenEvery == 0 {
                metrics.injected[MockMetrics.slot(.invalidProviderToken)] += 1
                return MockVerdict(.invalidProviderToken, timestamp: nil)
            }
        }
        if verdict.status == 200, let fault = faults.draw() {
            metrics.injected[MockMetrics.slot(fault)] += 1
            verdict = MockVerdict(fault, timestamp: fault == .unregistered ? now : nil)
        }
        return verdict
    }

    private func authorize(_ conn: Connection, _ authorization: UnsafeRawBufferPointer?) -> MockReason? {
        if conn.certificateAuth || verifier.isEmpty { return nil }
        guard let authorization, !authorization.isEmpty else { return .missingProviderToken }
        let result: ProviderTokenCheck
        if let cached = conn.cachedAuthorizationCheck, conn.cachedAuthorization.count == authorization.count,
            conn.cachedAuthorization.withUnsafeBytes({
                memcmp($0.baseAddress!, authorization.baseAddress!, authorization.count) == 0
            })
        {
            result = cached
        } else {
            result = verifier.check(authorization: authorization)
            metrics.providerTokenVerifications += 1
            conn.cachedAuthorization = Array(authorization)
            conn.cachedAuthorizationCheck = result
        }
        switch result {
        case .invalid:
            return .invalidProviderToken
        case .valid(let keyID, let issuedAt):
            let nowSeconds = nowWallMillis / 1000
            if issuedAt > nowSeconds + configuration.providerTokenClockSkewSeconds { return .invalidProviderToken }
            if nowSeconds - issuedAt > configuration.providerTokenMaxAgeSeconds { return .expiredProviderToken }
            let minimum = configuration.minimumTokenUpdateIntervalSeconds
            if minimum > 0 {
                // The key's current token is the newest accepted one; older ones stay usable
                // until they expire (other connections may still carry them).
                if let current = currentTokenIssuedAt[keyID], issuedAt > current {
                    if issuedAt - current < minimum { return .tooManyProviderTokenUpdates }
                    currentTokenIssuedAt[keyID] = issuedAt
                } else if currentTokenIssuedAt[keyID] == nil {
                    currentTokenIssuedAt[keyID] = issuedAt
                }
            }
            return nil
        }
    }

    /// Holds every answer back for `milliseconds` from now (requests are still read and checked;
    /// their answers go out in arrival order when the pause ends). Extends a running pause.
    func pause(milliseconds: Int) {
        let until = nowMonotonicMicros + Int64(milliseconds) * 1000
        guard until > pausedUntilMicros else { return }
        if !metrics.paused { metrics.pauses += 1 }
        metrics.paused = true
        pausedUntilMicros = until
    }

    /// Ends a pause now: held answers go out in arrival order (their `--latency-ms` permitting).
    func resume() {
        guard pausedUntilMicros > nowMonotonicMicros else { return }
        let latency = Int64(configuration.latencyMilliseconds) * 1000
        for i in delayed.indices where delayed[i].due == pausedUntilMicros {
            let d = delayed[i]
            // An answer's latency counts from its arrival, which a pause may already have covered.
            delayed[i] = DelayedAnswer(
                due: min(d.due, nowMonotonicMicros + latency), connection: d.connection,
                slot: d.slot, generation: d.generation, verdict: d.verdict)
        }
        // Keep the queue ordered by due time (a stable sort of the waiting part).
        let waiting = delayed.enumerated().sorted { ($0.element.due, $0.offset) < ($1.element.due, $1.offset) }
        delayed = Deque(waiting.map(\.element))
        pausedUntilMicros = nowMonotonicMicros
        metrics.paused = false
    }

    private func fireDelayedAnswers() {
        while let d = delayed.first, d.due <= nowMonotonicMicros {
            delayed.removeFirst()
            let conn = d.connection
            guard !conn.closed, d.slot < conn.slots.count, conn.slots[d.slot].generation == d.generation else {
                continue
            }
            answer(conn, slot: d.slot, verdict: d.verdict)
            markDirty(conn)
        }
        metrics.heldAnswers = delayed.count
    }

    /// Submits the answer of one stream and records it.
    private func answer(_ conn: Connection, slot: Int, verdict: MockVerdict) {
        guard let session = conn.session, !conn.slots[slot].answered else { return }
        conn.slots[slot].answered = true
        let streamID = conn.slots[slot].streamID

        // apns-id: the request's, or a fresh UUID.
        let idDest = UnsafeMutableRawBufferPointer(start: scratch + Self.apnsIDValue, count: 36)
        let echoed = conn.slots[slot].head.with(.apnsID) { id -> Bool in
            guard let id, id.count == 36 else { return false }
            idDest.copyMemory(from: id)
            return true
        }
        if !echoed { uuids.write(into: idDest) }

        var status = verdict.status
        for i in stride(from: 2, through: 0, by: -1) {
            scratch[Self.statusValue + i] = UInt8(ascii: "0") + UInt8(status % 10)
            status /= 10
        }
        nva[0] = nghttp2_nv(
            name: scratch + Self.statusName, value: scratch + Self.statusValue,
            namelen: 7, valuelen: 3, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
        nva[1] = nghttp2_nv(
            name: scratch + Self.apnsIDName, value: scratch + Self.apnsIDValue,
            namelen: 7, valuelen: 36, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
        if verdict.status == 200 {
            nghttp2_submit_response(session, streamID, nva, 2, nil)
        } else {
            nva[2] = nghttp2_nv(
                name: scratch + Self.contentTypeName, value: scratch + Self.contentTypeValue,
                namelen: 12, valuelen: 16, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            Self.appendErrorBody(&conn.slots[slot].response, verdict)
            var provider = nghttp2_data_provider()
            provider.read_callback = { _, streamID, buf, length, flags, _, userData in
                guard let userData, let buf, let flags else {
                    return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
                }
                let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
                guard let index = conn.slotIndex(of: streamID) else {
                    flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
                    return 0
                }
                let offset = conn.slots[index].responseOffset
                let n = min(length, conn.slots[index].response.count - offset)
                conn.slots[index].response.withUnsafeBytes { raw in
                    UnsafeMutableRawPointer(buf).copyMemory(from: raw.baseAddress! + offset, byteCount: n)
                }
                conn.slots[index].responseOffset += n
                if conn.slots[index].responseOffset >= conn.slots[index].response.count {
                    flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
                }
                return n
            }
            nghttp2_submit_response(session, streamID, nva, 3, &provider)
        }
        if !conn.certificateAuth {
            // APNs: a token-auth connection is raised to its full limit after a success and
            // lowered back to the initial one after a provider-token rejection; raised again by
            // the success of a request opened after that rejection. Submitted in
            // flush, once this answer has been serialized (nghttp2 sends SETTINGS ahead of queued
            // HEADERS, and the change must follow the answer on the wire).
            if verdict.status == 200 {
                if streamID > conn.raiseAboveStreamID {
                    conn.scheduleMaxConcurrentStreams(configuration.maxConcurrentStreams)
                }
            } else if let reason = verdict.reason, reason.rejectsProviderToken {
                conn.scheduleMaxConcurrentStreams(configuration.initialConcurrentStreams)
                conn.raiseAboveStreamID = conn.highestStreamID
            }
        }
        metrics.answers[MockMetrics.slot(verdict.reason)] += 1
        if recorder != nil {
            appendRecord(
                conn.slots[slot], verdict: verdict,
                apnsID: UnsafeRawBufferPointer(start: scratch + Self.apnsIDValue, count: 36))
        }
    }

    static func appendErrorBody(_ out: inout [UInt8], _ verdict: MockVerdict) {
        out.removeAll(keepingCapacity: true)
        out.append(contentsOf: #"{"reason":""#.utf8)
        out.append(contentsOf: (verdict.reason?.rawValue ?? "InternalServerError").utf8)
        out.append(UInt8(ascii: "\""))
        if let ts = verdict.timestamp {
            out.append(contentsOf: #","timestamp":"#.utf8)
            out.append(contentsOf: String(ts).utf8)
        }
        out.append(UInt8(ascii: "}"))
    }

    // MARK: Recording

    private func appendRecord(_ s: StreamSlot, verdict: MockVerdict, apnsID: UnsafeRawBufferPointer) {
        var b = recordBuffer
        recordBuffer = []
        defer { recordBuffer = b }
        b.append(contentsOf: #"{"token":"#.utf8)
        s.head.withToken { JSONOut.appendString(&b, $0) }
        b.append(contentsOf: #","topic":"#.utf8)
        s.head.with(.topic) { JSONOut.appendString(&b, $0) }
        b.append(contentsOf: #","push_type":"#.utf8)
        s.head.with(.pushType) { JSONOut.appendString(&b, $0) }
        b.append(contentsOf: #","priority":"#.utf8)
        s.head.with(.priority) { JSONOut.appendNumberOrString(&b, $0) }
        b.append(contentsOf: #","apns_id":"#.utf8)
        JSONOut.appendString(&b, apnsID)
        b.append(contentsOf: #","collapse_id":"#.utf8)
        s.head.with(.collapseID) { JSONOut.appendString(&b, $0) }
        b.append(contentsOf: #","expiration":"#.utf8)
        s.head.with(.expiration) { JSONOut.appendNumberOrString(&b, $0) }
        b.append(contentsOf: #","payload":"#.utf8)
        s.body.withUnsafeBytes { body in
            if s.bodyLength == body.count, body.count > 0, verdict.status == 200 || JSONCheck.isObject(body) {
                JSONOut.appendCompactJSON(&b, body)
            } else {
                b.append(contentsOf: "null".utf8)
            }
        }
        b.append(contentsOf: #","status":"#.utf8)
        b.append(contentsOf: String(verdict.status).utf8)
        b.append(contentsOf: #","reason":"#.utf8)
        if let r = verdict.reason {
            b.append(UInt8(ascii: "\""))
            b.append(contentsOf: r.rawValue.utf8)
            b.append(UInt8(ascii: "\""))
        } else {
            b.append(contentsOf: "null".utf8)
        }
        if let ts = verdict.timestamp {
            b.append(contentsOf: #","timestamp":"#.utf8)
            b.append(contentsOf: String(ts).utf8)
        }
        b.append(contentsOf: #","at":"#.utf8)
        b.append(contentsOf: String(nowWallMillis).utf8)
        b.append(contentsOf: "}\n".utf8)
    }

    // MARK: /metrics over HTTP/1.1

    private func acceptHTTPClients() {
        while true {
            let fd = hmt_accept(metricsFD, 0)
            if fd < 0 { return }
            httpClients[fd] = []
            addToEpoll(fd)
        }
    }

    private func handleHTTPClient(_ fd: Int32) {
        var buf = httpClients[fd] ?? []
        while true {
            let n = read(fd, readBuffer, 4096)
            if n > 0 {
                buf.append(contentsOf: UnsafeBufferPointer(start: readBuffer, count: n))
                if buf.count > 16384 { closeHTTPClient(fd); return }
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                break
            } else {
                closeHTTPClient(fd)
                return
            }
        }
        httpClients[fd] = buf
        guard let end = Self.find(Array("\r\n\r\n".utf8), in: buf) else { return }
        let requestLine = String(decoding: buf[0..<end].prefix { $0 != 0x0D }, as: UTF8.self)
        let parts = requestLine.split(separator: " ")
        let status: String
        let body: String
        let contentType: String
        if parts.count >= 2, parts[0] == "GET", parts[1] == "/metrics" {
            status = "200 OK"
            body = metrics.render()
            contentType = "text/plain; version=0.0.4; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "POST", parts[1].hasPrefix("/pause") {
            // POST /pause?ms=N: hold every answer back for N milliseconds (default 30000).
            var ms = 30_000
            if let q = parts[1].split(separator: "?", maxSplits: 1).dropFirst().first {
                for kv in q.split(separator: "&") where kv.hasPrefix("ms=") { ms = Int(kv.dropFirst(3)) ?? -1 }
            }
            if ms >= 0 {
                pause(milliseconds: ms)
                status = "200 OK"
                body = "paused for \(ms) ms\n"
            } else {
                status = "400 Bad Request"
                body = "ms must be a non-negative integer\n"
            }
            contentType = "text/plain; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "POST", parts[1] == "/resume" {
            resume()
            status = "200 OK"
            body = "resumed\n"
            contentType = "text/plain; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "GET", parts[1] == "/healthz" || parts[1] == "/readyz" {
            status = "200 OK"
            body = "ok\n"
            contentType = "text/plain; charset=utf-8"
        } else {
            status = "404 Not Found"
            body = "not found\n"
            contentType = "text/plain; charset=utf-8"
        }
        let response = Array(
            "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
                .utf8)
        // Small answer to a local scraper: send it in blocking mode with a short timeout.
        var flags = fcntl(fd, F_GETFL)
        flags &= ~Int32(O_NONBLOCK)
        _ = fcntl(fd, F_SETFL, flags)
        var tv = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        response.withUnsafeBytes { raw in
            var off = 0
            while off < raw.count {
                let w = send(fd, raw.baseAddress! + off, raw.count - off, Int32(MSG_NOSIGNAL))
                if w <= 0 { break }
                off += w
            }
        }
        closeHTTPClient(fd)
    }

    private func closeHTTPClient(_ fd: Int32) {
        hmt_epoll_ctl(epollFD, 2, fd, 0)
        Glibc.close(fd)
        httpClients.removeValue(forKey: fd)
    }

    // MARK: Helpers

    private func addToEpoll(_ fd: Int32) {
        hmt_epoll_ctl(epollFD, 0, fd, Int32(HMT_EV_IN))
    }

    private func updateClock() {
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

    static func find(_ needle: [UInt8], in hay: [UInt8]) -> Int? {
        guard hay.count >= needle.count else { return nil }
        for i in 0...(hay.count - needle.count) where hay[i] == needle[0] {
            if Array(hay[i..<(i + needle.count)]) == needle { return i }
        }
        return nil
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

/// JSON output helpers for the record file (bytes in, bytes out).
enum JSONOut {
    static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    /// A JSON string of the bytes, or null. The bytes are read as UTF-8: every character is written as itself
    /// (non-ASCII ones as their UTF-8 bytes, which JSON allows), except `"` and `\`, which get a backslash, and
    /// control characters (below U+0020, and DEL), which become `\u00XX`. A byte that is not part of valid
    /// UTF-8 becomes U+FFFD (`\ufffd`), so the record file is always valid UTF-8 JSON.
    static func appendString(_ out: inout [UInt8], _ value: UnsafeRawBufferPointer?) {
        guard let value else { out.append(contentsOf: "null".utf8); return }
        out.append(UInt8(ascii: "\""))
        var bytes = value.makeIterator()
        var decoder = UTF8()
        decoding: while true {
            switch decoder.decode(&bytes) {
            case .scalarValue(let scalar):
                switch scalar.value {
                case 0x22, 0x5C:
                    out.append(UInt8(ascii: "\\"))
                    out.append(UInt8(scalar.value))
                case 0..<0x20, 0x7F:
                    out.append(contentsOf: "\\u00".utf8)
                    out.append(hex[Int(scalar.value >> 4)])
                    out.append(hex[Int(scalar.value & 0xF)])
                default:
                    UTF8.encode(scalar, into: { out.append($0) })
                }
            case .error:
                out.append(contentsOf: "\\ufffd".utf8)
            case .emptyInput:
                break decoding
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Digits as a JSON number; anything else as a string; absent as null.
    static func appendNumberOrString(_ out: inout [UInt8], _ value: UnsafeRawBufferPointer?) {
        if let value, !value.isEmpty, value.count <= 18, value.allSatisfy({ $0 &- 0x30 < 10 }),
            !(value.count > 1 && value[0] == UInt8(ascii: "0"))
        {
            out.append(contentsOf: value)
        } else {
            appendString(&out, value)
        }
    }

    /// A valid JSON text on one line: CR/LF (only possible as whitespace) become spaces.
    static func appendCompactJSON(_ out: inout [UInt8], _ json: UnsafeRawBufferPointer) {
        func isSpace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 }
        var lo = 0, hi = json.count
        while lo < hi, isSpace(json[lo]) { lo += 1 }
        while hi > lo, isSpace(json[hi - 1]) { hi -= 1 }
        for c in json[lo..<hi] {
            out.append(c == 0x0A || c == 0x0D ? 0x20 : c)
        }
    }
}
