import Foundation
import HeraldToolSupport
import Testing

/// Protobuf fields built by hand, as opentelemetry-proto numbers them (the bytes the decoder is tested against).
enum Proto {
    static func varint(_ value: UInt64) -> [UInt8] {
        var value = value
        var out: [UInt8] = []
        while value >= 0x80 {
            out.append(UInt8(value & 0x7F) | 0x80)
            value >>= 7
        }
        out.append(UInt8(value))
        return out
    }

    static func key(_ number: UInt64, _ wireType: UInt64) -> [UInt8] { varint(number << 3 | wireType) }
    static func message(_ number: UInt64, _ body: [UInt8]) -> [UInt8] {
        key(number, 2) + varint(UInt64(body.count)) + body
    }
    static func string(_ number: UInt64, _ text: String) -> [UInt8] { message(number, Array(text.utf8)) }
    static func uint(_ number: UInt64, _ value: UInt64) -> [UInt8] { key(number, 0) + varint(value) }
    static func fixed64(_ number: UInt64, _ value: UInt64) -> [UInt8] {
        key(number, 1) + (0..<8).map { UInt8(truncatingIfNeeded: value >> (8 * UInt64($0))) }
    }
    static func fixed32(_ number: UInt64, _ value: UInt32) -> [UInt8] {
        key(number, 5) + (0..<4).map { UInt8(truncatingIfNeeded: value >> (8 * UInt32($0))) }
    }

    /// A `KeyValue` (key 1, AnyValue 2) with the AnyValue's one field.
    static func attribute(_ key: String, _ value: [UInt8]) -> [UInt8] { string(1, key) + message(2, value) }
    static func stringValue(_ text: String) -> [UInt8] { string(1, text) }
    static func boolValue(_ flag: Bool) -> [UInt8] { uint(2, flag ? 1 : 0) }
    static func intValue(_ number: Int64) -> [UInt8] { uint(3, UInt64(bitPattern: number)) }
    static func doubleValue(_ number: Double) -> [UInt8] { fixed64(4, number.bitPattern) }

    static func bytes(hex: String) -> [UInt8] {
        stride(from: 0, to: hex.count, by: 2).map { offset in
            let start = hex.index(hex.startIndex, offsetBy: offset)
            return UInt8(hex[start..<hex.index(start, offsetBy: 2)], radix: 16) ?? 0
        }
    }

    /// An `ExportTraceServiceRequest` with one resource (`service.name` = `service`) and one scope holding `spans`
    /// (each a Span message's body).
    static func request(service: String, extraResource: [UInt8] = [], spans: [[UInt8]]) -> [UInt8] {
        let resource = message(1, attribute("service.name", stringValue(service))) + extraResource
        let scope = message(1, string(1, "herald")) + spans.flatMap { message(2, $0) }
        return message(1, message(1, resource) + message(2, scope))
    }
}

@Suite struct OTLPTracesTests {
    static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"

    /// A span with every field the decoder reads, and fields it skips (trace_state, links, flags, dropped counts).
    static func fullSpan() -> [UInt8] {
        let event =
            Proto.fixed64(1, 1_700_000_000_500_000_000) + Proto.string(2, "suppressed")
            + Proto.message(3, Proto.attribute("herald.reason", Proto.stringValue("dnd")))
            + Proto.uint(4, 0)
        return Proto.message(1, Proto.bytes(hex: traceID)) + Proto.message(2, Proto.bytes(hex: "00f067aa0ba902b7"))
            + Proto.string(3, "vendor=1") + Proto.message(4, Proto.bytes(hex: "1111111111111111"))
            + Proto.string(5, "herald-send process") + Proto.uint(6, 5)
            + Proto.fixed64(7, 1_700_000_000_000_000_000) + Proto.fixed64(8, 1_700_000_001_250_000_000)
            + Proto.message(9, Proto.attribute("herald.event_id", Proto.stringValue("m-1")))
            + Proto.message(9, Proto.attribute("herald.wait_in_topic_ms", Proto.intValue(-3)))
            + Proto.message(9, Proto.attribute("herald.retry", Proto.boolValue(true)))
            + Proto.message(9, Proto.attribute("herald.ratio", Proto.doubleValue(0.25)))
            + Proto.message(9, Proto.attribute("herald.list", Proto.message(5, Proto.stringValue("x"))))
            + Proto.uint(10, 2) + Proto.message(11, event) + Proto.uint(12, 0)
            + Proto.message(13, Proto.message(1, Proto.bytes(hex: traceID))) + Proto.uint(14, 0)
            + Proto.message(15, Proto.string(2, "provider down") + Proto.uint(3, 2)) + Proto.fixed32(16, 0x101)
    }

