import Foundation
import HeraldToolSupport
import Testing

@Suite struct TraceViewTests {
    static let trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let t0: UInt64 = 1_700_000_000_000_000_000

    static func span(
        _ id: String, parent: String = "", _ name: String, service: String, start: UInt64, end: UInt64,
        attributes: [String: OTLPValue] = [:], events: [OTLPSpanEvent] = [], trace: String = trace
    ) -> OTLPSpan {
        OTLPSpan(
            traceID: trace, spanID: id, parentSpanID: parent, name: name, kind: "consumer", service: service,
            startUnixNano: t0 + start * 100_000, endUnixNano: t0 + end * 100_000, attributes: attributes,
            events: events)
    }

    @Test func drawsTheSpansAsATreeByParentWithChildrenByStartAndEventsBeneathTheirSpan() {
        // Given out of order: the tree follows the parents, each span's children by start time.
        let spans = [
            Self.span(
                "cccccccccccccccc", parent: "bbbbbbbbbbbbbbbb", "POST", service: "herald-send", start: 60, end: 85,
                attributes: [
                    "herald.provider": .string("apns"), "http.response.status_code": .int(200),
                    "server.address": .string("127.0.0.1"),
                ]),
            Self.span(
                "bbbbbbbbbbbbbbbb", parent: "aaaaaaaaaaaaaaaa", "herald-send process", service: "herald-send",
                start: 50, end: 90,
                attributes: ["herald.wait_in_topic_ms": .int(3), "herald.event_id": .string("m-1")],
                events: [
                    OTLPSpanEvent(
                        name: "delivered", timeUnixNano: Self.t0 + 88 * 100_000,
                        attributes: [
                            "herald.reason": .string("ok"), "herald.user": .string("u2"), "herald.detail": .string(""),
                        ])
                ]),
            Self.span(
                "dddddddddddddddd", parent: "aaaaaaaaaaaaaaaa", "herald-registry process", service: "herald-registry",
                start: 20, end: 30),
            Self.span("aaaaaaaaaaaaaaaa", "herald-ingest process", service: "herald-ingest", start: 0, end: 12),
        ]
        let expected = """
            trace 4bf92f3577b34da6a3ce929d0e0e4736  4 spans, 9.0 ms
              herald-ingest process  [herald-ingest]  1.2 ms  +0.0 ms
                herald-registry process  [herald-registry]  1.0 ms  +2.0 ms
                herald-send process  [herald-send]  4.0 ms  +5.0 ms  herald.wait_in_topic_ms=3
                  - delivered  +8.8 ms  herald.reason=ok herald.user=u2
                  POST  [herald-send]  2.5 ms  +6.0 ms  herald.provider=apns http.response.status_code=200
            """
        #expect(TraceView.render(spans) == expected)
    }

    @Test func aSpanWhoseParentIsElsewhereIsARootAndAnErrorIsShown() {
        var failed = Self.span(
            "bbbbbbbbbbbbbbbb", parent: "9999999999999999", "POST", service: "herald-send", start: 10, end: 10,
            attributes: ["herald.reason": .string("BadDeviceToken"), "herald.provider": .string("")])
        failed.status = OTLPStatus(code: "error", message: "400")
        let text = TraceView.render([failed])
        #expect(
            text == """
                trace 4bf92f3577b34da6a3ce929d0e0e4736  1 span, 0.0 ms
                  POST  [herald-send]  0.0 ms  +0.0 ms  herald.reason=BadDeviceToken  error: 400
                """)
    }

    @Test func tracesAreDrawnApartInTheOrderTheyStarted() {
        let later = Self.span(
            "aaaaaaaaaaaaaaaa", "second", service: "s", start: 50, end: 60, trace: String(repeating: "2", count: 32))
        let earlier = Self.span(
            "bbbbbbbbbbbbbbbb", "first", service: "s", start: 0, end: 10, trace: String(repeating: "1", count: 32))
        let lines = TraceView.render([later, earlier]).split(separator: "\n")
        #expect(lines.count == 4)
        #expect(lines[0].hasPrefix("trace 1111") && lines[1].contains("first"))
        #expect(lines[2].hasPrefix("trace 2222") && lines[3].contains("second") && lines[3].contains("+0.0 ms"))
    }

    @Test func aCycleOfParentsOrAnEndBeforeTheStartStillDrawsEachSpanOnce() {
        let a = Self.span("aaaaaaaaaaaaaaaa", parent: "bbbbbbbbbbbbbbbb", "a", service: "s", start: 5, end: 1)
        let b = Self.span("bbbbbbbbbbbbbbbb", parent: "aaaaaaaaaaaaaaaa", "b", service: "s", start: 6, end: 7)
        let lines = TraceView.render([a, b]).split(separator: "\n")
        #expect(lines.count == 3)
        #expect(lines[1] == "  a  [s]  0.0 ms  +0.0 ms" && lines[2] == "    b  [s]  0.1 ms  +0.1 ms")
        #expect(TraceView.render([]) == "")
    }

    @Test func theStoreKeepsTheNewestSpansAndFindsAnEventsTraces() {
        var store = OTLPSpanStore(maxSpans: 3)
        let other = String(repeating: "e", count: 32)
        store.add([
            Self.span("0000000000000001", "old", service: "s", start: 0, end: 1, trace: other),
            Self.span("aaaaaaaaaaaaaaaa", "ingest", service: "s", start: 5, end: 6),
        ])
        store.add([
            Self.span(
                "bbbbbbbbbbbbbbbb", parent: "aaaaaaaaaaaaaaaa", "send", service: "s", start: 7, end: 8,
                attributes: ["herald.event_id": .string("m-1")]),
            Self.span("cccccccccccccccc", parent: "aaaaaaaaaaaaaaaa", "resolve", service: "s", start: 6, end: 7),
        ])
        #expect(store.all.count == 3 && store.dropped == 1, "the oldest span was dropped")
        #expect(store.spans(eventID: "m-1").map(\.name) == ["ingest", "resolve", "send"], "the whole trace, by start")
        #expect(store.spans(eventID: "m-2").isEmpty && store.spans(traceID: other).isEmpty)
        #expect(store.spans(traceID: Self.trace.uppercased()).count == 3)
    }

    @Test func theJSONRoundTripsEveryValueKind() throws {
        let span = Self.span(
            "aaaaaaaaaaaaaaaa", "x", service: "s", start: 1, end: 2,
            attributes: ["a": .string("t"), "b": .int(-4), "c": .bool(false), "d": .double(0.5)],
            events: [OTLPSpanEvent(name: "e", timeUnixNano: 7, attributes: ["f": .int(1)])])
        let json = OTLPSpanStore.json([span])
        #expect(try OTLPSpanStore.spans(fromJSON: json) == [span])
        let text = String(decoding: json, as: UTF8.self)
        #expect(text.contains("\"trace_id\":\"\(Self.trace)\"") && text.contains("\"start_unix_nano\":"))
    }
}
