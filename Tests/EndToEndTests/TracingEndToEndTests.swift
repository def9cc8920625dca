// End to end: one message followed from the chat back end's trace to the provider's answer (docs/operations.md,
// "Tracing"). The stack's stages trace at ratio 1 and export over OTLP/HTTP protobuf to herald-mock-otlp, which
// decodes the spans and answers them as JSON.
import Foundation
import HeraldCore
import HeraldKafka
import HeraldTestSupport
import Testing

/// One span as herald-mock-otlp answers it.
struct ReceivedSpan: Sendable {
    var traceID: String
    var spanID: String
    var parentSpanID: String
    var name: String
    var kind: String
    var service: String
    var start: UInt64
    var end: UInt64
    var attributes: [String: String]
    var events: [String]

    init?(_ o: [String: Any]) {
        guard let traceID = o["trace_id"] as? String, let spanID = o["span_id"] as? String,
            let name = o["name"] as? String
        else { return nil }
        self.traceID = traceID
        self.spanID = spanID
        parentSpanID = o["parent_span_id"] as? String ?? ""
        self.name = name
        kind = "\(o["kind"] ?? "")".lowercased()
        service = o["service"] as? String ?? ""
        start = Self.nanoseconds(o["start_unix_nano"])
        end = Self.nanoseconds(o["end_unix_nano"])
        attributes = (o["attributes"] as? [String: Any] ?? [:]).mapValues { "\($0)" }
        events = (o["events"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String }
    }

    static func nanoseconds(_ value: Any?) -> UInt64 {
        if let n = value as? NSNumber { return n.uint64Value }
        if let s = value as? String { return UInt64(s) ?? 0 }
        return 0
    }
}

@Suite("End to end: tracing", .serialized, .e2eTracingStack, .timeLimit(.minutes(10)))
struct TracingEndToEndTests {
    let stack: E2EStack
    init() throws { stack = try E2EStack.shared() }

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
    static let stageSpans = ["ingest", "resolve", "suppress", "render", "send"].map { "herald-\($0) process" }

    /// The spans herald-mock-otlp holds for `query` (`trace_id=<hex>` or `event_id=<id>`), and the answer's text.
    func spans(_ query: String) async throws -> (spans: [ReceivedSpan], body: String) {
        let answer = try await TestHTTP.request(port: stack.otlpPort, method: "GET", path: "/v1/spans?\(query)")
        guard answer.status == 200 else { return ([], answer.body) }
        let object = try JSONSerialization.jsonObject(with: Data(answer.body.utf8))
        let list = (object as? [String: Any])?["spans"] as? [[String: Any]] ?? object as? [[String: Any]] ?? []
        return (list.compactMap(ReceivedSpan.init), answer.body)
    }

    /// Waits until the trace of `query` holds a span of every stage from ingest to send and a provider request.
    func completeTrace(_ query: String) async throws -> (spans: [ReceivedSpan], body: String) {
        var last: (spans: [ReceivedSpan], body: String) = ([], "")
        try await waitUntil(
            "the trace of \(query) holds every stage's span and a provider request", timeout: .seconds(90)
        ) {
            last = try await spans(query)
            let names = Set(last.spans.map(\.name))
            return Self.stageSpans.allSatisfy(names.contains) && last.spans.contains { $0.kind.contains("client") }
        }
        return last
    }

