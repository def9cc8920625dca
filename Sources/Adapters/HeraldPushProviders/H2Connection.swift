import CNghttp2
import COpenSSL
import Foundation
import HeraldCore
import HeraldTLS

/// One HTTP/2 connection: a TLS socket and an nghttp2 client session, owned here and freed
/// in `close()`/deinit. Used only on its client's I/O thread.
final class H2Connection {
    let id: Int
    let socket: TLSSocket
    private(set) var session: OpaquePointer?
    unowned let loop: ClientLoop
    /// Streams opened on this connection and not yet closed; keeps each job alive while nghttp2
    /// holds an unretained pointer to it (stream user data and data source).
    var streams: [Int32: Job] = [:]
    /// Kept for prioritized requests only (`ConnectionPoolSettings.priorityConnections`): no bulk request is
    /// written to it, so a call never queues behind a fan-out's frames, in our buffers, the socket's or the server's.
    var prioritizedOnly = false
    var goawayReceived = false
    /// The per-request APNs fields whose names this connection has put in its HPACK table, one bit each
    /// (`PerRequestName`).
    private var namesInTable: UInt8 = 0
    var dead = false
    var answeredOnce = false
    var lastReceive: ContinuousClock.Instant = .now
    var pingSentAt: ContinuousClock.Instant?
    /// Bytes gathered from nghttp2 for the socket (`outOffset..<outCount` not yet written).
    private var out = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
    private var outOffset = 0
    private var outCount = 0
    private(set) var wantsWritable = false

