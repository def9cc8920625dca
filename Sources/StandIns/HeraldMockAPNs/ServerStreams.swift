// Requests and answers on HTTP/2 streams (called from nghttp2 callbacks on the loop thread): stream faults
// (resets, GOAWAY), the request check and provider-token authorization, injected faults, held answers (latency,
// pauses) and the answer itself.
import CNghttp2
import DequeModule
import Glibc
import HeraldCore

extension MockAPNsServer {
    struct DelayedAnswer {
        /// Monotonic microseconds.
        let due: Int64
        let connection: Connection
        let slot: Int
        let generation: UInt32
        let verdict: MockVerdict
    }

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

    func evaluate(_ conn: Connection, slot: Int) -> MockVerdict {
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

    func authorize(_ conn: Connection, _ authorization: UnsafeRawBufferPointer?) -> MockReason? {
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

    func fireDelayedAnswers() {
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
    func answer(_ conn: Connection, slot: Int, verdict: MockVerdict) {
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

        // A status of the answer table has three digits: room for it up to the apns-id value.
        let status = Int64(min(max(verdict.status, 100), 999))
        let statusLength = DecimalASCII.write(status, endingAt: scratch + Self.statusValue + 3)
        nva[0] = nghttp2_nv(
            name: scratch + Self.statusName, value: scratch + Self.statusValue,
            namelen: 7, valuelen: statusLength, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
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
            RecordLine.append(
                conn.slots[slot], verdict: verdict,
                apnsID: UnsafeRawBufferPointer(start: scratch + Self.apnsIDValue, count: 36), at: nowWallMillis,
                to: &recordBuffer)
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
}
