import HeraldConfig
import HeraldKafka
import HeraldTracing
import Logging
import Testing

@testable import HeraldStage

// A traced record's span starts at its Kafka timestamp, which the producer sets: any value must start a span.

@Suite struct SpanTimestampTests {
    @Test("a timestamp far in the future or before the epoch starts the span at the processing time, never traps")
    func extremeTimestamps() throws {
        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:9"
        let export = try SpanExport(
            settings: try TracingSettings(file: file, environment: [:], stage: "herald-echo"),
            logger: Logger(label: "test"))
        let tracing = StageTracing(sampler: TraceSampler(ratio: 1), entryTopics: ["in"], export: export)
        let batch = [Int64.max, Int64.min, -1, 1_700_000_000_000].map {
            ConsumerRecord(
                topic: "in", partition: 0, offset: 0, key: nil, value: [1],
                timestamp: KafkaTimestamp(millisecondsSinceEpoch: $0, kind: .createTime))
        }
        let processing: UInt64 = 1_800_000_000_000_000_000
        var generator = SplitMix64(seed: 7)
        var traces: [TraceContext?] = []
        for _ in batch { traces.append(TraceSampler.newTrace(using: &generator)) }
        let (spans, contexts) = tracing.startSpans(batch, traces: traces, processingStarted: processing)
        #expect(spans.count == 4 && contexts.allSatisfy { $0 != nil })
        for span in spans.values { span.end(atNanoseconds: processing) }
    }
}
