import HeraldTestSupport

/// A span as an OTLP export request carries it (the fields the tests read).
struct ReceivedSpan: Equatable {
    var traceID: [UInt8] = []
    var spanID: [UInt8] = []
    var parentSpanID: [UInt8] = []
    var name = ""
    /// `Span.SpanKind`: 3 client, 5 consumer.
    var kind: UInt64 = 0
    var startNanoseconds: UInt64 = 0
    var endNanoseconds: UInt64 = 0
    /// String and integer attributes, integers written in decimal.
    var attributes: [String: String] = [:]
    /// `Status.code`: 2 error; 0 unset.
    var statusCode: UInt64 = 0
    var events: [ReceivedEvent] = []
}

/// A span's event: `Span.Event` `time_unix_nano(1)`, `name(2)`, `attributes(3)`.
struct ReceivedEvent: Equatable {
    var name = ""
    var timeNanoseconds: UInt64 = 0
    var attributes: [String: String] = [:]
}

extension OTLPReceiver {
    /// The spans of every request received: `ExportTraceServiceRequest.resource_spans(1)` → `scope_spans(2)` →
    /// `spans(2)`, each span's `trace_id(1)`, `span_id(2)`, `parent_span_id(4)` and `name(5)`.
    var spans: [ReceivedSpan] {
        received.flatMap { body in
            Self.fields(body, 1).flatMap { Self.fields($0, 2) }.flatMap { Self.fields($0, 2) }.map { span in
                ReceivedSpan(
                    traceID: Self.fields(span, 1).first ?? [], spanID: Self.fields(span, 2).first ?? [],
                    parentSpanID: Self.fields(span, 4).first ?? [],
                    name: String(decoding: Self.fields(span, 5).first ?? [], as: UTF8.self),
                    kind: Self.scalars(span, 6).first ?? 0, startNanoseconds: Self.scalars(span, 7).first ?? 0,
                    endNanoseconds: Self.scalars(span, 8).first ?? 0, attributes: Self.attributes(span),
                    statusCode: Self.fields(span, 15).first.flatMap { Self.scalars($0, 3).first } ?? 0,
                    events: Self.fields(span, 11).map { event in
                        ReceivedEvent(
                            name: String(decoding: Self.fields(event, 2).first ?? [], as: UTF8.self),
                            timeNanoseconds: Self.scalars(event, 1).first ?? 0,
                            attributes: Self.attributes(event, field: 3))
                    })
            }
        }
    }

    /// A span's `attributes(9)` (an event's: `field` 3): each `KeyValue` `key(1)`, `value(2)` with
    /// `string_value(1)` or `int_value(3)`.
    static func attributes(_ span: [UInt8], field: UInt64 = 9) -> [String: String] {
        var out: [String: String] = [:]
        for pair in fields(span, field) {
            guard let key = fields(pair, 1).first, let value = fields(pair, 2).first else { continue }
            if let text = fields(value, 1).first {
                out[String(decoding: key, as: UTF8.self)] = String(decoding: text, as: UTF8.self)
            } else if let number = scalars(value, 3).first {
                out[String(decoding: key, as: UTF8.self)] = String(Int64(bitPattern: number))
            }
        }
        return out
    }

    /// The varint and fixed64 fields numbered `number` of a protobuf message.
    static func scalars(_ message: [UInt8], _ number: UInt64) -> [UInt64] {
        var found: [UInt64] = []
        var index = 0
        func varint() -> UInt64? {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while index < message.count, shift < 64 {
                let byte = message[index]
                index += 1
                value |= UInt64(byte & 0x7F) << shift
                if byte < 0x80 { return value }
                shift += 7
            }
            return nil
        }
        while index < message.count, let key = varint() {
            switch key & 7 {
            case 0:
                guard let value = varint() else { return found }
                if key >> 3 == number { found.append(value) }
            case 1:
                guard index + 8 <= message.count else { return found }
                if key >> 3 == number {
                    found.append((0..<8).reduce(UInt64(0)) { $0 | UInt64(message[index + $1]) << (8 * UInt64($1)) })
                }
                index += 8
            case 5: index += 4
            case 2:
                guard let length = varint() else { return found }
                index += Int(length)
            default: return found
            }
        }
        return found
    }

    /// The length-delimited fields numbered `number` of a protobuf message (other fields skipped).
    static func fields(_ message: [UInt8], _ number: UInt64) -> [[UInt8]] {
        var found: [[UInt8]] = []
        var index = 0
        func varint() -> UInt64? {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while index < message.count, shift < 64 {
                let byte = message[index]
                index += 1
                value |= UInt64(byte & 0x7F) << shift
                if byte < 0x80 { return value }
                shift += 7
            }
            return nil
        }
        while index < message.count, let key = varint() {
            switch key & 7 {
            case 0: guard varint() != nil else { return found }
            case 1: index += 8
            case 5: index += 4
            case 2:
                guard let length = varint(), index + Int(length) <= message.count else { return found }
                if key >> 3 == number { found.append(Array(message[index..<index + Int(length)])) }
                index += Int(length)
            default: return found
            }
        }
        return found
    }
}
