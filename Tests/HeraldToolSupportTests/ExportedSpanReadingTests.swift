import Foundation
import HeraldConfig
import HeraldTestSupport
import HeraldToolSupport
import HeraldTracing
import Logging
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The OTLP reader against the bytes the stages send (HeraldTracing's `SpanExport`), first to a receiver that only
/// keeps bodies, then to herald-mock-otlp and read back through `heraldctl trace`. The reader and the exporter's
/// writer share no code; `OTLPOfficialDecodingTests` reads the same bytes with OpenTelemetry's own classes.
@Suite(.serialized) struct ExportedSpanReadingTests {
    /// An exporter to a collector on loopback `port`, exporting every 50 ms, and the task running its service.
    static func exporter(to port: Int, stage: String) throws -> (SpanExport, Task<Void, any Error>) {
        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:\(port)"
        file.exportIntervalMs = 50
        file.resourceAttributes = ["deployment.environment": "test"]
        let export = try SpanExport(
            settings: try TracingSettings(file: file, environment: [:], stage: stage), logger: Logger(label: "test"))
        return (export, Task { try await export.service.run() })
    }

    static let parent = TraceContext(
        traceIDHigh: 0x4bf9_2f35_77b3_4da6, traceIDLow: 0xa3ce_929d_0e0e_4736, spanID: 0x00f0_67aa_0ba9_02b7, flags: 1)
    static let start: UInt64 = 1_700_000_000_000_000_000

    /// One consumer span under `parent` with the attributes and an event a stage gives it, ended 2 ms after it began.
    static func exportOneSpan(_ export: SpanExport, event: String) -> EventSpan {
        let span = export.startSpan(
            "herald-send process", continuing: parent, kind: .consumer, startNanoseconds: start)
        span.setAttribute("herald.event_id", event)
        span.setAttribute("herald.wait_in_topic_ms", Int64(7))
        span.addEvent("delivered", atNanoseconds: start + 1_000_000, attributes: ["herald.reason": "ok"])
        span.end(atNanoseconds: start + 2_000_000)
        return span
    }

    @Test func decodesTheSpansTheExporterSends() async throws {
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let (export, exporting) = try Self.exporter(to: receiver.port, stage: "herald-send")
        defer { exporting.cancel() }
        let span = Self.exportOneSpan(export, event: "m-1")

        var decoded: [OTLPSpan] = []
        try await waitUntil("the span is exported", timeout: .seconds(60)) {
            decoded = try receiver.received.flatMap { try OTLPTraces.decodeExportRequest($0) }
            return !decoded.isEmpty
        }
        let got = try #require(decoded.first)
        #expect(decoded.count == 1)
        #expect(got.traceID == Self.parent.traceIDHex && got.parentSpanID == Self.parent.spanIDHex)
        #expect(got.spanID == span.context.spanIDHex && got.spanID != Self.parent.spanIDHex)
        #expect(got.name == "herald-send process" && got.kind == "consumer" && got.service == "herald-send")
        #expect(got.resource["deployment.environment"] == .string("test"))
        #expect(got.startUnixNano == Self.start && got.endUnixNano == Self.start + 2_000_000)
        #expect(got.attributes["herald.event_id"] == .string("m-1"))
        #expect(got.attributes["herald.wait_in_topic_ms"] == .int(7))
        #expect(
            got.events == [
                OTLPSpanEvent(
                    name: "delivered", timeUnixNano: Self.start + 1_000_000,
                    attributes: ["herald.reason": .string("ok")])
            ])
        #expect(got.status.code == "unset")
    }

    /// POSTs `body` to `/v1/traces` on `port` with `contentType`; the answer's status.
    static func post(_ port: Int, _ body: [UInt8], contentType: String = "application/x-protobuf") async throws -> Int?
    {
        let fd = try TestHTTP.connectLoopback(port: port, receiveTimeoutSeconds: 60)
        defer { close(fd) }
        let head =
            "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \(contentType)\r\n"
            + "Content-Length: \(body.count)\r\nConnection: close\r\n\r\n"
        try HostileClients.send(fd, Array(head.utf8) + body)
        return HostileClients.status(try await HostileClients.readUntilClosed(fd, guardSeconds: 60).bytes)
    }

    @Test func theStandInKeepsExportedSpansAndHeraldctlDrawsTheEventsTrace() async throws {
        let mock = try Paths.executable("herald-mock-otlp")
        let heraldctl = try Paths.executable("heraldctl")
        let dir = try temporaryDirectory("herald-mock-otlp")
        let port = try freePort()
        let child = ChildProcess(
            name: "herald-mock-otlp", executable: mock, arguments: ["--port", String(port), "--max-spans", "100"],
            logPath: dir + "/mock-otlp.log")
        try child.start()
        defer { child.stopNow() }
        try await waitUntil("herald-mock-otlp answers /healthz", timeout: .seconds(60)) {
            (try? await TestHTTP.request(port: port, method: "GET", path: "/healthz"))?.status == 200
        }

        let (export, exporting) = try Self.exporter(to: port, stage: "herald-send")
        defer { exporting.cancel() }
        let span = Self.exportOneSpan(export, event: "m 1/ü")
        var answer: TestHTTP.Answer?
        try await waitUntil("the stand-in has the event's span", timeout: .seconds(60)) {
            answer = try await TestHTTP.request(port: port, method: "GET", path: "/v1/spans?event_id=m%201%2F%C3%BC")
            return answer?.status == 200 && answer?.body.contains(span.context.spanIDHex) == true
        }
        let spans = try OTLPSpanStore.spans(fromJSON: Array(try #require(answer).body.utf8))
        #expect(spans.map(\.spanID) == [span.context.spanIDHex] && spans.first?.service == "herald-send")
        let byTrace = try await TestHTTP.request(
            port: port, method: "GET", path: "/v1/spans?trace_id=\(Self.parent.traceIDHex)")
        #expect(try OTLPSpanStore.spans(fromJSON: Array(byTrace.body.utf8)) == spans)
        let none = try await TestHTTP.request(port: port, method: "GET", path: "/v1/spans?event_id=m-2")
        #expect(none.status == 200)
        #expect(try OTLPSpanStore.spans(fromJSON: Array(none.body.utf8)).isEmpty)
        #expect(try await TestHTTP.request(port: port, method: "GET", path: "/v1/spans?trace=1").status == 400)
        let all = try await TestHTTP.request(port: port, method: "GET", path: "/v1/spans")
        #expect(try OTLPSpanStore.spans(fromJSON: Array(all.body.utf8)) == spans, "every span kept")

        // What it cannot read is refused; a valid request it can.
        #expect(try await Self.post(port, [0x0A, 0x05, 0x01]) == 400)
        #expect(try await Self.post(port, [], contentType: "application/json") == 415)
        let handBuilt = Proto.request(
            service: "herald-ingest",
            spans: [
                Proto.message(1, Proto.bytes(hex: Self.parent.traceIDHex))
                    + Proto.message(2, Proto.bytes(hex: Self.parent.spanIDHex)) + Proto.string(5, "chat back end")
                    + Proto.fixed64(7, Self.start - 3_000_000) + Proto.fixed64(8, Self.start + 5_000_000)
            ])
        #expect(try await Self.post(port, handBuilt) == 200)

        // heraldctl trace: the tree, the sender's span at its root and the stage's span under it.
        let tree = try await runToolAsync(heraldctl, ["trace", "m 1/ü", "--receiver", "http://127.0.0.1:\(port)"])
        #expect(tree.status == 0, "\(tree.output)")
        let lines = tree.output.split(separator: "\n").map(String.init)
        #expect(lines.first == "trace \(Self.parent.traceIDHex)  2 spans, 8.0 ms", "\(tree.output)")
        #expect(lines.dropFirst().first == "  chat back end  [herald-ingest]  8.0 ms  +0.0 ms", "\(tree.output)")
        #expect(
            lines.dropFirst(2).first
                == "    herald-send process  [herald-send]  2.0 ms  +3.0 ms  herald.wait_in_topic_ms=7",
            "\(tree.output)")
        #expect(lines.dropFirst(3).first == "      - delivered  +4.0 ms  herald.reason=ok", "\(tree.output)")
        let json = try await runToolAsync(
            heraldctl, ["trace", "m 1/ü", "--receiver", "http://127.0.0.1:\(port)", "--json"])
        #expect(json.status == 0)
        #expect(try OTLPSpanStore.spans(fromJSON: Array(json.output.utf8)).count == 2)

        // No span of the event, or no receiver: exit 1 with a message.
        let missing = try await runToolAsync(heraldctl, ["trace", "m-2", "--receiver", "http://127.0.0.1:\(port)"])
        #expect(missing.status == 1 && missing.output.contains("has no span of event m-2"), "\(missing.output)")
        let closed = try freePort()
        let unreachable = try await runToolAsync(
            heraldctl, ["trace", "m-1", "--receiver", "http://127.0.0.1:\(closed)"])
        #expect(unreachable.status == 1 && unreachable.output.contains("cannot reach"), "\(unreachable.output)")
    }

    @Test func theStandInDropsTheOldestSpansBeyondItsBound() async throws {
        let mock = try Paths.executable("herald-mock-otlp")
        let dir = try temporaryDirectory("herald-mock-otlp")
        let port = try freePort()
        let child = ChildProcess(
            name: "herald-mock-otlp", executable: mock, arguments: ["--port", String(port), "--max-spans", "2"],
            logPath: dir + "/mock-otlp.log")
        try child.start()
        defer { child.stopNow() }
        try await waitUntil("herald-mock-otlp answers /healthz", timeout: .seconds(60)) {
            (try? await TestHTTP.request(port: port, method: "GET", path: "/healthz"))?.status == 200
        }
        let trace = String(repeating: "ab", count: 16)
        func span(_ id: String) -> [UInt8] {
            Proto.message(1, Proto.bytes(hex: trace)) + Proto.message(2, Proto.bytes(hex: id)) + Proto.string(5, id)
                + Proto.message(9, Proto.attribute("herald.event_id", Proto.stringValue("e")))
        }
        for id in ["0000000000000001", "0000000000000002", "0000000000000003"] {
            #expect(try await Self.post(port, Proto.request(service: "s", spans: [span(id)])) == 200)
        }
        let answer = try await TestHTTP.request(port: port, method: "GET", path: "/v1/spans?trace_id=\(trace)")
        #expect(
            try OTLPSpanStore.spans(fromJSON: Array(answer.body.utf8)).map(\.name)
                == ["0000000000000002", "0000000000000003"])
    }
}
