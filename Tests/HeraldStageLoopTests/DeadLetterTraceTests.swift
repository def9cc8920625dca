import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldStage
import HeraldTestSupport
import HeraldTracing
import Logging
import Synchronization
import Testing

// What a processor sees of a traced input (`StageInput.trace`) and the trace context on a traced event's dead letter
// (docs/operations.md, "Tracing").

/// Dead-letters every input, and keeps the `trace` each input arrived with, by value.
struct DeadLetteringProcessor: StageProcessor {
    final class Seen: Sendable {
        let inputs = Mutex<[String: TracePropagation?]>([:])
    }
    let stage = "refuse"
    let seen = Seen()
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        seen.inputs.withLock { seen in
            for input in batch { seen[String(decoding: input.value ?? [], as: UTF8.self)] = input.trace }
        }
        return batch.map { _ in .dlq("invalid", "refused by the test") }
    }
}

@Suite(.serialized) struct DeadLetterTraceTests {
    @Test func aTracedInputShowsItsContextToTheProcessorAndItsDeadLetterCarriesIt() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let suffix = UUID().uuidString.prefix(8)
        let input = "in-\(suffix)"
        let dlq = "dlq-\(suffix)"
        try await broker.createTopics([(input, 1), (dlq, 1)])
        let plain = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        try await plain.sendAll(StageLoopTracingTests.inputs.map { $0.with(topic: input) })
        try await plain.shutdown()

        var consumerConfiguration = KafkaConsumerConfiguration(
            brokers: broker.brokers, groupID: "dlq-trace-\(suffix)", topics: [input])
        consumerConfiguration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        var configuration = StageLoopConfiguration(dlqTopic: dlq)
        // Past the entry points (the input topic is not one): only the sampled context is traced.
        configuration.tracing = StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: [])
        let processor = DeadLetteringProcessor()
        let loop = StageLoop(
            consumer: consumer, producer: producer, processor: processor, configuration: configuration,
            metrics: StageMetrics(stage: "refuse"), logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        let letters = try await collect(topics: [dlq], count: 4, brokers: broker.brokers)
        loop.stop()
        try await running.value

        let seen = processor.seen.inputs.withLock { $0 }
        let sampled = try #require(seen["sampled"] ?? nil, "the traced input reaches the processor with its context")
        let context = try #require(TraceContext(traceparent: sampled.traceparent, tracestate: sampled.tracestate))
        let incoming = try #require(TraceContext(traceparent: Array(StageLoopTracingTests.sampled.utf8)))
        #expect(context.traceIDHex == incoming.traceIDHex && context.isSampled)
        #expect(sampled.tracestate.map { String(decoding: $0, as: UTF8.self) } == "congo=t61")
        for name in ["unsampled", "none", "invalid"] {
            #expect(seen.keys.contains(name) && seen[name] == .some(nil), "\(name) is not traced")
        }

        #expect(letters.count == 4)
        for letter in letters {
            let original = try StageCodec.decode(DLQRecord.self, from: letter.value ?? [])
            let name = String(decoding: Data(base64Encoded: original.original) ?? Data(), as: UTF8.self)
            let parent = StageLoopTracingTests.traceparent(letter.headers)
            if name == "sampled" {
                #expect(
                    parent == String(decoding: sampled.traceparent, as: UTF8.self),
                    "the dead letter carries the context the processor saw")
            } else {
                #expect(parent == nil, "\(name)'s dead letter carries no context")
            }
        }
    }
}

extension ProducerRecord {
    fileprivate func with(topic: String) -> ProducerRecord {
        ProducerRecord(topic: topic, key: key, value: value, headers: headers)
    }
}
