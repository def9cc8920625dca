import Foundation

/// A span as an OTLP `ExportTraceServiceRequest` carries it, flattened: its resource (`service.name` and the other
/// resource attributes) travels with each span. herald-mock-otlp keeps these and answers them as JSON (the coding
/// keys are that JSON's names); `heraldctl trace` reads them back.
package struct OTLPSpan: Sendable, Hashable, Codable {
    /// The trace id, 32 lowercase hex digits (16 bytes).
    package var traceID: String
    /// The span's id, 16 lowercase hex digits (8 bytes).
    package var spanID: String
    /// The parent span's id, or "" for a root span.
    package var parentSpanID: String
    package var name: String
    /// `internal`, `server`, `client`, `producer`, `consumer` or `unspecified`.
    package var kind: String
    /// The resource's `service.name` ("" when it has none).
    package var service: String
    /// Every resource attribute, `service.name` included.
    package var resource: [String: OTLPValue]
    package var startUnixNano: UInt64
    package var endUnixNano: UInt64
    package var attributes: [String: OTLPValue]
    package var events: [OTLPSpanEvent]
    package var status: OTLPStatus

    package init(
        traceID: String, spanID: String, parentSpanID: String = "", name: String, kind: String = "internal",
        service: String = "", resource: [String: OTLPValue] = [:], startUnixNano: UInt64, endUnixNano: UInt64,
        attributes: [String: OTLPValue] = [:], events: [OTLPSpanEvent] = [], status: OTLPStatus = OTLPStatus()
    ) {
        self.traceID = traceID
        self.spanID = spanID
        self.parentSpanID = parentSpanID
        self.name = name
        self.kind = kind
        self.service = service
        self.resource = resource
        self.startUnixNano = startUnixNano
        self.endUnixNano = endUnixNano
        self.attributes = attributes
        self.events = events
        self.status = status
    }

    enum CodingKeys: String, CodingKey {
        case traceID = "trace_id"
        case spanID = "span_id"
        case parentSpanID = "parent_span_id"
        case name, kind, service, resource
        case startUnixNano = "start_unix_nano"
        case endUnixNano = "end_unix_nano"
        case attributes, events, status
    }
}

/// A span event (`Span.Event`): a named point in time with attributes.
package struct OTLPSpanEvent: Sendable, Hashable, Codable {
    package var name: String
    package var timeUnixNano: UInt64
    package var attributes: [String: OTLPValue]

    package init(name: String, timeUnixNano: UInt64, attributes: [String: OTLPValue] = [:]) {
        self.name = name
        self.timeUnixNano = timeUnixNano
        self.attributes = attributes
    }

    enum CodingKeys: String, CodingKey {
        case name
        case timeUnixNano = "time_unix_nano"
        case attributes
    }
}

/// A span's status: `unset`, `ok` or `error`, and the error's message.
package struct OTLPStatus: Sendable, Hashable, Codable {
    package var code: String
    package var message: String

    package init(code: String = "unset", message: String = "") {
        self.code = code
        self.message = message
    }
}

/// An attribute's value: the scalar kinds of OTLP's `AnyValue` (arrays, key-value lists and bytes are skipped when
/// decoding). In JSON it is the plain value.
package enum OTLPValue: Sendable, Hashable, Codable, CustomStringConvertible {
    case string(String)
    case int(Int64)
    case bool(Bool)
    case double(Double)

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .int(value)
        } else if let value = try? container.decode(Double.self) {
            self = .double(value)
        } else {
            self = .string(try container.decode(String.self))
        }
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .bool(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        }
    }

    package var description: String {
        switch self {
        case .string(let value): value
        case .int(let value): String(value)
        case .bool(let value): String(value)
        case .double(let value): String(value)
        }
    }
}

/// Why an OTLP request could not be decoded.
package struct OTLPDecodeError: Error, CustomStringConvertible, Equatable {
    package var description: String
    init(_ description: String) { self.description = description }
}

