import Foundation
import HeraldConfig
import HeraldKafka
import HeraldPipeline
import HeraldStage
import HeraldTestSupport
import HeraldTracing
import Logging
import Synchronization
import Testing

// Trace contexts through the stage loop, against Tansu: read from each input's headers, decided once per input, and
// written on every record produced for it (docs/operations.md, "Tracing").

/// Echoes each input to `outTopic` (noting a suppression of another recipient, `muted_conversation`), and with
/// `ahead` also one record produced ahead through `context.emit`.
struct TracingEchoProcessor: StageProcessor {
    let stage = "echo"
    let outTopic: String
    var ahead = false
    /// More outputs per input (`<value>/r1`, `/r2`, ...), as a fan-out to several recipients.
    var recipients = 1
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        var results: [StageResult] = []
        for (index, input) in batch.enumerated() {
            let text = String(decoding: input.value ?? [], as: UTF8.self)
            if ahead {
                _ = await context.emit?(
                    [StageOutput(topic: outTopic, key: text, value: Array("\(text)/ahead".utf8))], index)
            }
            results.append(
                StageResult(
                    outputs: [StageOutput(topic: outTopic, key: text, value: Array(text.utf8))]
                        + (1..<max(1, recipients)).map {
                            StageOutput(topic: outTopic, key: text, value: Array("\(text)/r\($0)".utf8))
                        },
                    notes: [.suppressed(reason: "muted_conversation")]))
        }
        return results
    }
}

@Suite(.serialized) struct StageLoopTracingTests {
    static let sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    static let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

    /// The inputs every case sends: a sampled context with a tracestate, an unsampled one, none, and one not valid.
    static let inputs: [ProducerRecord] = [
        ProducerRecord(
            topic: "in", key: "k", value: Array("sampled".utf8),
            headers: [
                KafkaHeader(key: "traceparent", string: sampled), KafkaHeader(key: "tracestate", string: "congo=t61"),
            ]),
        ProducerRecord(
            topic: "in", key: "k", value: Array("unsampled".utf8),
            headers: [KafkaHeader(key: "traceparent", string: unsampled)]),
        ProducerRecord(topic: "in", key: "k", value: Array("none".utf8)),
        ProducerRecord(
            topic: "in", key: "k", value: Array("invalid".utf8),
            headers: [KafkaHeader(key: "traceparent", string: "00-xyz-01")]),
    ]

    /// Runs a loop over `inputs` (on a topic of their own) with `tracing`, packing its outputs, and returns the
    /// headers of each output by value.
    static func run(
        _ broker: TansuBroker, tracing: (_ inputTopic: String) -> StageTracing?, ahead: Bool = false,
        recipients: Int = 1
    ) async throws -> [String: [KafkaHeader]] {
        let suffix = UUID().uuidString.prefix(8)
        let input = "in-\(suffix)"
        let output = "out-\(suffix)"
        try await broker.createTopics([(input, 1), (output, 1)])
        let plain = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        try await plain.sendAll(
            inputs.map { ProducerRecord(topic: input, key: "k", value: $0.value, headers: $0.headers) })
        try await plain.shutdown()

        var consumerConfiguration = KafkaConsumerConfiguration(
            brokers: broker.brokers, groupID: "tracing-\(suffix)", topics: [input])
        consumerConfiguration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration)
        var producerConfiguration = KafkaProducerConfiguration(brokers: broker.brokers)
        producerConfiguration.packTopics = [output]
        let producer = try KafkaProducer(configuration: producerConfiguration)
        var configuration = StageLoopConfiguration(dlqTopic: "dlq")
        configuration.tracing = tracing(input)
        let loop = StageLoop(
            consumer: consumer, producer: producer,
            processor: TracingEchoProcessor(outTopic: output, ahead: ahead, recipients: recipients),
            configuration: configuration, metrics: StageMetrics(stage: "echo"), logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        let expected = 4 * (recipients + (ahead ? 1 : 0))
        let records = try await collect(topics: [output], count: expected, brokers: broker.brokers)
        loop.stop()
        try await running.value
        #expect(records.count == expected)
        return Dictionary(records.map { (String(decoding: $0.value ?? [], as: UTF8.self), $0.headers) }) { a, _ in a }
    }

    static func traceparent(_ headers: [KafkaHeader]?) -> String? {
        headers?.first { $0.key == "traceparent" }.flatMap { $0.value }.map { String(decoding: $0, as: UTF8.self) }
    }

