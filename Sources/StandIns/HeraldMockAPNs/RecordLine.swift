// One line of the record file per answered request: token, topic, push type, priority, apns-id, collapse id,
// expiration, payload (compact JSON, or null when it was not a JSON object), status, reason, timestamp, the
// time of the answer and the length of the request's HPACK-encoded header block. Recorder writes the lines to the file.

enum RecordLine {
    /// Appends the line of `s`'s answer (`verdict`, sent with `apnsID` at wall-clock `at` milliseconds) to `b`.
    static func append(
        _ s: StreamSlot, verdict: MockVerdict, apnsID: UnsafeRawBufferPointer, at: Int64, to b: inout [UInt8]
    ) {
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
        b.append(contentsOf: String(at).utf8)
        b.append(contentsOf: #","header_bytes":"#.utf8)
        b.append(contentsOf: String(s.headerBytes).utf8)
        b.append(contentsOf: "}\n".utf8)
    }
}
