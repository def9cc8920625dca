// The span exporter: the bounded queue, batches sent when full or at the interval, what is left sent at shutdown,
// a collector that refuses or never answers, and the request body read by OpenTelemetry's own protobuf classes.

import Foundation
import HeraldConfig
import HeraldTestSupport
import Logging
import ServiceLifecycle
import Synchronization
import Testing

@testable import HeraldTracing

@Suite(.serialized) struct SpanExportTests {
    static let parent = TraceContext(
        traceIDHigh: 0x4bf9_2f35_77b3_4da6, traceIDLow: 0xa3ce_929d_0e0e_4736, spanID: 0x00f0_67aa_0ba9_02b7, flags: 1,
        traceState: "vendor=abc")
    static let start: UInt64 = 1_700_000_000_000_000_000

    /// Counts of the spans the exporter reported dropped, by reason.
    final class Drops: Sendable {
        let counts = Mutex<[String: Int]>([:])
        func add(_ reason: String, _ count: Int) { counts.withLock { $0[reason, default: 0] += count } }
        var all: [String: Int] { counts.withLock { $0 } }
    }

    static func export(
        to port: Int, queue: Int = 2_048, batch: Int = 512, intervalMs: Int = 60_000, drops: Drops,
        headers: String? = nil
    ) throws -> SpanExport {
        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:\(port)"
        file.maxQueueSpans = queue
        file.maxBatchSpans = batch
        file.exportIntervalMs = intervalMs
        let environment = headers.map { ["OTEL_EXPORTER_OTLP_HEADERS": $0] } ?? [:]
        var settings = try TracingSettings(file: file, environment: environment, stage: "herald-test")
        settings.exportTimeout = .seconds(5)
        return try SpanExport(settings: settings, logger: Logger(label: "test"), dropped: drops.add)
    }

    /// Records and ends one span named `name` under `parent`.
    @discardableResult
    static func span(_ export: SpanExport, _ name: String) -> EventSpan {
        let span = export.startSpan(name, continuing: parent, kind: .consumer, startNanoseconds: start)
        span.setAttribute("herald.event_id", name)
        span.end(atNanoseconds: start + 1_000)
        return span
    }

    /// Runs the exporter's service in a service group until `body` returns, then shuts it down gracefully and
    /// waits for it.
    static func running(_ export: SpanExport, _ body: () async throws -> Void) async throws {
        let group = ServiceGroup(services: [export.service], logger: Logger(label: "test"))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await body()
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }

    static func names(_ receiver: OTLPReceiver) -> [String] {
        receiver.received.flatMap { body in
            ["first", "second", "third", "fourth", "fifth", "sixth"].filter {
                OTLPReceiver.find(Array("event-\($0)".utf8), in: body) != nil
            }
        }
    }

    @Test("a full batch is sent at once, without waiting for the interval")
    func fullBatch() async throws {
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let drops = Drops()
        let export = try Self.export(to: receiver.port, batch: 3, drops: drops)
        try await Self.running(export) {
            for name in ["first", "second", "third"] { Self.span(export, "event-\(name)") }
            try await waitUntil("the full batch is exported", timeout: .seconds(60)) { receiver.received.count == 1 }
            #expect(Self.names(receiver) == ["first", "second", "third"])
        }
        #expect(drops.all.isEmpty)
    }

    @Test("spans that do not fill a batch are sent at the interval")
    func interval() async throws {
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let drops = Drops()
        let export = try Self.export(to: receiver.port, batch: 100, intervalMs: 50, drops: drops)
        try await Self.running(export) {
            Self.span(export, "event-first")
            try await waitUntil("the span is exported", timeout: .seconds(60)) { !receiver.received.isEmpty }
            Self.span(export, "event-second")
            try await waitUntil("the next one too", timeout: .seconds(60)) { receiver.received.count == 2 }
        }
        #expect(Self.names(receiver) == ["first", "second"] && drops.all.isEmpty)
    }

    @Test("what is queued when the stage stops is sent before the service returns")
    func shutdownSendsTheRest() async throws {
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let drops = Drops()
        let export = try Self.export(to: receiver.port, batch: 2, drops: drops)
        try await Self.running(export) {
            for name in ["first", "second"] { Self.span(export, "event-\(name)") }
            try await waitUntil("the full batch is exported", timeout: .seconds(60)) { receiver.received.count == 1 }
            // Alone, it waits for the interval (a minute): the stage stops first.
            Self.span(export, "event-third")
        }
        // The service returned: the last span went with it, in a batch of its own.
        #expect(receiver.received.count == 2 && Self.names(receiver) == ["first", "second", "third"])
        #expect(drops.all.isEmpty)
    }

