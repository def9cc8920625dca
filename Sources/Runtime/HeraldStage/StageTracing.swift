import HeraldKafka
import HeraldTracing
import Synchronization

/// What the stage loop does with trace contexts (docs/operations.md, "Tracing"): read each input's `traceparent`
/// and `tracestate` headers, decide whether the event is traced (`TraceSampler`), and put the context of a traced
/// event on every record produced for it. The loop has none when tracing is off, and then reads no header.
public struct StageTracing: Sendable {
    public var sampler: TraceSampler
    /// Topics whose records enter Herald from outside (`chat.events` at ingest, `herald.registry` at the registry):
    /// a record there without a context starts a trace at the sampler's ratio. On every other topic a record without
    /// a sampled context is not traced.
    public var entryTopics: Set<String>

    /// The sampler's draws and new ids: a fast generator seeded from the system's, so a batch costs one lock and no
    /// system call per record.
    private let random: RandomSource

    public init(sampler: TraceSampler, entryTopics: Set<String>) {
        self.sampler = sampler
        self.entryTopics = entryTopics
        self.random = RandomSource()
    }

    /// The context `record`'s event is traced under, or nil when it is not traced.
    public func context(of record: ConsumerRecord) -> TraceContext? {
        random.generator.withLock { context(of: record, using: &$0) }
    }

    /// The contexts of a batch's records, by index.
    func contexts(of batch: [ConsumerRecord]) -> [TraceContext?] {
        random.generator.withLock { generator in batch.map { context(of: $0, using: &generator) } }
    }

    private func context(of record: ConsumerRecord, using generator: inout SplitMix64) -> TraceContext? {
        let incoming = Self.incoming(record)
        if entryTopics.contains(record.topic) { return sampler.decide(incoming: incoming, using: &generator) }
        return sampler.continued(incoming)
    }

    /// The record's `traceparent` (and `tracestate`), when it has a valid one. A record without headers (nearly
    /// all, when few events are traced) costs one emptiness check.
    static func incoming(_ record: ConsumerRecord) -> TraceContext? {
        guard !record.headers.isEmpty, let parent = record.header(TraceContext.traceparentHeader), let parent
        else { return nil }
        let state = record.header(TraceContext.tracestateHeader) ?? nil
        return TraceContext(traceparent: parent, tracestate: state)
    }

    /// The headers that carry `context` on a produced record.
    static func headers(_ context: TraceContext) -> [KafkaHeader] {
        var headers = [KafkaHeader(key: TraceContext.traceparentHeader, value: context.traceparentBytes)]
        if let state = context.traceState {
            headers.append(KafkaHeader(key: TraceContext.tracestateHeader, string: state))
        }
        return headers
    }
}

/// The generator `StageTracing` draws from, shared by copies of it.
final class RandomSource: Sendable {
    let generator: Mutex<SplitMix64>

    init() {
        generator = Mutex(SplitMix64.seededBySystem())
    }
}
