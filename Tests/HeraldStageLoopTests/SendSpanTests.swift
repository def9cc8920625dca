import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldStage
import HeraldTestSupport
import HeraldTracing
import Logging
import Synchronization
import Testing

// send's spans through the stage loop, against Tansu and a collector stand-in: one span per provider request of a
// traced event, a child of the send stage's span, and the event's ids on the stage's span (docs/operations.md,
// "Tracing").

/// Answers by token (200 for any other), after the retries `retries` lists for the token, and says every request
/// goes to `api.push.example:443`.
private struct AnsweringTransport: PushTransport {
    let answers: [String: PushAnswer]
    var retries: [String: [ProviderRetry]] = [:]
    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        await send(jobs, onAnswer: onAnswer, onRetry: { _, _ in })
    }
    func send(
        _ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async {
        for (index, job) in jobs.enumerated() {
            for retry in retries[job.request.token] ?? [] { onRetry(index, retry) }
            onAnswer(index, answers[job.request.token] ?? .answered(status: 200, reason: nil, timestamp: nil))
        }
    }
    func server(for job: PushJob) -> ServiceEndpoint? { ServiceEndpoint(host: "api.push.example", port: 443) }
}

/// Claims every pair; remembers nothing.
private struct ClaimingLedger: DeliveryLedger {
    func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds: Int64, now: Int64
    ) async throws -> [ClaimOutcome] { pairs.map { _ in .claimed } }
    func confirm(app: String, pairs: [DeliveryPair], now: Int64) async throws {}
    func release(app: String, pairs: [DeliveryPair], owner: String, now: Int64) async throws {}
}

@Suite(.serialized) struct SendSpanTests {
    static let traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let message = "the message text never leaves"