    @Test("cancelled instead of shut down, the service sends what is queued and returns")
    func cancelled() async throws {
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let drops = Drops()
        let export = try Self.export(to: receiver.port, batch: 10, drops: drops)
        let running = Task { try await export.service.run() }
        Self.span(export, "event-first")
        running.cancel()
        try await running.value
        #expect(Self.names(receiver) == ["first"] && drops.all.isEmpty)
    }

    @Test("a span that finds the queue full is dropped and counted; the caller never waits")
    func queueFull() async throws {
        let drops = Drops()
        // The service is not running: nothing leaves the queue of 4.
        let export = try Self.export(to: try freePort(), queue: 4, batch: 2, drops: drops)
        for index in 0..<6 { Self.span(export, "event-\(index)") }
        #expect(drops.all == ["queue_full": 2])
        #expect(export.queue.take().count == 2 && export.queue.take().count == 2 && export.queue.take().isEmpty)
    }

    @Test("a span ends once: a second end and later changes are ignored")
    func endsOnce() async throws {
        let drops = Drops()
        let export = try Self.export(to: try freePort(), batch: 10, drops: drops)
        let span = Self.span(export, "event-first")
        span.setAttribute("late", "x")
        span.end(atNanoseconds: Self.start + 5_000)
        let queued = export.queue.take()
        #expect(queued.count == 1)
        #expect(queued.first?.attribute("late") == nil && queued.first?.endNanoseconds == Self.start + 1_000)
    }

    @Test("a refused export drops its batch, counted, and the next export is tried")
    func refused() async throws {
        let drops = Drops()
        let export = try Self.export(to: try freePort(), batch: 2, drops: drops)
        try await Self.running(export) {
            for index in 0..<4 { Self.span(export, "event-\(index)") }
            try await waitUntil("both batches fail", timeout: .seconds(60)) { drops.all["export_failed"] == 4 }
        }
        #expect(drops.all == ["export_failed": 4])
    }

    @Test("a collector that never answers: its batch is dropped after the timeout, and shutdown still returns")
    func hungCollector() async throws {
        let silent = try OTLPReceiver(answering: false)
        defer { silent.stop() }
        let drops = Drops()
        let export = try Self.export(to: silent.port, batch: 1, drops: drops)
        try await Self.running(export) {
            Self.span(export, "event-first")
            try await waitUntil("the request reaches the collector", timeout: .seconds(60)) { silent.accepted > 0 }
            Self.span(export, "event-second")
        }
        // Both spans are accounted for: the one in flight and the one left in the queue at shutdown.
        #expect(drops.all == ["export_failed": 2])
    }