    @Test func atAnEntryPointTheSampledFlagIsRespectedAndEventsWithoutAContextAreSampledAtTheRatio() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        // Ratio 1: every event without a (valid) context starts a trace.
        let all = try await Self.run(broker) {
            StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: [$0])
        }
        #expect(
            all["sampled"] == [
                KafkaHeader(key: "traceparent", string: Self.sampled),
                KafkaHeader(key: "tracestate", string: "congo=t61"),
            ], "a sampled context goes on unchanged, with its tracestate")
        #expect(all["unsampled"] == [], "the sender's decision not to sample is kept: no context travels")
        for name in ["none", "invalid"] {
            let parent = try #require(Self.traceparent(all[name]), "\(name) starts a trace")
            let context = try #require(TraceContext(traceparent: Array(parent.utf8)))
            #expect(context.isSampled && all[name]?.count == 1)
        }
        #expect(Self.traceparent(all["none"]) != Self.traceparent(all["invalid"]), "two new traces")

        // Ratio 0: none is started; the sampled context still goes on.
        let none = try await Self.run(broker) {
            StageTracing(sampler: TraceSampler(ratio: 0), entryTopics: [$0])
        }
        #expect(Self.traceparent(none["sampled"]) == Self.sampled)
        #expect(none["unsampled"] == [] && none["none"] == [] && none["invalid"] == [])
    }

    @Test func pastTheEntryPointsOnlySampledContextsTravelIncludingOnOutputsProducedAhead() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let inside = try await Self.run(
            broker,
            tracing: { _ in
                StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: ["chat.events"])
            }, ahead: true)
        #expect(Self.traceparent(inside["sampled"]) == Self.sampled)
        #expect(Self.traceparent(inside["sampled/ahead"]) == Self.sampled)
        for name in ["unsampled", "none", "invalid"] {
            #expect(inside[name] == [] && inside["\(name)/ahead"] == [], "\(name): not traced, no header")
        }
    }

    @Test func aFanOutCarriesTheContextOnItsFirstRecordOnly() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let fanned = try await Self.run(
            broker, tracing: { _ in StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: []) }, recipients: 3)
        #expect(Self.traceparent(fanned["sampled"]) == Self.sampled)
        #expect(fanned["sampled/r1"] == [] && fanned["sampled/r2"] == [], "one chain per event")
    }

    @Test func withTracingOffNoHeaderIsWrittenWhateverTheInputCarries() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let off = try await Self.run(broker) { _ in nil }
        #expect(off.count == 4 && off.values.allSatisfy { $0.isEmpty })
    }
}

@Suite(.serialized) struct StageLoopSpanTests {
    /// The 16 bytes of a trace id / 8 of a span id written in hex.
    static func bytes(hex: String) -> [UInt8] {
        stride(from: 0, to: hex.count, by: 2).map { offset in
            let start = hex.index(hex.startIndex, offsetBy: offset)
            return UInt8(hex[start..<hex.index(start, offsetBy: 2)], radix: 16) ?? 0
        }
    }

    /// A span exporter to a collector on loopback `port`, exporting every 50 ms, and the task running its service.
    static func exporter(to port: Int) throws -> (SpanExport, Task<Void, any Error>) {
        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:\(port)"
        file.exportIntervalMs = 50
        let export = try SpanExport(
            settings: try TracingSettings(file: file, environment: [:], stage: "herald-echo"),
            logger: Logger(label: "test"))
        return (export, Task { try await export.service.run() })
    }

    @Test func eachTracedInputGetsOneSpanExportedOverOTLPAndItsOutputsCarryThatSpanAsParent() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let (export, exporting) = try Self.exporter(to: receiver.port)
        defer { exporting.cancel() }

        let outputs = try await StageLoopTracingTests.run(
            broker,
            tracing: {
                StageTracing(sampler: TraceSampler(ratio: 0), entryTopics: [$0], export: export, stage: "echo")
            }, ahead: true)
        // The sampled input's outputs (the one produced ahead too) continue the trace, under a new parent: the
        // stage's span.
        let parent = try #require(StageLoopTracingTests.traceparent(outputs["sampled"]))
        #expect(StageLoopTracingTests.traceparent(outputs["sampled/ahead"]) == parent)
        let context = try #require(TraceContext(traceparent: Array(parent.utf8)))
        #expect(context.traceIDHex == "4bf92f3577b34da6a3ce929d0e0e4736" && context.isSampled)
        #expect(context.spanIDHex != "00f067aa0ba902b7", "the outputs' parent is the stage's span")
        #expect(outputs["unsampled"] == [] && outputs["none"] == [] && outputs["invalid"] == [])

