import CNghttp2
import COpenSSL
import Foundation
import HeraldCore
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The I/O thread of one client: a poll loop over its connections' sockets and a wake-up pipe.
/// Everything but the inbox is confined to that thread.
final class ClientLoop: @unchecked Sendable {
    // @unchecked Sendable: what other threads reach is in `shared`, behind its lock; all other mutable
    // state is only touched by the loop thread (see `run`).
    let config: ConnectionPoolSettings
    /// Where connections go (the pool's override, else the provider's host).
    let endpoint: ServiceEndpoint
    let tls: TLSContext
    /// What the server at the other end speaks (paths, headers, answer table).
    let dialect: H2Dialect
    /// Where the `authorization` header comes from (APNs provider JWTs, FCM access tokens); nil for
    /// certificate auth.
    let tokens: (any BearerSource)?
    let logger: Logger
    let gate: InFlightGate
    private let authority: [UInt8]

    // MARK: inbox (shared with other threads)
    /// What the submitting tasks and the connect threads hand the loop thread, and the counters it publishes.
    private struct Shared {
        var inbox: [Job] = []
        var connectResults: [ConnectResult] = []
        var wakeSignalled = false
        var stopDeadline: ContinuousClock.Instant?
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
        var finished = false
        var stats = PushClientStats()
    }
    /// A connect thread's socket or failure, handed to the loop thread through `shared`.
    /// `@unchecked Sendable`: the connect thread lets go of the socket as it hands it over; from then on only the loop
    /// thread uses it.
    private struct ConnectResult: @unchecked Sendable {
        var prioritizedOnly: Bool
        var result: Result<TLSSocket, PushError>
    }
    private let shared = Mutex(Shared())
    private let wakeRead: Int32
    private let wakeWrite: Int32

    /// Answers fed to nghttp2 between two refills of a connection's streams (about 25 short answers).
    static let readPiece = 1024

    // MARK: loop-confined
    /// The inbox's jobs taken in this pass (swapped with `inbox` under the lock).
    private var taken: [Job] = []
    /// The connect threads' results taken in this pass (swapped with `connectResults` under the lock).
    private var takenConnects: [ConnectResult] = []
    /// HTTP answers taken in this pass, settled (classified, retried or completed) after the pass's writes.
    private var answered: [(Job, Int)] = []
    private var pending = JobQueue()
    private var delayed: [Job] = []
    private var connections: [H2Connection] = []
    /// Connection attempts under way: shared ones, and ones for prioritized requests only.
    private var connecting = 0
    private var connectingPrioritized = 0
    private var nextConnectAt: ContinuousClock.Instant = .now
    private var connectFailuresInARow = 0
    private var nextConnectionID = 0
    private var liveJobs = 0
    private var rng = SystemRandomNumberGenerator()
    /// The earliest moment a timer may be due (a deadline, a retry's backoff, a PING); the loop sleeps until then
    /// unless a socket or the inbox wakes it. Lowered wherever a new timed thing appears.
    private var nextTimers: ContinuousClock.Instant = .now
    private var stopping: ContinuousClock.Instant?
    private var localStats = PushClientStats()
    /// A job and its final answer, to be completed at the end of the pass. A struct, not a tuple: an array of tuples
    /// is destroyed element by element through the runtime's generic tuple witnesses.
    private struct Finished {
        var job: Job
        var response: PushResponse
    }
    private var finishedThisPass: [Finished] = []
    private var bearerCache: (issuedAt: Date, header: [UInt8])?
    private let metrics: APNsMetrics
    private var delivered200 = 0
    /// 200 answers not yet added to `localStats.answersByStatus` (added once per pass, not per answer).
    private var answered200 = 0
    private var answerDeltas: [AnswerKey: Int] = [:]
    private var lastMetricsAt: ContinuousClock.Instant = .now

