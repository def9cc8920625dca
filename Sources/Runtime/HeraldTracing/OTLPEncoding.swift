// OTLP/HTTP's request body: an `ExportTraceServiceRequest` (opentelemetry-proto, collector/trace/v1) in the protobuf
// wire format, written field by field. Herald's spans use a small part of the schema: one resource, one scope, and
// spans with ids, times, string and integer attributes, events and an error status.

/// Writes the protobuf body of one export request.
public enum OTLPEncoding {
    /// The instrumentation scope every Herald span is exported under.
    public static let scopeName = "herald"

    /// `spans` as one `ExportTraceServiceRequest` from the resource `resource` (its attributes, `service.name`
    /// among them).
    public static func exportRequest(
        _ spans: some Collection<SpanRecord>, resource: [(key: String, value: SpanValue)]
    ) -> [UInt8] {
        var scopeSpans = ProtoWriter()
        scopeSpans.message(1) { scope in scope.string(1, scopeName) }
        for span in spans { scopeSpans.message(2) { encodeSpan(span, into: &$0) } }

        var resourceSpans = ProtoWriter()
        resourceSpans.message(1) { resourceMessage in
            for (key, value) in resource { resourceMessage.message(1) { keyValue(key, value, into: &$0) } }
        }
        resourceSpans.bytes(2, scopeSpans.buffer)

        var request = ProtoWriter()
        request.bytes(1, resourceSpans.buffer)
        return request.buffer
    }

    static func encodeSpan(_ span: SpanRecord, into writer: inout ProtoWriter) {
        writer.bytes(1, bigEndian: [span.traceIDHigh, span.traceIDLow])
        writer.bytes(2, bigEndian: [span.spanID])
        if let state = span.traceState { writer.string(3, state) }
        if span.parentSpanID != 0 { writer.bytes(4, bigEndian: [span.parentSpanID]) }
        writer.string(5, span.name)
        writer.varint(6, UInt64(span.kind.rawValue))
        writer.fixed64(7, span.startNanoseconds)
        writer.fixed64(8, span.endNanoseconds)
        for (key, value) in span.attributes { writer.message(9) { keyValue(key, value, into: &$0) } }
        for event in span.events {
            writer.message(11) { eventWriter in
                eventWriter.fixed64(1, event.timeNanoseconds)
                eventWriter.string(2, event.name)
                for (key, value) in event.attributes { eventWriter.message(3) { keyValue(key, value, into: &$0) } }
            }
        }
        if let description = span.errorDescription {
            writer.message(15) { status in
                status.string(2, description)
                status.varint(3, 2)  // STATUS_CODE_ERROR
            }
        }
        writer.fixed32(16, UInt32(span.flags))
    }

    static func keyValue(_ key: String, _ value: SpanValue, into writer: inout ProtoWriter) {
        writer.string(1, key)
        writer.message(2) { any in
            switch value {
            case .string(let text): any.string(1, text)
            case .int(let number): any.varint(3, UInt64(bitPattern: number))
            }
        }
    }
}

/// Appends protobuf fields to a byte buffer. A nested message is written to a buffer of its own and then copied in
/// behind its length: Herald's messages are small, so the copy costs less than sizing everything first.
struct ProtoWriter {
    var buffer: [UInt8] = []

    mutating func rawVarint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            buffer.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        buffer.append(UInt8(v))
    }

    mutating func tag(_ field: Int, _ wireType: UInt64) { rawVarint(UInt64(field) << 3 | wireType) }

    mutating func varint(_ field: Int, _ value: UInt64) {
        tag(field, 0)
        rawVarint(value)
    }

    mutating func fixed64(_ field: Int, _ value: UInt64) {
        tag(field, 1)
        for shift in stride(from: 0, to: 64, by: 8) { buffer.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    mutating func fixed32(_ field: Int, _ value: UInt32) {
        tag(field, 5)
        for shift in stride(from: 0, to: 32, by: 8) { buffer.append(UInt8(truncatingIfNeeded: value >> UInt32(shift))) }
    }

    mutating func bytes(_ field: Int, _ value: [UInt8]) {
        tag(field, 2)
        rawVarint(UInt64(value.count))
        buffer.append(contentsOf: value)
    }

    /// The words' bytes, most significant first: a trace id (two words) or a span id (one).
    mutating func bytes(_ field: Int, bigEndian words: [UInt64]) {
        tag(field, 2)
        rawVarint(UInt64(words.count * 8))
        for word in words {
            for shift in stride(from: 56, through: 0, by: -8) {
                buffer.append(UInt8(truncatingIfNeeded: word >> UInt64(shift)))
            }
        }
    }

    mutating func string(_ field: Int, _ value: String) {
        tag(field, 2)
        var text = value
        text.withUTF8 { utf8 in
            rawVarint(UInt64(utf8.count))
            buffer.append(contentsOf: utf8)
        }
    }

    mutating func message(_ field: Int, _ body: (inout ProtoWriter) -> Void) {
        var inner = ProtoWriter()
        body(&inner)
        bytes(field, inner.buffer)
    }
}