    /// The device `token` of `user` in app5, registered through the registry API (with `traceparent` when given).
    func register(_ user: String, token: String, traceparent: String? = nil) async throws {
        var headers = ["Authorization": "Bearer \(E2EStack.apiToken)"]
        if let traceparent { headers["traceparent"] = traceparent }
        let answer = try await TestHTTP.request(
            port: stack.apiPort, method: "POST", path: "/v1/apps/app5/users/\(user)/devices", headers: headers,
            body: #"{"token": "\#(token)", "bundle_id": "com.example.chat"}"#)
        #expect(answer.status == 202, "\(answer.body)")
        try await waitUntil("\(user)'s device is registered") {
            try await stack.store.loadUser(app: "app5", user: user, now: Self.now()).devices.map(\.token) == [token]
        }
    }

    /// Publishes a message from `sender` to `recipient` in `conversation`, with `headers` on the record.
    func publish(
        _ eventID: String, from sender: String, to recipient: String, in conversation: String, text: String,
        headers: [KafkaHeader] = []
    ) async throws -> ConsumerRecordStamp {
        let event = Scenarios.message(
            eventID, app: "app5", sender: sender, conversation: conversation, text: text, recipients: [recipient],
            createdAt: Self.now())
        let before = Self.now()
        try await stack.produce([
            ProducerRecord(topic: "chat.events", key: conversation, value: Array(event.utf8), headers: headers)
        ])
        return ConsumerRecordStamp(before: before, after: Self.now())
    }

    /// When a record was produced: between `before` and `after`, epoch milliseconds.
    struct ConsumerRecordStamp {
        var before: Int64
        var after: Int64
    }

    func delivered(_ eventID: String, token: String) -> RecordedRequest? {
        let id = APNsID.derive(eventID: eventID, token: token).lowercased()
        return stack.recorded().first { $0.token == token && $0.apnsID == id && $0.status == 200 }
    }

    @Test(
        "an event with a traceparent is followed in the sender's trace through every stage to the provider's answer, in order, without text or token"
    )
    func anEventIsFollowedThroughEveryStageUnderTheGivenParent() async throws {
        let token = String(repeating: "7c", count: 32)
        try await register("tr2", token: token)
        let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
        let parent = "00f067aa0ba902b7"
        let text = "the secret plans for Thursday"
        let stamp = try await publish(
            "trace-e1", from: "tr1", to: "tr2", in: "tc1", text: text,
            headers: [KafkaHeader(key: "traceparent", string: "00-\(traceID)-\(parent)-01")])
        try await waitUntil("trace-e1 delivered", timeout: .seconds(60)) { delivered("trace-e1", token: token) != nil }
        let delivery = try #require(delivered("trace-e1", token: token))

        let (spans, body) = try await completeTrace("trace_id=\(traceID)")
        #expect(spans.allSatisfy { $0.traceID == traceID }, "one trace")
        // One span per stage and one provider request: a message to one recipient is one chain.
        var byName: [String: ReceivedSpan] = [:]
        for name in Self.stageSpans {
            let named = spans.filter { $0.name == name }
            #expect(named.count == 1, "\(name): \(named.count) spans")
            byName[name] = named.first
        }
        let requests = spans.filter { $0.kind.contains("client") }
        #expect(requests.count == 1, "one provider request: \(requests.map(\.name))")
        let ingest = try #require(byName["herald-ingest process"])
        let send = try #require(byName["herald-send process"])
        let request = try #require(requests.first)

        // Under the given parent, each stage the child of the one before, the request the child of send.
        #expect(ingest.parentSpanID == parent, "ingest continues the sender's span")
        for (earlier, later) in zip(Self.stageSpans, Self.stageSpans.dropFirst()) {
            let a = try #require(byName[earlier])
            let b = try #require(byName[later])
            #expect(b.parentSpanID == a.spanID, "\(later) is the child of \(earlier)")
            // The later stage's span starts at its record's timestamp: produced while the earlier span was open.
            #expect(a.start <= b.start && b.start <= a.end, "\(later) starts within \(earlier)'s span")
        }
        #expect(request.parentSpanID == send.spanID)
        #expect(send.start <= request.start && request.start <= request.end && request.end <= send.end)
        // Ingest's span starts at the chat.events record's timestamp (its wait in the topic).
        #expect(
            Int64(ingest.start / 1_000_000) >= stamp.before - 1 && Int64(ingest.start / 1_000_000) <= stamp.after + 1,
            "ingest starts at the record's timestamp (\(ingest.start) ns, produced in [\(stamp.before), \(stamp.after)] ms)"
        )
        for span in spans { #expect(span.start <= span.end, "\(span.name) ends after it starts") }

        // What the spans say.
        #expect(ingest.attributes["herald.event_id"] == "trace-e1" && ingest.attributes["herald.app_id"] == "app5")
        #expect(ingest.attributes["messaging.destination.name"] == "chat.events")
        #expect(request.attributes["herald.provider"] == "apns")
        #expect(request.attributes["http.response.status_code"] == "200")
        #expect(request.attributes["herald.apns_id"]?.lowercased() == delivery.apnsID)
        #expect(Set(spans.map(\.service)).isSuperset(of: ["herald-ingest", "herald-send"]))

        // Neither the message's text nor the full token appears anywhere in what was exported.
        #expect(!body.contains(text) && !body.contains("secret plans"), "message text in the spans")
        #expect(!body.contains(token), "a full token in the spans")
    }

    @Test("an event without a traceparent starts a trace at ratio 1: ingest's span is its root")
    func anEventWithoutAContextStartsANewTrace() async throws {
        let token = String(repeating: "7d", count: 32)
        try await register("tr4", token: token)
        _ = try await publish("trace-e2", from: "tr3", to: "tr4", in: "tc2", text: "hello")
        try await waitUntil("trace-e2 delivered", timeout: .seconds(60)) { delivered("trace-e2", token: token) != nil }
        let (spans, _) = try await completeTrace("event_id=trace-e2")
        let ingest = try #require(spans.first { $0.name == "herald-ingest process" })
        #expect(ingest.parentSpanID.isEmpty || ingest.parentSpanID == "0000000000000000", "a new trace's root")
        #expect(ingest.traceID.count == 32 && spans.allSatisfy { $0.traceID == ingest.traceID })
    }

    @Test(
        "an unsampled traceparent is respected, and at ratio 0 an event without one exports no span; a registry request's traceparent is continued by the registry"
    )
    func unsampledEventsExportNothing() async throws {
        let token = String(repeating: "7e", count: 32)
        let registryTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
        let registryParent = "10f067aa0ba902b8"
        try await register("tr6", token: token, traceparent: "00-\(registryTrace)-\(registryParent)-01")

        // ingest at ratio 0 in place of the stack's, for three events of one conversation (one partition, in order).
        _ = await stack.stopStage("ingest")
        let zero = try stack.startExtraStage("ingest", instance: 2, environment: ["OTEL_TRACES_SAMPLER_ARG": "0"])
        let unsampledTrace = "6bf92f3577b34da6a3ce929d0e0e4738"
        let lastTrace = "7bf92f3577b34da6a3ce929d0e0e4739"
        do {
            _ = try await publish(
                "trace-e3", from: "tr5", to: "tr6", in: "tc3", text: "not traced",
                headers: [KafkaHeader(key: "traceparent", string: "00-\(unsampledTrace)-20f067aa0ba902b9-00")])
            _ = try await publish("trace-e4", from: "tr5", to: "tr6", in: "tc3", text: "not traced either")
            // A sampled event after them: once its spans are in, theirs would be (each stage exports in order).
            _ = try await publish(
                "trace-e5", from: "tr5", to: "tr6", in: "tc3", text: "traced",
                headers: [KafkaHeader(key: "traceparent", string: "00-\(lastTrace)-30f067aa0ba902ba-01")])
            for event in ["trace-e3", "trace-e4", "trace-e5"] {
                try await waitUntil("\(event) delivered", timeout: .seconds(90)) {
                    delivered(event, token: token) != nil
                }
            }
        } catch {
            _ = await stack.stopStage(zero)
            try stack.restartStage("ingest")
            throw error
        }
        _ = await stack.stopStage(zero)
        try stack.restartStage("ingest")
        #expect(await stack.awaitReady("ingest"), "ingest at ratio 1 is back")
        _ = try await completeTrace("trace_id=\(lastTrace)")
        #expect(try await spans("trace_id=\(unsampledTrace)").spans.isEmpty, "the sender's unsampled flag is kept")
        #expect(try await spans("event_id=trace-e3").spans.isEmpty, "an unsampled event exports no span")
        #expect(
            try await spans("event_id=trace-e4").spans.isEmpty, "at ratio 0 an event without a context exports none")

        // The registration's trace holds the registry's span, a child of the request's parent.
        try await waitUntil("the registry's span of the registration", timeout: .seconds(60)) {
            try await spans("trace_id=\(registryTrace)").spans.contains {
                $0.name == "herald-registry process" && $0.parentSpanID == registryParent
            }
        }
    }
}
