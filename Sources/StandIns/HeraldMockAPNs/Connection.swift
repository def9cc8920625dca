// One client connection: a non-blocking socket, its OpenSSL session and its nghttp2 server
// session, plus the per-stream request state. Owned and driven by MockAPNsServer's loop thread.
import CHeraldMockTLS
import CNghttp2
import Glibc

/// The state of one request stream; slots are reused so a request allocates nothing new.
struct StreamSlot {
    var streamID: Int32 = 0
    /// Bumped each time the slot is reused, so a delayed answer can tell its stream is gone.
    var generation: UInt32 = 0
    var head = RequestHead()
    var body: [UInt8] = []
    var bodyLength = 0
    /// Length of the request's HEADERS frame: its HPACK-encoded header block, as the client sent it.
    var headerBytes = 0
    var refused = false
    var answered = false
    var free = false
    /// The error body being sent (`{"reason":...}`) and how much of it nghttp2 has taken.
    var response: [UInt8] = []
    var responseOffset = 0

    init() {
        body.reserveCapacity(RequestCheck.maxStoredBody + 1)
        response.reserveCapacity(96)
    }

    mutating func reset(streamID: Int32) {
        self.streamID = streamID
        generation &+= 1
        head.reset()
        body.removeAll(keepingCapacity: true)
        bodyLength = 0
        headerBytes = 0
        refused = false
        answered = false
        free = false
        response.removeAll(keepingCapacity: true)
        responseOffset = 0
    }
}

final class Connection {
    let fd: Int32
    let serial: UInt64
    /// unowned(unsafe): the server owns every connection (its tables are the only strong
    /// references) and outlives them, so no reference counting is needed on the hot path.
    unowned(unsafe) let server: MockAPNsServer
    var tls: OpaquePointer?
    var session: OpaquePointer?
    var handshaking = true
    var certificateAuth = false
    /// SETTINGS_MAX_CONCURRENT_STREAMS last handed to nghttp2 (what the client is or will be told).
    var advertisedStreams = 0
    /// A new SETTINGS_MAX_CONCURRENT_STREAMS to submit once the answers queued before it are
    /// serialized (nghttp2 sends SETTINGS ahead of queued HEADERS; the change must follow the answer).
    var pendingStreamsSetting: Int?
    /// SETTINGS_MAX_CONCURRENT_STREAMS values sent and not yet acknowledged, oldest first.
    var unacknowledgedStreamsSettings: [Int] = []
    /// The limit the client has acknowledged (unlimited until it acknowledges the first SETTINGS).
    var acknowledgedStreams = Int.max
    /// Request streams open now (begun, not yet closed).
    var openStreams = 0
    /// Highest number of open streams seen above the acknowledged limit on this connection.
    var maxStreamsOverLimit = 0
    /// Highest client stream id a HEADERS frame has been seen for.
    var highestStreamID: Int32 = 0
    /// Only a success on a stream above this id raises the limit: after a provider-token rejection,
    /// a request the client opened after it (answers to requests already in flight do not count).
    var raiseAboveStreamID: Int32 = 0
    var streamsSeen = 0
    /// Set once this side sent GOAWAY: streams above it are refused.
    var goawayLastStreamID: Int32?
    var resetRequested = false
    var closed = false
    var failed = false
    var inDirtyList = false
    /// Its read budget ran out with input left (in the socket or in OpenSSL's buffer): read again next pass.
    var moreToRead = false
    /// The loop pass in which it was last read (one budget per connection per pass).
    var readInPass: UInt64 = 0
    var watchingWritable = false

    // Output: bytes taken from nghttp2, not yet accepted by SSL_write.
    var out: UnsafeMutablePointer<UInt8>
    var outCapacity = 1 << 16
    var outStart = 0
    var outEnd = 0

    // Streams.
    var slots: [StreamSlot] = []
    var freeSlots: [Int] = []

    // The last authorization header checked on this connection and its result.
    var cachedAuthorization: [UInt8] = []
    var cachedAuthorizationCheck: ProviderTokenCheck?