    @Test("OpenTelemetry's own protobuf classes read the export request: ids, kind, times, attributes, events, status")
    func officialDecoding() async throws {
        var span = SpanRecord(
            traceIDHigh: Self.parent.traceIDHigh, traceIDLow: Self.parent.traceIDLow, spanID: 0x1122_3344_5566_7788,
            parentSpanID: Self.parent.spanID, flags: 1, traceState: "vendor=abc", name: "herald-send process",
            kind: .consumer, startNanoseconds: Self.start)
        span.endNanoseconds = Self.start + 2_000_000
        span.set("herald.event_id", .string("m 1/ü"))
        span.set("herald.wait_in_topic_ms", .int(-7))
        span.set("messaging.kafka.offset", .int(Int64.max))
        span.events.append(
            SpanEventRecord(
                name: "suppressed", timeNanoseconds: Self.start + 1_000, attributes: [("herald.reason", .string("dnd"))]
            ))
        span.errorDescription = "invalid"
        var root = SpanRecord(
            traceIDHigh: 1, traceIDLow: 2, spanID: 3, parentSpanID: 0, flags: 1, traceState: nil, name: "POST",
            kind: .client, startNanoseconds: 5)
        root.endNanoseconds = 6
        let body = OTLPEncoding.exportRequest(
            [span, root], resource: [("service.name", .string("herald-send")), ("k8s.pod.name", .string("p-1"))])

        let dir = try temporaryDirectory("otlp-official")
        try Data(body).write(to: URL(fileURLWithPath: dir + "/request.bin"))
        let python = Paths.packageRoot + "/.venv/bin/python"
        let script = """
            import json, sys
            from google.protobuf.json_format import MessageToDict
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
            request = ExportTraceServiceRequest()
            request.ParseFromString(open(sys.argv[1], 'rb').read())
            print(json.dumps(MessageToDict(request), sort_keys=True))
            """
        let result = try await runToolAsync(python, ["-c", script, dir + "/request.bin"])
        #expect(result.status == 0, "run scripts/setup.sh (opentelemetry-proto in .venv): \(result.output)")
        let decoded = try #require(
            try JSONSerialization.jsonObject(with: Data(result.output.utf8)) as? [String: Any])
        let resourceSpans = try #require((decoded["resourceSpans"] as? [[String: Any]])?.first)
        let resource = try #require((resourceSpans["resource"] as? [String: Any])?["attributes"] as? [[String: Any]])
        #expect(
            Self.values(resource) == ["service.name": "stringValue=herald-send", "k8s.pod.name": "stringValue=p-1"])
        let scope = try #require((resourceSpans["scopeSpans"] as? [[String: Any]])?.first)
        #expect((scope["scope"] as? [String: Any])?["name"] as? String == "herald")
        let spans = try #require(scope["spans"] as? [[String: Any]])
        #expect(spans.count == 2)
        let first = spans[0]
        // MessageToDict writes bytes in base64 and 64-bit integers as decimal strings.
        #expect(first["traceId"] as? String == Data(Self.hex("4bf92f3577b34da6a3ce929d0e0e4736")).base64EncodedString())
        #expect(first["spanId"] as? String == Data(Self.hex("1122334455667788")).base64EncodedString())
        #expect(first["parentSpanId"] as? String == Data(Self.hex("00f067aa0ba902b7")).base64EncodedString())
        #expect(first["traceState"] as? String == "vendor=abc")
        #expect(first["name"] as? String == "herald-send process" && first["kind"] as? String == "SPAN_KIND_CONSUMER")
        #expect(first["startTimeUnixNano"] as? String == String(Self.start))
        #expect(first["endTimeUnixNano"] as? String == String(Self.start + 2_000_000))
        #expect(first["flags"] as? Int == 1)
        let attributes = try #require(first["attributes"] as? [[String: Any]])
        #expect(
            Self.values(attributes) == [
                "herald.event_id": "stringValue=m 1/ü", "herald.wait_in_topic_ms": "intValue=-7",
                "messaging.kafka.offset": "intValue=\(Int64.max)",
            ])
        let events = try #require(first["events"] as? [[String: Any]])
        #expect(events.count == 1 && events[0]["name"] as? String == "suppressed")
        #expect(events[0]["timeUnixNano"] as? String == String(Self.start + 1_000))
        #expect(
            Self.values(try #require(events[0]["attributes"] as? [[String: Any]])) == [
                "herald.reason": "stringValue=dnd"
            ])
        let status = try #require(first["status"] as? [String: Any])
        #expect(status["code"] as? String == "STATUS_CODE_ERROR" && status["message"] as? String == "invalid")
        let second = spans[1]
        #expect(second["parentSpanId"] == nil && second["traceState"] == nil && second["status"] == nil)
        #expect(second["kind"] as? String == "SPAN_KIND_CLIENT" && second["name"] as? String == "POST")
    }

    /// OTLP key-values as MessageToDict writes them, read as `key: "type=value"`.
    static func values(_ keyValues: [[String: Any]]) -> [String: String] {
        var result: [String: String] = [:]
        for keyValue in keyValues {
            guard let key = keyValue["key"] as? String, let value = keyValue["value"] as? [String: Any],
                let (type, content) = value.first
            else { continue }
            result[key] = "\(type)=\(content)"
        }
        return result
    }

    static func hex(_ text: String) -> [UInt8] {
        stride(from: 0, to: text.count, by: 2).map { offset in
            let start = text.index(text.startIndex, offsetBy: offset)
            return UInt8(text[start..<text.index(start, offsetBy: 2)], radix: 16) ?? 0
        }
    }
}