    @Test func decodesEveryFieldOfASpanAndItsResource() throws {
        let bytes = Proto.request(
            service: "herald-send",
            extraResource: Proto.message(1, Proto.attribute("k8s.pod.name", Proto.stringValue("send-0"))),
            spans: [Self.fullSpan()])
        let spans = try OTLPTraces.decodeExportRequest(bytes)
        #expect(spans.count == 1)
        let span = try #require(spans.first)
        #expect(span.traceID == Self.traceID && span.spanID == "00f067aa0ba902b7")
        #expect(span.parentSpanID == "1111111111111111" && span.name == "herald-send process")
        #expect(span.kind == "consumer" && span.service == "herald-send")
        #expect(span.resource == ["service.name": .string("herald-send"), "k8s.pod.name": .string("send-0")])
        #expect(span.startUnixNano == 1_700_000_000_000_000_000 && span.endUnixNano == 1_700_000_001_250_000_000)
        #expect(
            span.attributes == [
                "herald.event_id": .string("m-1"), "herald.wait_in_topic_ms": .int(-3), "herald.retry": .bool(true),
                "herald.ratio": .double(0.25),
            ], "the array attribute is skipped")
        #expect(
            span.events == [
                OTLPSpanEvent(
                    name: "suppressed", timeUnixNano: 1_700_000_000_500_000_000,
                    attributes: ["herald.reason": .string("dnd")])
            ])
        #expect(span.status == OTLPStatus(code: "error", message: "provider down"))
    }

    @Test func aRootSpanHasNoParentAndMissingFieldsKeepTheirDefaults() throws {
        let span =
            Proto.message(1, Proto.bytes(hex: Self.traceID)) + Proto.message(2, Proto.bytes(hex: "2222222222222222"))
        let decoded = try #require(try OTLPTraces.decodeExportRequest(Proto.request(service: "x", spans: [span])).first)
        #expect(decoded.parentSpanID == "" && decoded.name == "" && decoded.kind == "unspecified")
        #expect(decoded.status == OTLPStatus(code: "unset", message: "") && decoded.events.isEmpty)
        #expect(try OTLPTraces.decodeExportRequest([]).isEmpty, "an empty request has no spans")
    }

    @Test func unknownFieldsOfEveryWireTypeAreSkipped() throws {
        let unknown = Proto.uint(99, 7) + Proto.fixed64(98, 1) + Proto.string(97, "x") + Proto.fixed32(96, 1)
        let span = unknown + Self.fullSpan() + unknown
        let resourceSpans =
            unknown + Proto.message(1, Proto.message(1, Proto.attribute("service.name", Proto.stringValue("svc"))))
            + Proto.message(2, unknown + Proto.message(2, span)) + Proto.string(3, "https://schema")
        let bytes = unknown + Proto.message(1, resourceSpans) + unknown
        let spans = try OTLPTraces.decodeExportRequest(bytes)
        #expect(spans.count == 1 && spans.first?.service == "svc" && spans.first?.name == "herald-send process")
        #expect(spans.first?.events.count == 1 && spans.first?.attributes.count == 4)
    }

    @Test func spansOfSeveralResourcesKeepTheirOwnService() throws {
        let a = Proto.request(service: "herald-ingest", spans: [Self.fullSpan()])
        let b = Proto.request(service: "herald-resolve", spans: [Self.fullSpan(), Self.fullSpan()])
        let spans = try OTLPTraces.decodeExportRequest(a + b)
        #expect(spans.map(\.service) == ["herald-ingest", "herald-resolve", "herald-resolve"])
    }

    @Test(
        arguments: [
            ("truncated varint", [0x08, 0x80]),
            ("length past the end", [0x0A, 0x05, 0x01]),
            ("field number 0", [0x00, 0x01]),
            ("group wire type", [0x0B, 0x0C]),
            ("wire type 7", [0x0F]),
            ("varint longer than ten bytes", [0x08] + [UInt8](repeating: 0xFF, count: 11) + [0x01]),
            ("short fixed64", [0x09, 0x01, 0x02]),
            ("short fixed32", [0x0D, 0x01]),
            ("resource_spans as a varint", [0x08, 0x01]),
        ] as [(String, [UInt8])])
    func malformedInputThrows(_ what: String, _ bytes: [UInt8]) {
        #expect(throws: OTLPDecodeError.self, "\(what)") { try OTLPTraces.decodeExportRequest(bytes) }
    }

    @Test func aKnownFieldOfTheWrongWireTypeDeepInsideThrows() {
        // The span's name (5) sent as a varint.
        let bytes = Proto.request(service: "x", spans: [Proto.uint(5, 1)])
        #expect(throws: OTLPDecodeError.self) { try OTLPTraces.decodeExportRequest(bytes) }
    }

    /// Every prefix of a valid request, and the request with each byte changed, decodes or throws; none traps.
    @Test func cutOrCorruptedRequestsNeverTrap() {
        let bytes = Proto.request(service: "herald-send", spans: [Self.fullSpan(), Self.fullSpan()])
        var threw = 0
        for end in 0..<bytes.count {
            do { _ = try OTLPTraces.decodeExportRequest(Array(bytes[0..<end])) } catch { threw += 1 }
        }
        #expect(threw > 0, "some prefixes are cut mid-field")
        for index in bytes.indices {
            for replacement: UInt8 in [0x00, 0x7F, 0x80, 0xFF] {
                var corrupted = bytes
                corrupted[index] = replacement
                _ = try? OTLPTraces.decodeExportRequest(corrupted)
            }
        }
    }
}