    init(id: Int, socket: TLSSocket, loop: ClientLoop) throws(PushError) {
        self.id = id
        self.socket = socket
        self.loop = loop
        var callbacks: OpaquePointer? = nil
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else {
            throw PushError(.io, "nghttp2_session_callbacks_new failed")
        }
        defer { nghttp2_session_callbacks_del(callbacks) }
        H2Connection.install(callbacks)
        var option: OpaquePointer? = nil
        guard nghttp2_option_new(&option) == 0, let option else { throw PushError(.io, "nghttp2_option_new failed") }
        defer { nghttp2_option_del(option) }
        // Until the server's SETTINGS arrive, assume one stream (APNs starts token-auth connections at 1).
        nghttp2_option_set_peer_max_concurrent_streams(option, 1)
        // No HTTP messaging checks on answers (nghttp2 validating every header name and value byte was a tenth of
        // the client's CPU): frames and HPACK are still checked, and the three headers read here are parsed with
        // care (`:status` digits only, a final status only; the others as text).
        nghttp2_option_set_no_http_messaging(option, 1)
        var s: OpaquePointer? = nil
        let me = Unmanaged.passUnretained(self).toOpaque()
        guard nghttp2_session_client_new2(&s, callbacks, me, option) == 0, let s else {
            throw PushError(.io, "nghttp2_session_client_new failed")
        }
        session = s
        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: 100),
        ]
        nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        nghttp2_session_set_local_window_size(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, 16 << 20)
    }

    deinit {
        releaseSession()
        out.deallocate()
    }

    func releaseSession() {
        if let session { nghttp2_session_del(session) }
        session = nil
    }

    /// The server's current SETTINGS_MAX_CONCURRENT_STREAMS (1 until its SETTINGS arrive).
    var remoteMaxStreams: Int {
        guard let session else { return 0 }
        return Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
    }

    var acceptsNewStreams: Bool { !dead && !goawayReceived && session != nil }

    // MARK: Reading

    /// Reads everything the socket has and feeds it to nghttp2, `piece` bytes at a time (OpenSSL reads ahead, so a
    /// small piece costs no extra system call), calling `afterPiece` after each: the loop refills and writes the
    /// streams a piece's answers freed while the rest is still to be read. Returns a failure when the connection
    /// is finished.
    func readAvailable(
        into buffer: UnsafeMutableRawBufferPointer, piece: Int = Int.max, afterPiece: () -> Void = {}
    ) -> String? {
        guard let session else { return "no session" }
        var received = false
        defer { if received { lastReceive = .now } }
        let size = Int32(min(piece, buffer.count))
        while true {
            ERR_clear_error()
            let n = SSL_read(socket.ssl, buffer.baseAddress, size)
            if n > 0 {
                received = true
                let used = nghttp2_session_mem_recv(
                    session, buffer.baseAddress?.assumingMemoryBound(to: UInt8.self), Int(n))
                if used < 0 { return "HTTP/2 protocol error: \(String(cString: nghttp2_strerror(Int32(used))))" }
                if dead { return "closed" }
                afterPiece()
                // The write in `afterPiece` may have found the connection broken.
                if dead || self.session == nil { return "closed" }
                continue
            }
            let error = SSL_get_error(socket.ssl, n)
            switch error {
            case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: return nil
            case SSL_ERROR_ZERO_RETURN: return "server closed the connection"
            case SSL_ERROR_SYSCALL:
                return errno == 0 ? "server closed the connection" : "read failed: \(String(cString: strerror(errno)))"
            default: return "TLS error: \(openSSLErrors())"
            }
        }
    }

    // MARK: Writing (one SSL_write per loop pass)

    /// Gathers what nghttp2 wants to send (up to the buffer's 1 MB) and writes it with one SSL_write; what the
    /// socket did not take is written first on the next call.
    func flush() -> String? {
        guard let session else { return "no session" }
        var offset = outOffset
        var count = outCount
        if offset >= count {
            offset = 0
            count = 0
            while count < out.count {
                var chunk: UnsafePointer<UInt8>? = nil
                let n = nghttp2_session_mem_send(session, &chunk)
                if n < 0 { return "HTTP/2 send error: \(String(cString: nghttp2_strerror(Int32(n))))" }
                guard n > 0, let chunk else { break }
                if count + n > out.count {
                    // A frame larger than the room left (not with these frame sizes): grow rather than drop it.
                    let larger = UnsafeMutableRawBufferPointer.allocate(byteCount: 2 * (count + n), alignment: 16)
                    larger.copyMemory(from: UnsafeRawBufferPointer(rebasing: out[0..<count]))
                    out.deallocate()
                    out = larger
                }
                (out.baseAddress! + count).copyMemory(from: chunk, byteCount: n)
                count += n
            }
        }
        defer {
            outOffset = offset
            outCount = count
        }
        wantsWritable = false
        guard offset < count else { return nil }
        ERR_clear_error()
        let n = SSL_write(socket.ssl, out.baseAddress! + offset, Int32(count - offset))
        if n > 0 {
            offset += Int(n)
            if offset < count { wantsWritable = true }
            return nil
        }
        switch SSL_get_error(socket.ssl, n) {
        case SSL_ERROR_WANT_WRITE, SSL_ERROR_WANT_READ:
            wantsWritable = true
            return nil
        default:
            return "write failed: \(errno != 0 ? String(cString: strerror(errno)) : openSSLErrors())"
        }
    }

    // MARK: Streams

    /// Submits one request. Returns the stream id, or nil when this connection cannot open more streams.
    func submit(_ job: Job, authority: [UInt8], bearer: [UInt8]?) -> Int32? {
        guard let session else { return nil }
        let r = job.request
        // The header block is written on the stack: values into one byte buffer, names and values pointed at by an
        // nghttp2_nv array; nghttp2 copies both before `nghttp2_submit_request` returns.
        // Room for every value: the fixed ones (method, scheme, content-type) and three numbers fit in the 160.
        var bytes = 160 + authority.count + (bearer?.count ?? 0) + r.pushType.rawValue.utf8.count
        bytes += job.path?.count ?? (10 + r.deviceToken.utf8.count)
        bytes += r.topic.utf8.count + (r.collapseID?.utf8.count ?? 0) + (r.apnsID?.utf8.count ?? 0)
        let jobPointer = Unmanaged.passUnretained(job).toOpaque()
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: jobPointer),
            read_callback: { _, _, buf, length, flags, source, _ in
                guard let raw = source?.pointee.ptr, let buf, let flags else { return 0 }
                let job = Unmanaged<Job>.fromOpaque(raw).takeUnretainedValue()
                return job.request.payload.withUnsafeBufferPointer { payload in
                    let n = min(length, payload.count - job.bodyOffset)
                    if n > 0 {
                        buf.update(from: payload.baseAddress! + job.bodyOffset, count: n)
                        job.bodyOffset += n
                    }
                    if job.bodyOffset >= payload.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
                    return n
                }
            })
        let dialect = loop.dialect
        if case .webpush = dialect { bytes += 96 }  // content-type, content-encoding, TTL, urgency
        let streamID = withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: 16) { nva in
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: bytes) { buffer in
                var block = HeaderBlock(fields: nva, bytes: buffer)
                block.add(":method", "POST")
                block.add(":scheme", "https")
                // A value that differs from request to request is kept out of the 4 KB HPACK table: there it would
                // push out the fields every request repeats (authority, topic, push type, priority), which would then
                // be sent again in full. The first value of each APNs field is indexed, so that later ones send the
                // field's name as an index (`:path` and `content-length` are in HPACK's static table). nghttp2 never
                // indexes `authorization`: the bearer token goes out in full with every request.
                if let path = job.path {
                    block.add(":path", path, indexed: false)
                } else if case .webpush = dialect {
                    // A Web Push delivery's device token is its endpoint's path (and query) at this origin.
                    block.add(":path", r.deviceToken, indexed: false)
                } else {
                    block.add(":path", "/3/device/", r.deviceToken, indexed: false)
                }
                block.add(":authority", authority)
                if let bearer { block.add("authorization", bearer) }
                switch dialect {
                case .apns:
                    block.add("apns-topic", r.topic)
                    block.add("apns-push-type", r.pushType.rawValue)
                    if let p = r.priority { block.add("apns-priority", decimal: Int64(p.rawValue)) }
                    if let e = r.expiration {
                        block.add("apns-expiration", decimal: e, indexed: firstValue(of: .expiration))
                    }
                    if let c = r.collapseID { block.add("apns-collapse-id", c, indexed: firstValue(of: .collapseID)) }
                    if let id = r.apnsID { block.add("apns-id", id, indexed: firstValue(of: .apnsID)) }
                case .fcm:
                    block.add("content-type", "application/json; charset=UTF-8")
                case .webpush:
                    block.add("content-type", "application/octet-stream")
                    block.add("content-encoding", "aes128gcm")
                    // TTL: the seconds left until the notification's expiration (0: deliver now or never).
                    let now = Int64(Date().timeIntervalSince1970)
                    block.add("ttl", decimal: max(0, (r.expiration ?? now) - now), indexed: false)
                    let urgency: String =
                        switch r.priority {
                        case .immediately?: "high"
                        case .low?: "low"
                        default: "normal"
                        }
                    block.add("urgency", urgency)
                    if let topic = r.collapseID { block.add("topic", topic, indexed: false) }
                }
                block.add("content-length", decimal: Int64(r.payload.count), indexed: false)
                return nghttp2_submit_request(session, nil, nva.baseAddress, block.count, &provider, jobPointer)
            }
        }
        guard streamID > 0 else {
            // Stream ids exhausted or the session is going away: open no more streams here.
            goawayReceived = true
            return nil
        }
        streams[streamID] = job
        return streamID
    }

    /// The APNs fields whose values differ from request to request.
    private enum PerRequestName: UInt8 {
        case expiration = 1
        case collapseID = 2
        case apnsID = 4
    }

    /// True the first time the connection sends `name` (the value then goes into the HPACK table with its name).
    private func firstValue(of name: PerRequestName) -> Bool {
        defer { namesInTable |= name.rawValue }
        return namesInTable & name.rawValue == 0
    }

    /// Cancels a stream whose deadline passed; the job stays referenced until nghttp2 closes it.
    func cancel(streamID: Int32) {
        guard let session else { return }
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_CANCEL.rawValue)
    }

    func sendPing() {
        guard let session else { return }
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        pingSentAt = .now
    }

    // MARK: nghttp2 callbacks (run inside mem_recv / mem_send on the I/O thread)

    private static func install(_ cbs: OpaquePointer) {
        nghttp2_session_callbacks_set_on_header_callback(cbs) {
            session, frame, name, namelen, value, valuelen, _, user in
            guard let frame, let name, let value, UInt32(frame.pointee.hd.type) == NGHTTP2_HEADERS.rawValue else {
                return 0
            }
            // Only three answer headers matter; the others are skipped before the stream's job is looked up.
            if namelen == 7, name[0] == UInt8(ascii: ":") {
                guard let job = liveJob(session, frame.pointee.hd.stream_id, user), job.status == nil else { return 0 }
                var status = 0
                for i in 0..<valuelen {
                    let d = Int(value[i]) - 48
                    guard d >= 0 && d <= 9 else { status = -1; break }
                    status = status * 10 + d
                }
                // An interim (1xx) answer is not the answer: the final one's `:status` follows.
                job.status = (200...599).contains(status) ? status : nil
            } else if namelen == 7, memcmp(name, "apns-id", 7) == 0 {
                guard let job = liveJob(session, frame.pointee.hd.stream_id, user) else { return 0 }
                // APNs answers with the apns-id it was sent: a string is made only for one that differs.
                let answered = UnsafeBufferPointer(start: value, count: valuelen)
                let same = job.request.apnsID?.utf8.withContiguousStorageIfAvailable { $0.elementsEqual(answered) }
                if same != true { job.answeredAPNsID = String(decoding: answered, as: UTF8.self) }
            } else if namelen == 11, memcmp(name, "retry-after", 11) == 0 {
                guard let job = liveJob(session, frame.pointee.hd.stream_id, user) else { return 0 }
                job.retryAfter = String(decoding: UnsafeBufferPointer(start: value, count: valuelen), as: UTF8.self)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs) { session, _, streamID, data, len, user in
            // Only an error answer's body is read (its reason); a 200's body (FCM's message name) is kept for a
            // traced request alone (its span shows the name).
            guard let data, let job = liveJob(session, streamID, user), job.status != 200 || job.request.traced
            else { return 0 }
            if job.body.count < 16 * 1024 {
                job.body.append(
                    contentsOf: UnsafeBufferPointer(start: data, count: min(len, 16 * 1024 - job.body.count)))
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_send_callback(cbs) { session, frame, user in
            guard let frame, UInt32(frame.pointee.hd.type) == NGHTTP2_HEADERS.rawValue, let c = liveConnection(user),
                let raw = nghttp2_session_get_stream_user_data(session, frame.pointee.hd.stream_id)
            else { return 0 }
            Unmanaged<Job>.fromOpaque(raw).takeUnretainedValue().headersSent = true
            c.loop.noteStreamOpened()
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs) { _, frame, user in
            guard let frame else { return 0 }
            let type = UInt32(frame.pointee.hd.type)
            // HEADERS and DATA (every answer) need nothing here.
            guard type != NGHTTP2_HEADERS.rawValue, type != NGHTTP2_DATA.rawValue, let c = liveConnection(user) else {
                return 0
            }
            let ack = (frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue)) != 0
            if type == NGHTTP2_GOAWAY.rawValue {
                c.goawayReceived = true
                c.loop.noteGoaway(
                    c, lastStreamID: frame.pointee.goaway.last_stream_id,
                    errorCode: frame.pointee.goaway.error_code)
            } else if type == NGHTTP2_PING.rawValue && ack {
                c.pingSentAt = nil
            } else if type == NGHTTP2_SETTINGS.rawValue && !ack {
                c.loop.noteSettings(c)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs) { _, streamID, errorCode, user in
            guard let c = liveConnection(user), let job = c.streams.removeValue(forKey: streamID) else { return 0 }
            c.loop.streamClosed(job, on: c, errorCode: errorCode)
            return 0
        }
    }
}

/// Recovers the connection from nghttp2's user data; nil once it is dead.
private func liveConnection(_ user: UnsafeMutableRawPointer?) -> H2Connection? {
    guard let user else { return nil }
    let c = Unmanaged<H2Connection>.fromOpaque(user).takeUnretainedValue()
    return c.dead ? nil : c
}

/// The job of a stream (its nghttp2 stream user data, set by `submit`), while its connection is alive and the job is
/// not yet completed. The connection's `streams` keeps the job alive for as long as nghttp2 knows the stream.
private func liveJob(_ session: OpaquePointer?, _ streamID: Int32, _ user: UnsafeMutableRawPointer?) -> Job? {
    guard let session, liveConnection(user) != nil, let raw = nghttp2_session_get_stream_user_data(session, streamID)
    else { return nil }
    let job = Unmanaged<Job>.fromOpaque(raw).takeUnretainedValue()
    return job.completed ? nil : job
}

/// A request's header block being written into stack buffers: each value is copied into `bytes` and an
/// `nghttp2_nv` entry points at it and at the field's static name.
private struct HeaderBlock {
    let fields: UnsafeMutableBufferPointer<nghttp2_nv>
    let bytes: UnsafeMutableBufferPointer<UInt8>
    private(set) var count = 0
    private var used = 0

    init(fields: UnsafeMutableBufferPointer<nghttp2_nv>, bytes: UnsafeMutableBufferPointer<UInt8>) {
        self.fields = fields
        self.bytes = bytes
    }

    /// `indexed: false` sends the field as a literal never added to the HPACK table (`NGHTTP2_NV_FLAG_NO_INDEX`).
    mutating func add(_ name: StaticString, _ value: [UInt8], indexed: Bool = true) {
        let start = used
        value.withUnsafeBufferPointer { append($0) }
        field(name, from: start, indexed: indexed)
    }

    mutating func add(_ name: StaticString, _ value: String, indexed: Bool = true) {
        let start = used
        append(value)
        field(name, from: start, indexed: indexed)
    }

    mutating func add(_ name: StaticString, _ prefix: StaticString, _ value: String, indexed: Bool = true) {
        let start = used
        append(UnsafeBufferPointer(start: prefix.utf8Start, count: prefix.utf8CodeUnitCount))
        append(value)
        field(name, from: start, indexed: indexed)
    }

    /// `value` in decimal ASCII, without making a String.
    mutating func add(_ name: StaticString, decimal value: Int64, indexed: Bool = true) {
        let start = used
        guard let base = bytes.baseAddress else { return }
        let length = DecimalASCII.length(of: value)
        _ = DecimalASCII.write(value, endingAt: base + used + length)
        used += length
        field(name, from: start, indexed: indexed)
    }

    private mutating func append(_ value: String) {
        var value = value
        value.withUTF8 { append($0) }
    }

    private mutating func append(_ source: UnsafeBufferPointer<UInt8>) {
        guard let base = source.baseAddress, source.count > 0 else { return }
        precondition(used + source.count <= bytes.count, "header block buffer too small")
        (bytes.baseAddress! + used).update(from: base, count: source.count)
        used += source.count
    }

    private mutating func field(_ name: StaticString, from start: Int, indexed: Bool) {
        precondition(count < fields.count, "too many header fields")
        var flags = NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue
        if !indexed { flags |= NGHTTP2_NV_FLAG_NO_INDEX.rawValue }
        fields[count] = nghttp2_nv(
            name: UnsafeMutablePointer(mutating: name.utf8Start), value: bytes.baseAddress! + start,
            namelen: name.utf8CodeUnitCount, valuelen: used - start, flags: UInt8(flags))
        count += 1
    }
}
