import CNghttp2
import COpenSSL
import Foundation

/// One HTTP/2 connection of the stand-in: an nghttp2 server session over a blocking TLS socket,
/// confined to the connection's thread. Answers are computed when a request's stream ends and
/// written before the next read.
final class H2Session {
    final class Stream {
        var path = ""
        var authorization: String?
        /// Every header by lower-case name (Web Push reads several).
        var headers: [String: String] = [:]
        var body: [UInt8] = []
        var answer: [UInt8] = []
        var offset = 0
    }

    let server: MockProvidersServer
    let ssl: OpaquePointer
    var session: OpaquePointer?
    var streams: [Int32: Stream] = [:]
    var handled = 0
    /// The last stream id of the GOAWAY sent; streams above it are refused, never processed.
    var goawayLastStreamID: Int32?

    init(server: MockProvidersServer, ssl: OpaquePointer) {
        self.server = server
        self.ssl = ssl
    }

    func run() {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return }
        install(callbacks)
        var s: OpaquePointer?
        let me = Unmanaged.passUnretained(self).toOpaque()
        let rc = nghttp2_session_server_new(&s, callbacks, me)
        nghttp2_session_callbacks_del(callbacks)
        guard rc == 0, let s else { return }
        session = s
        defer { nghttp2_session_del(s); session = nil }
        var settings = [
            nghttp2_settings_entry(
                settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                value: UInt32(server.configuration.maxConcurrentStreams))
        ]
        nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            guard flush() else { return }
            if nghttp2_session_want_read(s) == 0 && nghttp2_session_want_write(s) == 0 { return }
            let n = SSL_read(ssl, &buffer, Int32(buffer.count))
            if n <= 0 { ERR_clear_error(); return }
            let used = buffer.withUnsafeBufferPointer { nghttp2_session_mem_recv(s, $0.baseAddress, Int(n)) }
            if used < 0 { return }
        }
    }

    private func flush() -> Bool {
        guard let session else { return false }
        var out: [UInt8] = []
        while true {
            var chunk: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &chunk)
            if n < 0 { return false }
            if n == 0 { break }
            if let chunk { out.append(contentsOf: UnsafeBufferPointer(start: chunk, count: n)) }
        }
        if out.isEmpty { return true }
        return SSL_write(ssl, out, Int32(out.count)) > 0
    }

    func requestDone(_ id: Int32) {
        guard let session, let stream = streams[id] else { return }
        if let last = goawayLastStreamID, id > last {
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, NGHTTP2_REFUSED_STREAM.rawValue)
            return
        }
        let status: Int, json: String, retryAfter: Int?
        if stream.path.hasPrefix("/wp/") {
            // Web Push (MockWebPush.swift): the answer is recorded there.
            let (code, reason) = server.webPushAnswer(path: stream.path, headers: stream.headers, body: stream.body)
            (status, json, retryAfter) = (
                code, code == 201 ? "" : #"{"reason":"\#(reason.replacingOccurrences(of: "\"", with: "'"))"}"#, nil
            )
        } else {
            let reason: String
            (status, json, reason, retryAfter) = server.sendAnswer(
                path: stream.path, authorization: stream.authorization,
                body: stream.body)
            var target = ""
            if let root = try? JSONSerialization.jsonObject(with: Data(stream.body)) as? [String: Any],
                let m = root["message"] as? [String: Any], let t = m["token"] as? String
            {
                target = t
            }
            server.record(
                MockAnswer(
                    endpoint: .send, status: status, reason: reason, target: target, body: stream.body,
                    authorization: stream.authorization))
        }
        stream.answer = Array(json.utf8)
        var headers: [(String, String)] = [
            (":status", String(status)), ("content-type", "application/json; charset=UTF-8"),
            ("content-length", String(stream.answer.count)),
        ]
        if let retryAfter { headers.append(("retry-after", String(retryAfter))) }
        var names = headers.map { Array($0.0.utf8) }
        var values = headers.map { Array($0.1.utf8) }
        var nva: [nghttp2_nv] = []
        for i in 0..<headers.count {
            nva.append(
                nghttp2_nv(
                    name: names[i].withUnsafeMutableBufferPointer { $0.baseAddress! },
                    value: values[i].withUnsafeMutableBufferPointer { $0.baseAddress! },
                    namelen: names[i].count, valuelen: values[i].count,
                    flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
        }
        var provider = nghttp2_data_provider(
            source: nghttp2_data_source(ptr: Unmanaged.passUnretained(stream).toOpaque()),
            read_callback: { _, _, buf, length, flags, source, _ in
                guard let raw = source?.pointee.ptr, let buf, let flags else { return 0 }
                let s = Unmanaged<Stream>.fromOpaque(raw).takeUnretainedValue()
                let n = min(length, s.answer.count - s.offset)
                if n > 0 { s.answer.withUnsafeBufferPointer { buf.update(from: $0.baseAddress! + s.offset, count: n) } }
                s.offset += n
                if s.offset >= s.answer.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
                return n
            })
        // nghttp2 copies header names and values during submit (no NO_COPY flags).
        nghttp2_submit_response(session, id, &nva, nva.count, &provider)
        withExtendedLifetime((names, values)) {}
        names.removeAll(); values.removeAll()
        handled += 1
        let limit = server.configuration.goawayAfterStreams
        if limit > 0, handled >= limit, goawayLastStreamID == nil {
            goawayLastStreamID = id
            nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, NGHTTP2_NO_ERROR.rawValue, nil, 0)
        }
    }

    private func install(_ cbs: OpaquePointer) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(cbs) { _, frame, user in
            guard let user, let frame, UInt32(frame.pointee.hd.type) == NGHTTP2_HEADERS.rawValue else { return 0 }
            let me = Unmanaged<H2Session>.fromOpaque(user).takeUnretainedValue()
            me.streams[frame.pointee.hd.stream_id] = Stream()
            return 0
        }
        nghttp2_session_callbacks_set_on_header_callback(cbs) { _, frame, name, namelen, value, valuelen, _, user in
            guard let user, let frame, let name, let value else { return 0 }
            let me = Unmanaged<H2Session>.fromOpaque(user).takeUnretainedValue()
            guard let s = me.streams[frame.pointee.hd.stream_id] else { return 0 }
            let n = String(decoding: UnsafeBufferPointer(start: name, count: namelen), as: UTF8.self)
            let v = String(decoding: UnsafeBufferPointer(start: value, count: valuelen), as: UTF8.self)
            if n == ":path" { s.path = v } else if n == "authorization" { s.authorization = v }
            s.headers[n] = v
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs) { _, _, id, data, len, user in
            guard let user, let data else { return 0 }
            let me = Unmanaged<H2Session>.fromOpaque(user).takeUnretainedValue()
            me.streams[id]?.body.append(contentsOf: UnsafeBufferPointer(start: data, count: len))
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(cbs) { _, frame, user in
            guard let user, let frame else { return 0 }
            let me = Unmanaged<H2Session>.fromOpaque(user).takeUnretainedValue()
            let type = UInt32(frame.pointee.hd.type)
            if type == NGHTTP2_HEADERS.rawValue || type == NGHTTP2_DATA.rawValue,
                frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
            {
                me.requestDone(frame.pointee.hd.stream_id)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(cbs) { _, id, _, user in
            guard let user else { return 0 }
            Unmanaged<H2Session>.fromOpaque(user).takeUnretainedValue().streams.removeValue(forKey: id)
            return 0
        }
    }
}