    /// `tls` is the client context (with an APNs client certificate, or none); `bearer` gives the `authorization`
    /// header (APNs provider JWTs, FCM access tokens, VAPID), nil for certificate authentication.
    init(
        config: ConnectionPoolSettings, endpoint: ServiceEndpoint, tls: TLSContext, logger: Logger,
        dialect: H2Dialect = .apns, bearer: (any BearerSource)? = nil
    ) throws(PushError) {
        self.config = config
        self.endpoint = endpoint
        self.logger = logger
        self.dialect = dialect
        self.tls = tls
        tokens = bearer
        authority = Array((endpoint.port == 443 ? endpoint.host : endpoint.description).utf8)
        gate = InFlightGate(
            limit: config.maxInFlight,
            reserve: Int(Double(config.maxInFlight) * min(0.9, max(0, config.priorityReserve))))
        metrics = APNsMetrics(dimensions: config.metricDimensions, prefix: dialect.metricPrefix)
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw PushError(.io, "pipe: \(String(cString: strerror(errno)))") }
        wakeRead = fds[0]
        wakeWrite = fds[1]
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
    }

    deinit {
        close(wakeRead)
        close(wakeWrite)
    }

    func start() {
        let thread = Thread { [self] in self.run() }
        thread.name = "herald-apns-io"
        thread.start()
    }

    // MARK: called from any thread

    func enqueue(_ jobs: [Job]) {
        let signal = shared.withLock { shared -> Bool? in
            if shared.finished || shared.stopDeadline != nil { return nil }
            shared.inbox.append(contentsOf: jobs)
            let signal = !shared.wakeSignalled
            shared.wakeSignalled = true
            return signal
        }
        guard let signal else {
            for job in jobs {
                job.completion(
                    ClientLoop.response(
                        job, status: nil, failure: .clientShutdown,
                        disposition: .permanentFailure(reason: "ClientShutdown")))
                gate.release(1)
            }
            return
        }
        if signal { wake() }
    }

    /// Accepts a batch for `APNsClient` and `FCMClient` (`path` nil: APNs's `/3/device/<token>`): prioritized
    /// requests first (a batch mixes them only when a caller does), each kind through the in-flight gate of its
    /// kind, as many at a time as it grants. Returns once every request is accepted.
    func submit(
        _ requests: [PushDelivery], path: [UInt8]?, onComplete: @escaping @Sendable (PushResponse) -> Void
    ) async {
        let mixed = requests.contains(where: \.prioritized)
        if mixed { await submit(requests.filter(\.prioritized), prioritized: true, path: path, onComplete: onComplete) }
        let bulk = mixed ? requests.filter { !$0.prioritized } : requests
        await submit(bulk, prioritized: false, path: path, onComplete: onComplete)
    }

    /// Sends one request (to `path`, nil: the request's own) once a slot is free, and waits for its final outcome.
    func send(_ request: PushDelivery, path: [UInt8]? = nil) async -> PushResponse {
        _ = await gate.acquire(upTo: 1, prioritized: request.prioritized)
        return await withCheckedContinuation { continuation in
            enqueue([Job(request: request, path: path) { continuation.resume(returning: $0) }])
        }
    }

    /// Accepts requests of one kind: waits for slots, hands each granted run to the loop in one inbox append.
    private func submit(
        _ requests: [PushDelivery], prioritized: Bool, path: [UInt8]?,
        onComplete: @escaping @Sendable (PushResponse) -> Void
    ) async {
        var index = 0
        while index < requests.count {
            let granted = await gate.acquire(upTo: requests.count - index, prioritized: prioritized)
            var jobs: [Job] = []
            jobs.reserveCapacity(granted)
            for request in requests[index..<(index + granted)] {
                jobs.append(Job(request: request, path: path, completion: onComplete))
            }
            enqueue(jobs)
            index += granted
        }
    }

    /// Asks the loop to stop without waiting (used when the client is dropped).
    func requestStop() {
        shared.withLock { shared in
            if shared.stopDeadline == nil { shared.stopDeadline = .now }
        }
        wake()
    }

    func stop(drainFor grace: Duration) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let finished = shared.withLock { shared -> Bool in
                if shared.finished { return true }
                shared.stopWaiters.append(c)
                if shared.stopDeadline == nil { shared.stopDeadline = .now + grace }
                return false
            }
            if finished { c.resume() } else { wake() }
        }
    }

    var stats: PushClientStats {
        shared.withLock { shared in
            var s = shared.stats
            s.submitted += shared.inbox.count
            s.jwtRenewals = tokens?.renewalCount ?? 0
            return s
        }
    }

    /// Loop thread only: counters are published once per pass (before completions run).
    private func bump(_ change: (inout PushClientStats) -> Void) {
        change(&localStats)
    }

    /// Publishes the counters, then runs the completions gathered in this pass and frees their slots.
    private func deliverCompletions() {
        if answered200 > 0 {
            localStats.answersByStatus[200, default: 0] += answered200
            answered200 = 0
        }
        shared.withLock { $0.stats = localStats }
        let now = ContinuousClock.now
        if now - lastMetricsAt >= .milliseconds(100) || stopping != nil {
            lastMetricsAt = now
            if delivered200 > 0 { answerDeltas[AnswerKey(status: "200", reason: ""), default: 0] += delivered200 }
            delivered200 = 0
            metrics.publish(
                localStats, renewals: tokens?.renewalCount ?? 0, answerDeltas: answerDeltas,
                inFlightNow: liveJobs, openConnections: connections.reduce(0) { $0 + ($1.dead ? 0 : 1) })
            answerDeltas.removeAll(keepingCapacity: true)
        }
        guard !finishedThisPass.isEmpty else { return }
        // Completions only resume or signal their callers; none of them reaches back into this loop.
        for done in finishedThisPass { done.job.completion(done.response) }
        gate.release(finishedThisPass.count)
        finishedThisPass.removeAll(keepingCapacity: true)
    }

    private func wake() {
        var one: UInt8 = 1
        _ = write(wakeWrite, &one, 1)
    }

    // MARK: the loop

    private func run() {
        let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 * 1024, alignment: 16)
        defer { readBuffer.deallocate() }
        var fds: [pollfd] = []
        var polled: [H2Connection] = []
        var sink = [UInt8](repeating: 0, count: 256)
        while true {
            fds.removeAll(keepingCapacity: true)
            polled.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            // Connections kept for prioritized requests are read first (their answers complete in this pass even
            // when a bulk connection brings thousands).
            for c in connections where !c.dead && c.prioritizedOnly { watch(c, in: &fds, &polled) }
            for c in connections where !c.dead && !c.prioritizedOnly { watch(c, in: &fds, &polled) }
            // Sleep until a socket or the inbox has something, or the next timer is due: no fixed tick.
            _ = poll(&fds, nfds_t(fds.count), pollTimeout(now: .now))

            if fds[0].revents != 0 {
                while read(wakeRead, &sink, sink.count) > 0 {}
            }
            takeInbox()
            var now = ContinuousClock.now
            for (i, c) in polled.enumerated() where fds[i + 1].revents != 0 && !c.dead {
                // The streams its answers free are refilled and written piece by piece: the server works on them
                // while the rest of its answers, the other connections and this pass's completions are handled.
                let failure = c.readAvailable(into: readBuffer, piece: Self.readPiece) {
                    dispatch(now: now)
                    flush(c, readBuffer)
                }
                if let failure {
                    kill(c, why: failure)
                    continue
                }
                dispatch(now: now)
                flush(c, readBuffer)
            }
            now = ContinuousClock.now
            if now >= nextTimers { nextTimers = runTimers(now: now) }
            maintainConnections(now: now)
            dispatch(now: now)
            for c in connections where !c.dead { flush(c, readBuffer) }
            // Answers are classified and their callers' responses made after the writes (off the round trip).
            if settleAnswers() {
                dispatch(now: now)
                for c in connections where !c.dead { flush(c, readBuffer) }
            }
            if connections.contains(where: \.dead) { connections.removeAll { $0.dead } }
            deliverCompletions()
            if let stopping, liveJobs == 0 || ContinuousClock.now >= stopping {
                shutdownNow()
                return
            }
        }
    }

    /// Writes what `c` has to send; kills it when the write fails, retires it when a GOAWAY left it nothing to do.
    private func flush(_ c: H2Connection, _ readBuffer: UnsafeMutableRawBufferPointer) {
        if let failure = c.flush() {
            // The peer may have answered and closed while we wrote: take in what it sent before the close,
            // so those streams complete with their answers instead of failing (and being sent twice).
            _ = c.readAvailable(into: readBuffer)
            kill(c, why: failure)
            return
        }
        // After GOAWAY, once its last stream is done the connection has nothing left to do.
        if c.goawayReceived && c.streams.isEmpty { retire(c) }
    }

    /// Settles the HTTP answers taken in this pass (`answered`); returns true when one put its request back at the
    /// head of the queue (a renewed credential), so the pass writes it now instead of at the next wake-up.
    private func settleAnswers() -> Bool {
        guard !answered.isEmpty else { return false }
        let queued = pending.count
        for (job, status) in answered { finishAttempt(job, status: status) }
        answered.removeAll(keepingCapacity: true)
        return pending.count > queued
    }

    private func watch(_ c: H2Connection, in fds: inout [pollfd], _ polled: inout [H2Connection]) {
        var events = Int16(POLLIN)
        if c.wantsWritable { events |= Int16(POLLOUT) }
        fds.append(pollfd(fd: c.socket.fd, events: events, revents: 0))
        polled.append(c)
    }

    /// Milliseconds `poll` may sleep: until the next timer, the stop deadline, or the next connection attempt when
    /// the pool is short of connections; at most a second.
    private func pollTimeout(now: ContinuousClock.Instant) -> Int32 {
        var wakeAt = min(nextTimers, now + .seconds(1))
        if let stopping { wakeAt = min(wakeAt, stopping) }
        if stopping == nil, connectionsShort { wakeAt = min(wakeAt, nextConnectAt) }
        guard wakeAt > now else { return 0 }
        // Rounded up, so the loop does not wake a little early and sleep again.
        return Int32(((wakeAt - now).microseconds + 999) / 1000)
    }

    /// Fewer connections open or opening than configured (shared or prioritized-only).
    private var connectionsShort: Bool {
        let (shared, prioritized) = usableConnections
        return shared < config.connections || prioritized < config.priorityConnections
    }

    /// Connections that take new streams or are being opened: shared ones, and ones for prioritized requests only.
    private var usableConnections: (shared: Int, prioritized: Int) {
        var shared = connecting
        var prioritized = connectingPrioritized
        for c in connections where c.acceptsNewStreams {
            if c.prioritizedOnly { prioritized += 1 } else { shared += 1 }
        }
        return (shared, prioritized)
    }

    private func takeInbox() {
        // Swapped with the loop's own arrays, so no buffer is copied or reallocated.
        let stopAt = shared.withLock { shared in
            swap(&shared.inbox, &taken)
            swap(&shared.connectResults, &takenConnects)
            shared.wakeSignalled = false
            return shared.stopDeadline
        }
        if stopping == nil, let stopAt { stopping = stopAt }
        liveJobs += taken.count
        localStats.submitted += taken.count
        for job in taken {
            pending.append(job)
            if job.request.deadline < nextTimers { nextTimers = job.request.deadline }
        }
        taken.removeAll(keepingCapacity: true)
        for connect in takenConnects {
            let (prioritizedOnly, result) = (connect.prioritizedOnly, connect.result)
            if prioritizedOnly { connectingPrioritized -= 1 } else { connecting -= 1 }
            switch result {
            case .success(let socket):
                do {
                    let c = try H2Connection(id: nextConnectionID, socket: socket, loop: self)
                    c.prioritizedOnly = prioritizedOnly
                    nextTimers = min(nextTimers, c.lastReceive + config.pingInterval)
                    nextConnectionID += 1
                    connections.append(c)
                    bump { $0.connectionsOpened += 1 }
                    logger.debug(
                        "apns connection open",
                        metadata: ["connection": "\(c.id)", "prioritized_only": "\(prioritizedOnly)"])
                } catch {
                    connectFailed(error.description)
                }
            case .failure(let error):
                connectFailed(error.description)
            }
        }
        takenConnects.removeAll(keepingCapacity: true)
    }

    private func connectFailed(_ why: String) {
        connectFailuresInARow += 1
        nextConnectAt = .now + config.reconnectBackoff.delay(afterAttempt: connectFailuresInARow, using: &rng)
        bump { $0.connectFailures += 1 }
        logger.warning(
            "apns connect failed", metadata: ["error": "\(why)", "failures_in_a_row": "\(connectFailuresInARow)"])
        // With nothing usable and nothing on the way, waiting requests count a failed attempt.
        if !connections.contains(where: { $0.acceptsNewStreams }) && connecting + connectingPrioritized == 0 {
            while let job = pending.popFirst() { finishAttempt(job, failure: .connectFailed(why)) }
        }
    }

    private func maintainConnections(now: ContinuousClock.Instant) {
        guard stopping == nil, now >= nextConnectAt else { return }
        let (shared, prioritized) = usableConnections
        for _ in shared..<max(shared, config.connections) { connect(prioritizedOnly: false) }
        for _ in prioritized..<max(prioritized, config.priorityConnections) { connect(prioritizedOnly: true) }
    }

    /// Opens one connection on a thread of its own (the TLS handshake blocks); the loop takes it from the inbox.
    private func connect(prioritizedOnly: Bool) {
        if prioritizedOnly { connectingPrioritized += 1 } else { connecting += 1 }
        let tls = self.tls
        let timeout = config.connectTimeout
        let thread = Thread { [self] in
            let result: Result<TLSSocket, PushError>
            do throws(PushError) {
                result = .success(try TLSSocket.connect(endpoint: endpoint, context: tls, timeout: timeout))
            } catch { result = .failure(error) }
            let connect = ConnectResult(prioritizedOnly: prioritizedOnly, result: result)
            self.shared.withLock { $0.connectResults.append(connect) }
            self.wake()
        }
        thread.name = "herald-apns-connect"
        thread.start()
    }

    private func dispatch(now: ContinuousClock.Instant) {
        guard !pending.isEmpty else { return }
        var bearer: (token: String, issuedAt: Date)?
        if let tokens {
            do { bearer = try tokens.currentBearer() } catch {
                while let job = pending.popFirst() { finishAttempt(job, failure: .credentialUnusable(error.message)) }
                return
            }
            // No token yet (an FCM access token is being fetched): requests wait, their deadlines running, and
            // the loop looks again in 10 ms (the token source does not signal the loop).
            if bearer == nil {
                nextTimers = min(nextTimers, now + .milliseconds(10))
                return
            }
        }
        var bearerHeader: [UInt8]?
        if let bearer {
            if bearerCache?.issuedAt != bearer.issuedAt || bearerCache == nil {
                bearerCache = (bearer.issuedAt, Array((tokens?.scheme ?? "bearer ").utf8) + Array(bearer.token.utf8))
            }
            bearerHeader = bearerCache?.header
        }
        // Prioritized requests first go to the connections only they use.
        for c in connections where c.acceptsNewStreams && c.prioritizedOnly {
            var room = min(c.remoteMaxStreams, config.maxStreamsPerConnection) - c.streams.count
            while room > 0, pending.nextIsPrioritized == true, let job = pending.popFirst() {
                guard let written = start(job, on: c, now: now, bearer: bearer?.issuedAt, bearerHeader: bearerHeader)
                else { continue }
                if !written { break }
                room -= 1
            }
        }
        for c in connections where c.acceptsNewStreams && !c.prioritizedOnly {
            let limit = min(c.remoteMaxStreams, config.maxStreamsPerConnection)
            var room = limit - c.streams.count
            // Streams kept for prioritized requests: a bulk job starts only below `bulkLimit`.
            let bulkLimit = limit - Int(Double(limit) * min(0.9, max(0, config.priorityReserve)))
            while room > 0 {
                if pending.nextIsPrioritized == false, limit - room >= bulkLimit { break }
                guard let job = pending.popFirst() else { break }
                guard let written = start(job, on: c, now: now, bearer: bearer?.issuedAt, bearerHeader: bearerHeader)
                else { continue }
                if !written { break }
                room -= 1
            }
            if pending.isEmpty { break }
        }
    }

    /// Writes `job` on `c`: true when written, false when the connection took no new stream (the job is back at the
    /// front of the queue), nil when its deadline had passed (answered `deadlineExceeded`, no stream used).
    private func start(
        _ job: Job, on c: H2Connection, now: ContinuousClock.Instant, bearer issuedAt: Date?, bearerHeader: [UInt8]?
    ) -> Bool? {
        if job.request.deadline <= now {
            complete(
                job, status: nil, failure: .deadlineExceeded, disposition: .permanentFailure(reason: "DeadlineExceeded")
            )
            return nil
        }
        job.resetAttempt()
        job.bearerIssuedAt = issuedAt
        guard c.submit(job, authority: authority, bearer: bearerHeader) != nil else {
            pending.pushFront(job)
            return false
        }
        if c.prioritizedOnly { bump { $0.streamsOnPriorityConnections += 1 } }
        return true
    }

    /// Runs what is due (retries whose backoff passed, deadlines, PINGs) and returns when the next timer is due.
    private func runTimers(now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        var next = now + .seconds(3600)
        // Retries whose backoff has passed go back in the queue.
        if !delayed.isEmpty {
            var waiting: [Job] = []
            for job in delayed {
                if let at = job.notBefore, at > now {
                    waiting.append(job)
                    next = min(next, at)
                } else {
                    pending.append(job)
                }
            }
            delayed = waiting
        }
        // Deadlines of queued requests.
        if !pending.isEmpty {
            for job in pending.removeAll(where: { $0.request.deadline <= now }) {
                complete(
                    job, status: nil, failure: .deadlineExceeded,
                    disposition: .permanentFailure(reason: "DeadlineExceeded"))
            }
            next = min(next, pending.earliestDeadline ?? next)
        }
        for c in connections where !c.dead {
            // Deadlines of requests in flight: cancel the stream, answer the caller now.
            for (streamID, job) in c.streams where !job.completed {
                if job.request.deadline <= now {
                    c.cancel(streamID: streamID)
                    complete(
                        job, status: nil, failure: .deadlineExceeded,
                        disposition: .permanentFailure(reason: "DeadlineExceeded"))
                } else {
                    next = min(next, job.request.deadline)
                }
            }
            // Keepalive.
            if let sent = c.pingSentAt {
                if now - sent > config.pingTimeout {
                    bump { $0.connectionsReplacedAfterPing += 1 }
                    kill(c, why: "PING unanswered for \(config.pingTimeout)")
                } else {
                    next = min(next, sent + config.pingTimeout + .milliseconds(1))
                }
            } else if now - c.lastReceive > config.pingInterval {
                c.sendPing()
                bump { $0.pingsSent += 1 }
                next = min(next, now + config.pingTimeout + .milliseconds(1))
            } else {
                next = min(next, c.lastReceive + config.pingInterval + .milliseconds(1))
            }
        }
        return next
    }

    // MARK: events from connections

    func noteStreamOpened() { bump { $0.streamsOpened += 1 } }

    func noteSettings(_ c: H2Connection) {
        let m = c.remoteMaxStreams
        bump { $0.maxConcurrentStreamsSeen = max($0.maxConcurrentStreamsSeen, m) }
    }

    func noteGoaway(_ c: H2Connection, lastStreamID: Int32, errorCode: UInt32) {
        bump { $0.goawaysReceived += 1 }
        logger.info(
            "apns GOAWAY",
            metadata: [
                "connection": "\(c.id)", "last_stream_id": "\(lastStreamID)",
                "error_code": "\(errorCode)",
            ])
    }

    func streamClosed(_ job: Job, on c: H2Connection, errorCode: UInt32) {
        guard !job.completed else { return }
        if let status = job.status, errorCode == NGHTTP2_NO_ERROR.rawValue || !job.body.isEmpty || status == 200 {
            if !c.answeredOnce {
                c.answeredOnce = true
                connectFailuresInARow = 0
            }
            answered.append((job, status))
        } else if errorCode == NGHTTP2_REFUSED_STREAM.rawValue || !job.headersSent {
            // Not processed by the server (REFUSED_STREAM, or above a GOAWAY's last-stream-id): resend.
            resend(job)
        } else {
            finishAttempt(job, failure: .streamReset(errorCode: errorCode))
        }
    }

    private func resend(_ job: Job) {
        bump { $0.resends += 1 }
        pending.pushFront(job)
    }

    /// The connection is unusable: streams that were never written are resent, the others lost
    /// in flight count as a failed attempt.
    private func kill(_ c: H2Connection, why: String) {
        guard !c.dead else { return }
        c.dead = true
        let level: Logger.Level = c.goawayReceived && c.streams.isEmpty ? .debug : .warning
        logger.log(
            level: level, "apns connection closed",
            metadata: [
                "connection": "\(c.id)", "why": "\(why)",
                "in_flight": "\(c.streams.count)",
            ])
        let jobs = c.streams.sorted { $0.key < $1.key }.map(\.value)
        c.streams.removeAll()
        c.releaseSession()
        if !c.answeredOnce {
            connectFailuresInARow += 1
            nextConnectAt = .now + config.reconnectBackoff.delay(afterAttempt: connectFailuresInARow, using: &rng)
        }
        for job in jobs where !job.completed {
            if job.headersSent { finishAttempt(job, failure: .connectionLost) } else { resend(job) }
        }
    }

    private func retire(_ c: H2Connection) {
        c.dead = true
        c.releaseSession()
        logger.debug("apns connection retired after GOAWAY", metadata: ["connection": "\(c.id)"])
    }

    // MARK: outcomes

    private func finishAttempt(_ job: Job, status: Int) {
        if case .fcm = dialect { finishFCMAttempt(job, status: status); return }
        if case .webpush = dialect { finishWebPushAttempt(job, status: status); return }
        job.attempts += 1
        if status == 200 {
            // The common answer: counted without a dictionary update per request.
            answered200 += 1
            delivered200 += 1
            let answer = APNsAnswerTable.classify(status: 200, reason: nil, timestamp: nil)
            if answer == .delivered {
                complete(job, status: 200, failure: nil, disposition: .delivered)
                return
            }
        } else {
            bump { $0.answersByStatus[status, default: 0] += 1 }
        }
        var reason: APNsReason?
        var timestamp: Int64?
        if status != 200, !job.body.isEmpty, let object = try? JSONValue.parse(job.body) {
            if let text = object["reason"]?.stringValue { reason = APNsReason(wire: text) }
            timestamp = object["timestamp"]?.int64Value
        }
        let answer = APNsAnswerTable.classify(status: status, reason: reason, timestamp: timestamp)
        if status != 200 {
            answerDeltas[AnswerKey(status: String(status), reason: reason?.wire ?? ""), default: 0] += 1
        }
        if answer == .renewCredentials, let tokens, let issued = job.bearerIssuedAt,
            job.attempts < config.retry.maxAttempts, job.request.deadline > ContinuousClock.now
        {
            if (try? tokens.rejected(issuedAt: issued)) == true {
                bump { $0.retries += 1 }
                job.noteRetry(status: status, reason: "renew credentials: \(reason?.wire ?? "HTTP \(status)")")
                pending.pushFront(job)
                return
            }
        }
        let text = reason?.wire ?? "HTTP \(status)"
        let disposition = retryDisposition(job, answer: answer, text: text)
        if scheduleRetry(job, disposition, status: status, reason: text) { return }
        complete(job, status: status, reason: reason, timestamp: timestamp, failure: nil, disposition: disposition)
    }

    /// What the retry policy makes of an answer to `job`'s latest attempt (a retry's wait randomised).
    private func retryDisposition(_ job: Job, answer: PushAnswerClass, text: String) -> PushDisposition {
        config.retry.disposition(
            for: answer, reasonText: text, attempt: job.attempts,
            unit: answer == .retryable ? Double.random(in: 0..<1, using: &rng) : 0)
    }

    /// Counts an HTTP answer of FCM or a push service (`ok`: delivered; `reason`: the answer's reason text).
    private func countAnswer(status: Int, ok: Bool, reason: String) {
        if ok {
            answered200 += 1
            delivered200 += 1
        } else {
            bump { $0.answersByStatus[status, default: 0] += 1 }
            answerDeltas[AnswerKey(status: String(status), reason: reason), default: 0] += 1
        }
    }

    /// Retries or completes `job` after an HTTP answer of FCM or a push service: `disposition`, else the retry
    /// policy's, with a retry waiting as long as a `Retry-After` that asks for more than the backoff.
    private func settleAnswer(
        _ job: Job, status: Int, answer: PushAnswerClass, text: String, disposition given: PushDisposition? = nil,
        messageName: String? = nil
    ) {
        let retryAfter = FCMAnswerTable.retryAfter(job.retryAfter)
        var disposition = given ?? retryDisposition(job, answer: answer, text: text)
        if case .retry(let after) = disposition, let retryAfter, retryAfter > after {
            disposition = .retry(after: retryAfter)
        }
        if scheduleRetry(job, disposition, status: status, reason: text) { return }
        complete(
            job, status: status, failure: nil, disposition: disposition, reasonText: text, answer: answer,
            retryAfter: retryAfter, messageName: messageName)
    }

    /// An answer of FCM's `messages:send`, classified by HeraldCore's FCM table. 401 renews the access
    /// token once (the request waits for the new one), a second 401 is permanent; 429 and 503 honour
    /// `Retry-After` when it asks for more than the backoff.
    private func finishFCMAttempt(_ job: Job, status: Int) {
        job.attempts += 1
        let body = status == 200 ? nil : FCMErrorBody.parse(job.body)
        let answer = FCMAnswerTable.classify(status: status, body: body)
        let text = body.map(\.reasonText).flatMap { $0.isEmpty ? nil : $0 } ?? (status == 200 ? "" : "HTTP \(status)")
        countAnswer(status: status, ok: status == 200, reason: text)
        if answer == .renewCredentials, !job.renewedCredentials, let tokens, let issued = job.bearerIssuedAt,
            job.request.deadline > ContinuousClock.now
        {
            job.renewedCredentials = true
            job.attempts -= 1  // the renewal does not count as an attempt
            _ = try? tokens.rejected(issuedAt: issued)
            bump { $0.retries += 1 }
            job.noteRetry(status: status, reason: "renew credentials: \(text)")
            pending.pushFront(job)
            return
        }
        // A traced request's span shows the message name FCM gave it; the others' 200s are not parsed.
        var messageName: String?
        if status == 200, job.request.traced, case .string(let name)? = (try? JSONValue.parse(job.body))?["name"] {
            messageName = name
        }
        settleAnswer(
            job, status: status, answer: answer, text: text,
            disposition: answer == .renewCredentials
                ? .permanentFailure(reason: "\(text) after renewing the access token") : nil,
            messageName: messageName)
    }

    /// An answer of a push service, classified by HeraldCore's Web Push table: 201 delivered, 404/410 the
    /// subscription is gone, 429 and 5xx retried (honouring `Retry-After` when it asks for more than the backoff),
    /// 400/401/403/413 and the rest permanent with the push service's reason.
    private func finishWebPushAttempt(_ job: Job, status: Int) {
        job.attempts += 1
        let ok = (200..<300).contains(status)
        let answer = WebPushAnswerTable.classify(status: status)
        var text = WebPushAnswerTable.reasonText(status: status)
        countAnswer(status: status, ok: ok, reason: text)
        if !ok {
            // The push service's own words (RFC 7807 problem details or text), cut short, for the DLQ.
            let said = WebPushAnswerTable.detail(job.body)
            if !said.isEmpty { text += ": " + said }
        }
        settleAnswer(job, status: status, answer: answer, text: text)
    }

    private func finishAttempt(_ job: Job, failure: PushTransportFailure) {
        job.attempts += 1
        bump { $0.transportFailures += 1 }
        answerDeltas[AnswerKey(status: "none", reason: failure.kind), default: 0] += 1
        let disposition = config.retry.disposition(
            for: APNsAnswerTable.classify(failure), reasonText: failure.description,
            attempt: job.attempts, unit: Double.random(in: 0..<1, using: &rng))
        if scheduleRetry(job, disposition, status: nil, reason: failure.kind) { return }
        complete(job, status: nil, failure: failure, disposition: disposition)
    }

    /// Schedules `job` again when `disposition` says retry and its deadline allows; `status` and `reason` are the
    /// answer retried, noted for a traced request's span.
    private func scheduleRetry(_ job: Job, _ disposition: PushDisposition, status: Int?, reason: String) -> Bool {
        guard case .retry(let after) = disposition, stopping == nil else { return false }
        let at = ContinuousClock.now + after
        guard at < job.request.deadline else { return false }
        job.notBefore = at
        delayed.append(job)
        nextTimers = min(nextTimers, at)
        bump { $0.retries += 1 }
        job.noteRetry(status: status, reason: reason)
        return true
    }

    private func complete(
        _ job: Job, status: Int?, reason: APNsReason? = nil, timestamp: Int64? = nil,
        failure: PushTransportFailure?, disposition: PushDisposition, reasonText: String? = nil,
        answer: PushAnswerClass? = nil, retryAfter: Duration? = nil, messageName: String? = nil
    ) {
        guard !job.completed else { return }
        job.completed = true
        liveJobs -= 1
        if failure == .deadlineExceeded { bump { $0.deadlinesExceeded += 1 } }
        var response = ClientLoop.response(job, status: status, failure: failure, disposition: disposition)
        response.reason = reason
        response.unregisteredAt = timestamp
        response.reasonText = reasonText ?? reason?.wire
        response.answer = answer
        response.retryAfter = retryAfter
        response.messageName = messageName
        response.retries = job.retries
        bump { $0.completed += 1 }
        finishedThisPass.append(Finished(job: job, response: response))
    }

    static func response(
        _ job: Job, status: Int?, failure: PushTransportFailure?,
        disposition: PushDisposition
    ) -> PushResponse {
        PushResponse(
            tag: job.request.tag, status: status, reason: nil,
            apnsID: job.answeredAPNsID ?? job.request.apnsID, unregisteredAt: nil,
            transportFailure: failure, disposition: disposition, attempts: job.attempts)
    }

    private func shutdownNow() {
        for c in connections where !c.dead {
            let jobs = Array(c.streams.values)
            c.streams.removeAll()
            c.dead = true
            c.releaseSession()
            for job in jobs {
                complete(
                    job, status: nil, failure: .clientShutdown, disposition: .permanentFailure(reason: "ClientShutdown")
                )
            }
        }
        connections.removeAll()
        while let job = pending.popFirst() {
            complete(
                job, status: nil, failure: .clientShutdown, disposition: .permanentFailure(reason: "ClientShutdown"))
        }
        for job in delayed {
            complete(
                job, status: nil, failure: .clientShutdown, disposition: .permanentFailure(reason: "ClientShutdown"))
        }
        delayed.removeAll()
        let (late, waiters) = shared.withLock { shared in
            shared.finished = true
            let late = shared.inbox
            shared.inbox.removeAll()
            let waiters = shared.stopWaiters
            shared.stopWaiters.removeAll()
            return (late, waiters)
        }
        for job in late {
            liveJobs += 1
            complete(
                job, status: nil, failure: .clientShutdown, disposition: .permanentFailure(reason: "ClientShutdown"))
        }
        deliverCompletions()
        for w in waiters { w.resume() }
    }
}