/// Decodes OTLP/HTTP protobuf trace requests, written from opentelemetry-proto's definitions (trace.proto,
/// common.proto, resource.proto and collector/trace/v1/trace_service.proto), independently of the exporter Herald
/// uses. Fields it does not read are skipped by their wire type, as protobuf's rules say; anything malformed
/// (a truncated field, a length past the end, a varint longer than ten bytes, a field number 0, a group, a known
/// field of the wrong wire type) throws `OTLPDecodeError`, never traps.
package enum OTLPTraces {
    /// The spans of an `ExportTraceServiceRequest` (the same bytes as a `TracesData`): `resource_spans` (1), each
    /// with its `resource` (1) and `scope_spans` (2), each with its `spans` (2).
    package static func decodeExportRequest(_ bytes: [UInt8]) throws -> [OTLPSpan] {
        var spans: [OTLPSpan] = []
        var request = ProtoReader(bytes[...])
        while let field = try request.next() {
            guard field.number == 1 else { continue }
            let resourceSpans = try field.message("ResourceSpans")
            var resource: [String: OTLPValue] = [:]
            var scopes: [ArraySlice<UInt8>] = []
            var reader = ProtoReader(resourceSpans)
            while let field = try reader.next() {
                switch field.number {
                case 1:
                    var resourceReader = ProtoReader(try field.message("Resource"))
                    while let field = try resourceReader.next() {
                        guard field.number == 1 else { continue }
                        if let (key, value) = try keyValue(try field.message("KeyValue")) { resource[key] = value }
                    }
                case 2: scopes.append(try field.message("ScopeSpans"))
                default: break
                }
            }
            let service: String
            if case .string(let name) = resource["service.name"] { service = name } else { service = "" }
            for scope in scopes {
                var scopeReader = ProtoReader(scope)
                while let field = try scopeReader.next() {
                    guard field.number == 2 else { continue }
                    var span = try decodeSpan(try field.message("Span"))
                    span.service = service
                    span.resource = resource
                    spans.append(span)
                }
            }
        }
        return spans
    }

    /// The protobuf encoding of an empty `ExportTraceServiceResponse` (no `partial_success`): no bytes at all.
    package static let emptyExportResponse: [UInt8] = []

    static let kinds = ["unspecified", "internal", "server", "client", "producer", "consumer"]
    static let statusCodes = ["unset", "ok", "error"]

    /// A `Span`: ids (1, 2, 4), name (5), kind (6), start and end (7, 8: fixed64), attributes (9), events (11),
    /// status (15); trace_state (3), the dropped counts, links (13) and flags (16) are skipped.
    static func decodeSpan(_ bytes: ArraySlice<UInt8>) throws -> OTLPSpan {
        var span = OTLPSpan(traceID: "", spanID: "", name: "", kind: "unspecified", startUnixNano: 0, endUnixNano: 0)
        var reader = ProtoReader(bytes)
        while let field = try reader.next() {
            switch field.number {
            case 1: span.traceID = hex(try field.bytes("trace_id"))
            case 2: span.spanID = hex(try field.bytes("span_id"))
            case 4: span.parentSpanID = hex(try field.bytes("parent_span_id"))
            case 5: span.name = try field.string("name")
            case 6:
                let kind = try field.varint("kind")
                span.kind = kind < kinds.count ? kinds[Int(kind)] : "unknown(\(kind))"
            case 7: span.startUnixNano = try field.fixed64("start_time_unix_nano")
            case 8: span.endUnixNano = try field.fixed64("end_time_unix_nano")
            case 9:
                if let (key, value) = try keyValue(try field.message("KeyValue")) { span.attributes[key] = value }
            case 11: span.events.append(try decodeEvent(try field.message("Span.Event")))
            case 15: span.status = try decodeStatus(try field.message("Status"))
            default: break
            }
        }
        return span
    }

    /// A `Span.Event`: time (1: fixed64), name (2), attributes (3).
    static func decodeEvent(_ bytes: ArraySlice<UInt8>) throws -> OTLPSpanEvent {
        var event = OTLPSpanEvent(name: "", timeUnixNano: 0)
        var reader = ProtoReader(bytes)
        while let field = try reader.next() {
            switch field.number {
            case 1: event.timeUnixNano = try field.fixed64("time_unix_nano")
            case 2: event.name = try field.string("name")
            case 3:
                if let (key, value) = try keyValue(try field.message("KeyValue")) { event.attributes[key] = value }
            default: break
            }
        }
        return event
    }

    /// A `Status`: message (2), code (3: 0 unset, 1 ok, 2 error).
    static func decodeStatus(_ bytes: ArraySlice<UInt8>) throws -> OTLPStatus {
        var status = OTLPStatus()
        var reader = ProtoReader(bytes)
        while let field = try reader.next() {
            switch field.number {
            case 2: status.message = try field.string("message")
            case 3:
                let code = try field.varint("code")
                status.code = code < statusCodes.count ? statusCodes[Int(code)] : "unknown(\(code))"
            default: break
            }
        }
        return status
    }

    /// A `KeyValue`: key (1) and an `AnyValue` (2); nil when the value is absent or not a scalar.
    static func keyValue(_ bytes: ArraySlice<UInt8>) throws -> (String, OTLPValue)? {
        var key = ""
        var value: OTLPValue?
        var reader = ProtoReader(bytes)
        while let field = try reader.next() {
            switch field.number {
            case 1: key = try field.string("key")
            case 2: value = try anyValue(try field.message("AnyValue"))
            default: break
            }
        }
        return value.map { (key, $0) }
    }

    /// An `AnyValue` (a oneof): string (1), bool (2), int (3: int64 as a varint), double (4: fixed64); array (5),
    /// key-value list (6) and bytes (7) give nil. The last value present wins, as protobuf's oneof rules say.
    static func anyValue(_ bytes: ArraySlice<UInt8>) throws -> OTLPValue? {
        var value: OTLPValue?
        var reader = ProtoReader(bytes)
        while let field = try reader.next() {
            switch field.number {
            case 1: value = .string(try field.string("string_value"))
            case 2: value = .bool(try field.varint("bool_value") != 0)
            case 3: value = .int(Int64(bitPattern: try field.varint("int_value")))
            case 4: value = .double(Double(bitPattern: try field.fixed64("double_value")))
            case 5, 6, 7: value = nil
            default: break
            }
        }
        return value
    }

    static func hex(_ bytes: ArraySlice<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// One field of a protobuf message as read off the wire.
struct ProtoField {
    enum Value {
        case varint(UInt64)
        case fixed64(UInt64)
        case lengthDelimited(ArraySlice<UInt8>)
        case fixed32(UInt32)
    }

    var number: UInt64
    var value: Value

    func wrongType(_ name: String, _ expected: String) -> OTLPDecodeError {
        OTLPDecodeError("field \(number) (\(name)): expected \(expected), got another wire type")
    }

    func message(_ name: String) throws -> ArraySlice<UInt8> {
        guard case .lengthDelimited(let bytes) = value else { throw wrongType(name, "a message") }
        return bytes
    }

    func bytes(_ name: String) throws -> ArraySlice<UInt8> {
        guard case .lengthDelimited(let bytes) = value else { throw wrongType(name, "bytes") }
        return bytes
    }

    func string(_ name: String) throws -> String {
        guard case .lengthDelimited(let bytes) = value else { throw wrongType(name, "a string") }
        return String(decoding: bytes, as: UTF8.self)
    }

    func varint(_ name: String) throws -> UInt64 {
        guard case .varint(let number) = value else { throw wrongType(name, "a varint") }
        return number
    }

    func fixed64(_ name: String) throws -> UInt64 {
        guard case .fixed64(let number) = value else { throw wrongType(name, "a fixed64") }
        return number
    }
}

/// Reads the fields of one protobuf message in order (wire types 0, 1, 2 and 5; groups, 3 and 4, long deprecated,
/// are refused).
struct ProtoReader {
    private let bytes: ArraySlice<UInt8>
    private var index: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        index = bytes.startIndex
    }

    /// The next field, or nil at the end of the message.
    mutating func next() throws -> ProtoField? {
        guard index < bytes.endIndex else { return nil }
        let key = try varint()
        let number = key >> 3
        guard number != 0 else { throw OTLPDecodeError("field number 0 at byte \(index - bytes.startIndex)") }
        switch key & 7 {
        case 0: return ProtoField(number: number, value: .varint(try varint()))
        case 1: return ProtoField(number: number, value: .fixed64(try fixed(8)))
        case 2:
            let length = try varint()
            guard length <= UInt64(bytes.endIndex - index) else {
                throw OTLPDecodeError("field \(number): length \(length) past the end of its message")
            }
            let start = index
            index += Int(length)
            return ProtoField(number: number, value: .lengthDelimited(bytes[start..<index]))
        case 5: return ProtoField(number: number, value: .fixed32(UInt32(try fixed(4))))
        default: throw OTLPDecodeError("field \(number): unsupported wire type \(key & 7)")
        }
    }

    private mutating func varint() throws -> UInt64 {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while index < bytes.endIndex {
            let byte = bytes[index]
            index += 1
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
            if shift >= 70 { throw OTLPDecodeError("a varint longer than ten bytes") }
        }
        throw OTLPDecodeError("a varint cut short by the end of the message")
    }

    /// A little-endian fixed-width integer of `count` bytes (4 or 8).
    private mutating func fixed(_ count: Int) throws -> UInt64 {
        guard bytes.endIndex - index >= count else { throw OTLPDecodeError("a fixed-width field cut short") }
        var value: UInt64 = 0
        for offset in 0..<count { value |= UInt64(bytes[index + offset]) << (8 * UInt64(offset)) }
        index += count
        return value
    }
}