    init(fd: Int32, serial: UInt64, server: MockAPNsServer, tls: OpaquePointer) {
        self.fd = fd
        self.serial = serial
        self.server = server
        self.tls = tls
        out = .allocate(capacity: outCapacity)
    }

    deinit {
        if let session { nghttp2_session_del(session) }
        if let tls { hmt_conn_free(tls) }
        out.deallocate()
    }

    var pendingOutput: Int { outEnd - outStart }

    func appendOutput(_ p: UnsafePointer<UInt8>, _ n: Int) {
        if outStart > 0 && outStart == outEnd { outStart = 0; outEnd = 0 }
        if outEnd + n > outCapacity {
            // Compact, then grow if still needed.
            let live = outEnd - outStart
            if outStart > 0 {
                memmove(out, out + outStart, live)
                outStart = 0
                outEnd = live
            }
            if outEnd + n > outCapacity {
                var cap = outCapacity
                while outEnd + n > cap { cap *= 2 }
                let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: cap)
                bigger.update(from: out, count: outEnd)
                out.deallocate()
                out = bigger
                outCapacity = cap
            }
        }
        (out + outEnd).update(from: p, count: n)
        outEnd += n
    }

    // MARK: Stream slots

    func openSlot(streamID: Int32) -> Int {
        let index: Int
        if let free = freeSlots.popLast() {
            index = free
        } else {
            slots.append(StreamSlot())
            index = slots.count - 1
        }
        slots[index].reset(streamID: streamID)
        openStreams += 1
        // The slot index rides on nghttp2's own stream map (index + 1, so 0 means none).
        nghttp2_session_set_stream_user_data(session, streamID, UnsafeMutableRawPointer(bitPattern: index + 1))
        return index
    }

    /// The slot of an open stream.
    @inline(__always)
    func slotIndex(of streamID: Int32) -> Int? {
        guard let raw = nghttp2_session_get_stream_user_data(session, streamID) else { return nil }
        let index = Int(bitPattern: raw) - 1
        guard index >= 0, index < slots.count, slots[index].streamID == streamID, !slots[index].free else { return nil }
        return index
    }

    func closeSlot(streamID: Int32) {
        guard let index = slotIndex(of: streamID) else { return }
        slots[index].generation &+= 1
        slots[index].free = true
        freeSlots.append(index)
        openStreams -= 1
    }

    // MARK: HTTP/2 session

    /// Creates the nghttp2 server session and queues the connection preface SETTINGS.
    func startSession(initialConcurrentStreams: Int) -> Bool {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return false }
        defer { nghttp2_session_callbacks_del(callbacks) }

        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, userData in
            guard let frame, let userData else { return 0 }
            let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
            guard frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
                frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
            else { return 0 }
            conn.server.beginStream(conn, streamID: frame.pointee.hd.stream_id)
            if let index = conn.slotIndex(of: frame.pointee.hd.stream_id) {
                conn.slots[index].headerBytes = frame.pointee.hd.length
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks) { _, hd, userData in
            // Judged before nghttp2 applies its own limit check, so a violation is counted even
            // when nghttp2 then refuses the stream or ends the connection.
            guard let hd, let userData, hd.pointee.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
            let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
            let streamID = hd.pointee.stream_id
            guard streamID > conn.highestStreamID, streamID & 1 == 1 else { return 0 }
            conn.highestStreamID = streamID
            let over = conn.openStreams + 1 - conn.acknowledgedStreams
            if over > 0 { conn.server.countStreamOverLimit(conn, over: over) }
            return 0
        }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) {
            _, frame, name, namelen, value, valuelen, _, userData in
            guard let frame, let userData, let name, let value else { return 0 }
            guard frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
            let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
            guard let index = conn.slotIndex(of: frame.pointee.hd.stream_id) else { return 0 }
            let nameBuf = UnsafeRawBufferPointer(start: name, count: namelen)
            guard let field = RequestField.from(name: nameBuf) else { return 0 }
            if conn.slots[index].head.arena.count + valuelen > 16384 { return 0 }
            conn.slots[index].head.set(field, UnsafeRawBufferPointer(start: value, count: valuelen))
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, streamID, data, len, userData in
            guard let userData, let data else { return 0 }
            let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
            guard let index = conn.slotIndex(of: streamID) else { return 0 }
            conn.slots[index].bodyLength += len
            let room = RequestCheck.maxStoredBody + 1 - conn.slots[index].body.count
            if room > 0 {
                conn.slots[index].body.append(contentsOf: UnsafeBufferPointer(start: data, count: min(room, len)))
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
            guard let frame, let userData else { return 0 }
            let type = frame.pointee.hd.type
            if type == UInt8(NGHTTP2_SETTINGS.rawValue), frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0
            {
                Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue().settingsAcknowledged()
                return 0
            }
            guard type == UInt8(NGHTTP2_HEADERS.rawValue) || type == UInt8(NGHTTP2_DATA.rawValue) else { return 0 }
            let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
            let streamID = frame.pointee.hd.stream_id
            guard let index = conn.slotIndex(of: streamID) else { return 0 }
            if conn.slots[index].refused {
                if type == UInt8(NGHTTP2_HEADERS.rawValue) {
                    nghttp2_submit_rst_stream(
                        conn.session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID,
                        NGHTTP2_REFUSED_STREAM.rawValue)
                }
                return 0
            }
            if frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 {
                conn.server.requestComplete(conn, slot: index)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks) { _, frame, userData in
            guard let frame, let userData, frame.pointee.hd.type == UInt8(NGHTTP2_RST_STREAM.rawValue),
                frame.pointee.rst_stream.error_code == NGHTTP2_REFUSED_STREAM.rawValue
            else { return 0 }
            // Counts both our refusals after GOAWAY and nghttp2's above the advertised limit.
            Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue().server.countRefusedStream()
            return 0
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, streamID, _, userData in
            guard let userData else { return 0 }
            let conn = Unmanaged<Connection>.fromOpaque(userData).takeUnretainedValue()
            conn.closeSlot(streamID: streamID)
            return 0
        }

        var s: OpaquePointer?
        let me = Unmanaged.passUnretained(self).toOpaque()
        guard nghttp2_session_server_new(&s, callbacks, me) == 0, let s else { return false }
        session = s

        var settings = [
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                value: UInt32(initialConcurrentStreams)),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue),
                value: 1 << 20),
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_FRAME_SIZE.rawValue),
                value: 1 << 14),
        ]
        guard nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count) == 0 else {
            return false
        }
        advertisedStreams = initialConcurrentStreams
        unacknowledgedStreamsSettings.append(initialConcurrentStreams)
        // A large connection window so clients never stall on flow control.
        _ = nghttp2_session_set_local_window_size(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, 1 << 26)
        return true
    }

    /// Asks for SETTINGS_MAX_CONCURRENT_STREAMS = `value` to be sent after the answers queued so far
    /// (APNs raises a token-auth connection's limit after a success and lowers it after a
    /// provider-token rejection). Nothing is sent when the client already has (or gets) `value`.
    func scheduleMaxConcurrentStreams(_ value: Int) {
        if advertisedStreams == value {
            pendingStreamsSetting = nil
        } else {
            pendingStreamsSetting = value
        }
    }

    /// Submits the scheduled SETTINGS, if any; true when one was submitted.
    func submitScheduledMaxConcurrentStreams() -> Bool {
        guard let value = pendingStreamsSetting, let session else { return false }
        pendingStreamsSetting = nil
        var entry = nghttp2_settings_entry(
            settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
            value: UInt32(value))
        guard nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entry, 1) == 0 else { return false }
        advertisedStreams = value
        unacknowledgedStreamsSettings.append(value)
        return true
    }

    /// The client acknowledged our oldest outstanding SETTINGS (acknowledgements come in order).
    func settingsAcknowledged() {
        guard !unacknowledgedStreamsSettings.isEmpty else { return }
        acknowledgedStreams = unacknowledgedStreamsSettings.removeFirst()
    }
}