        // The span reaches the receiver: its trace id, its own id, its parent (the sender's span) and its name.
        try await waitUntil("the span is exported", timeout: .seconds(60)) {
            receiver.received.contains { body in
                OTLPReceiver.find(Self.bytes(hex: context.traceIDHex), in: body) != nil
                    && OTLPReceiver.find(Self.bytes(hex: context.spanIDHex), in: body) != nil
            }
        }
        let body = try #require(
            receiver.received.first { OTLPReceiver.find(Self.bytes(hex: context.spanIDHex), in: $0) != nil })
        #expect(OTLPReceiver.find(Self.bytes(hex: "00f067aa0ba902b7"), in: body) != nil, "parent span id")
        #expect(OTLPReceiver.find(Array("herald-echo process".utf8), in: body) != nil)
        #expect(OTLPReceiver.find(Array("messaging.destination.name".utf8), in: body) != nil)
        // The stage's decisions are events of the span, with the explain trail's reason codes.
        #expect(OTLPReceiver.find(Array("suppressed".utf8), in: body) != nil)
        #expect(OTLPReceiver.find(Array("muted_conversation".utf8), in: body) != nil)
        // Read as OTLP: the span, its trace and its parent, the sender's span.
        let span = try #require(receiver.spans.first { $0.spanID == Self.bytes(hex: context.spanIDHex) })
        #expect(span.traceID == Self.bytes(hex: "4bf92f3577b34da6a3ce929d0e0e4736"))
        #expect(span.parentSpanID == Self.bytes(hex: "00f067aa0ba902b7") && span.name == "herald-echo process")
        // Only the traced event was exported: the other inputs' contexts (one unsampled) never appear.
        #expect(
            receiver.received.allSatisfy {
                OTLPReceiver.find(Self.bytes(hex: "0af7651916cd43dd8448eb211c80319c"), in: $0) == nil
            })
    }

    @Test func anEventWithoutAContextThatTheSamplerChoseGetsARootSpanWhichItsOutputsContinue() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let receiver = try OTLPReceiver()
        defer { receiver.stop() }
        let (export, exporting) = try Self.exporter(to: receiver.port)
        defer { exporting.cancel() }
        let outputs = try await StageLoopTracingTests.run(broker) {
            StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: [$0], export: export, stage: "echo")
        }
        for name in ["none", "invalid"] {
            let parent = try #require(StageLoopTracingTests.traceparent(outputs[name]))
            let context = try #require(TraceContext(traceparent: Array(parent.utf8)))
            try await waitUntil("\(name)'s span is exported", timeout: .seconds(60)) {
                receiver.spans.contains { $0.spanID == Self.bytes(hex: context.spanIDHex) }
            }
            let span = try #require(receiver.spans.first { $0.spanID == Self.bytes(hex: context.spanIDHex) })
            #expect(span.traceID == Self.bytes(hex: context.traceIDHex))
            #expect(span.parentSpanID.isEmpty, "\(name): the root of a new trace")
        }
    }

    @Test func spansACollectorRefusesAreCountedAsDroppedAndTheLoopGoesOn() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:\(try freePort())"  // nobody listens: every export is refused
        file.exportIntervalMs = 50
        var settings = try TracingSettings(file: file, environment: [:], stage: "herald-echo")
        settings.exportTimeout = .seconds(2)
        let dropped = Mutex<[String: Int]>([:])
        let export = try SpanExport(settings: settings, logger: Logger(label: "test")) { reason, count in
            dropped.withLock { $0[reason, default: 0] += count }
        }
        let exporting = Task { try await export.service.run() }
        defer { exporting.cancel() }

        // Ratio 1 at the entry point: three of the four inputs are traced (not the one the sender did not sample).
        let outputs = try await StageLoopTracingTests.run(broker) {
            StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: [$0], export: export, stage: "echo")
        }
        #expect(outputs.count == 4, "every input's output was produced")
        try await waitUntil("the three spans are counted as dropped", timeout: .seconds(60)) {
            dropped.withLock { $0.values.reduce(0, +) } >= 3
        }
        #expect(dropped.withLock { $0 } == ["export_failed": 3])
    }

    /// Dead-letters every input.
    struct Refuser: StageProcessor {
        let stage = "echo"
        func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
            batch.map { _ in .dlq("invalid", "refused by the test") }
        }
    }

    @Test func logLinesAboutATracedEventCarryItsTraceAndSpanIDs() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        try await broker.createTopics([("in", 1), ("dlq", 1)])
        let plain = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        try await plain.sendAll(StageLoopTracingTests.inputs)
        try await plain.shutdown()
        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:\(try freePort())"
        let export = try SpanExport(
            settings: try TracingSettings(file: file, environment: [:], stage: "herald-echo"),
            logger: Logger(label: "t"))
        let exporting = Task { try await export.service.run() }
        defer { exporting.cancel() }

        var consumerConfiguration = KafkaConsumerConfiguration(brokers: broker.brokers, groupID: "logs", topics: ["in"])
        consumerConfiguration.sessionTimeout = .seconds(3)
        var configuration = StageLoopConfiguration(dlqTopic: "dlq")
        configuration.tracing = StageTracing(
            sampler: TraceSampler(ratio: 0), entryTopics: ["in"], export: export, stage: "echo")
        let warnings = Warnings()
        let loop = StageLoop(
            consumer: try KafkaConsumer(configuration: consumerConfiguration),
            producer: try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers)),
            processor: Refuser(), configuration: configuration, metrics: StageMetrics(stage: "echo"),
            logger: warnings.logger)
        let running = Task { try await loop.run() }
        try await waitUntil("the four inputs are dead-lettered", timeout: .seconds(120)) {
            warnings.all.filter { $0.hasPrefix("dead-lettered") }.count >= 4
        }
        loop.stop()
        try await running.value
        let lines = warnings.all.filter { $0.hasPrefix("dead-lettered") }
        let traced = lines.filter { $0.contains("trace_id") }
        #expect(traced.count == 1, "only the sampled input is traced: \(lines)")
        #expect(traced.first?.contains("4bf92f3577b34da6a3ce929d0e0e4736") == true)
        #expect(traced.first?.contains("span_id") == true && traced.first?.contains("00f067aa0ba902b7") == false)
    }
}