    /// An outbound record of event `event` to the 64-character token of `c`.
    static func outbound(_ c: Character, event: String) -> (token: String, value: [UInt8]) {
        let token = String(repeating: c, count: 64)
        let request = PushRequest(
            token: token, environment: .production, pushType: .alert, topic: "com.example.chat", priority: 10,
            collapseID: nil, expiration: 0, apnsID: APNsID.derive(eventID: event, token: token),
            payload: Array(#"{"aps":{"alert":"\#(message)"}}"#.utf8))
        let record = OutboundRecord(eventID: event, appID: "app1", recipient: "u2", request: request, attempt: 1)
        return (token, StageCodec.encode(record))
    }

    @Test func eachProviderRequestOfATracedEventIsAClientSpanUnderTheSendSpan() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let (export, exporting) = try StageLoopSpanTests.exporter(to: receiver.port)
        defer { exporting.cancel() }

        let suffix = UUID().uuidString.prefix(8)
        let input = "outbound-\(suffix)"
        let feedback = "feedback-\(suffix)"
        try await broker.createTopics([(input, 1), ("retry-\(suffix)", 1), (feedback, 1), ("dlq", 1)])
        let delivered = Self.outbound("a", event: "evt-delivered")
        let dead = Self.outbound("b", event: "evt-dead")
        let untraced = Self.outbound("c", event: "evt-untraced")
        let parent = [KafkaHeader(key: "traceparent", string: "00-\(Self.traceID)-00f067aa0ba902b7-01")]
        let plain = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        try await plain.sendAll([
            ProducerRecord(topic: input, key: "k", value: delivered.value, headers: parent),
            ProducerRecord(topic: input, key: "k", value: dead.value, headers: parent),
            ProducerRecord(topic: input, key: "k", value: untraced.value),
        ])
        try await plain.shutdown()

        let send = SendProcessor(
            retryTopic: "retry-\(suffix)", tokenFeedbackTopic: feedback,
            transport: AnsweringTransport(
                answers: [dead.token: .answered(status: 410, reason: .unregistered, timestamp: 1_731_999_000_000)],
                retries: [
                    delivered.token: [
                        ProviderRetry(
                            timeNanoseconds: 1_800_000_000_000_000_000, status: 503, reason: "ServiceUnavailable"),
                        ProviderRetry(
                            timeNanoseconds: 1_800_000_000_100_000_000, status: nil, reason: "ConnectionLost"),
                    ],
                    untraced.token: [ProviderRetry(timeNanoseconds: 1, status: 500, reason: "InternalServerError")],
                ]),
            ledger: ClaimingLedger())
        var consumerConfiguration = KafkaConsumerConfiguration(
            brokers: broker.brokers, groupID: "send-\(suffix)", topics: [input])
        consumerConfiguration.sessionTimeout = .seconds(3)
        var configuration = StageLoopConfiguration(dlqTopic: "dlq")
        configuration.tracing = StageTracing(
            sampler: TraceSampler(ratio: 0), entryTopics: [], export: export, stage: "send")
        let loop = StageLoop(
            consumer: try KafkaConsumer(configuration: consumerConfiguration),
            producer: try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers)),
            processor: send, configuration: configuration, metrics: StageMetrics(stage: "send"),
            logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        try await waitUntil("the two send spans and their two request spans are exported", timeout: .seconds(120)) {
            let spans = receiver.spans
            return spans.filter { $0.name == "herald-send process" }.count >= 2
                && spans.filter { $0.name == "POST" }.count >= 2
        }
        loop.stop()
        try await running.value

        let spans = receiver.spans
        let stageSpans = spans.filter { $0.name == "herald-send process" }
        let requests = spans.filter { $0.name == "POST" }
        #expect(stageSpans.count == 2 && requests.count == 2, "one of each per traced event: \(spans.map(\.name))")
        // The stage's spans carry the event's ids (`heraldctl trace <event>` finds them by it).
        let delivering = try #require(stageSpans.first { $0.attributes["herald.event_id"] == "evt-delivered" })
        let dying = try #require(stageSpans.first { $0.attributes["herald.event_id"] == "evt-dead" })
        #expect(delivering.attributes["herald.app_id"] == "app1" && dying.attributes["herald.app_id"] == "app1")
        #expect(delivering.kind == 5, "the stage's span is a consumer's")

        for request in requests {
            #expect(request.traceID == StageLoopSpanTests.bytes(hex: Self.traceID))
            #expect(request.kind == 3, "kind client")
            #expect(request.startNanoseconds > 0 && request.startNanoseconds <= request.endNanoseconds)
            #expect(request.attributes["herald.provider"] == "apns")
            #expect(request.attributes["http.request.method"] == "POST")
            #expect(request.attributes["server.address"] == "api.push.example")
            #expect(request.attributes["server.port"] == "443")
            #expect(request.attributes["herald.attempt"] == "1")
        }
        // Each request is a child of its own event's send span, and says what the provider answered.
        let ok = try #require(requests.first { $0.parentSpanID == delivering.spanID })
        #expect(ok.attributes["http.response.status_code"] == "200" && ok.attributes["error.type"] == nil)
        #expect(ok.attributes["herald.apns_id"] == APNsID.derive(eventID: "evt-delivered", token: delivered.token))
        #expect(ok.statusCode != 2)
        // The transport's own retries before the 200 are events of the request's span, with the answers retried.
        #expect(ok.events.map(\.name) == ["retry", "retry"])
        #expect(ok.events.first?.timeNanoseconds == 1_800_000_000_000_000_000)
        #expect(ok.events.first?.attributes["http.response.status_code"] == "503")
        #expect(ok.events.first?.attributes["herald.reason"] == "ServiceUnavailable")
        #expect(ok.events.last?.attributes["http.response.status_code"] == "none")
        #expect(ok.events.last?.attributes["herald.reason"] == "ConnectionLost")
        let gone = try #require(requests.first { $0.parentSpanID == dying.spanID })
        #expect(gone.attributes["http.response.status_code"] == "410")
        #expect(gone.attributes["herald.reason"] == "Unregistered" && gone.attributes["error.type"] == "410")
        #expect(gone.statusCode == 2, "a failed request's span is an error")
        #expect(gone.events.isEmpty, "no retry, no event")

        // Nothing of the untraced event, and neither a token nor the message text, is in what was exported.
        for body in receiver.received {
            for secret in [delivered.token, dead.token, untraced.token, Self.message, "evt-untraced"] {
                #expect(OTLPReceiver.find(Array(secret.utf8), in: body) == nil, "\(secret) was exported")
            }
        }
    }
}
