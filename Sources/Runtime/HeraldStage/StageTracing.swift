import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldTracing
import Synchronization

/// What the stage loop does with trace contexts (docs/operations.md, "Tracing"): read each input's `traceparent`
/// and `tracestate` headers, decide whether the event is traced (`TraceSampler`), record the stage's span of a
/// traced input, and put its context on the first record produced for it. The loop has none when tracing is off,
/// and then reads no header.
///
/// One chain per event: a traced input's context goes on its first output only (on the first of each call of
/// `BatchContext.emit`), so a fan-out to N recipients is followed through one of them and costs each later stage one
/// span, not N (a paged fan-out: one per page).
public struct StageTracing: Sendable {
    public var sampler: TraceSampler
    /// Topics whose records enter Herald from outside (`chat.events` at ingest, `herald.registry` at the registry):
    /// a record there without a context starts a trace at the sampler's ratio. On every other topic a record without
    /// a sampled context is not traced.
    public var entryTopics: Set<String>

    /// Where each traced event's span in this stage goes (nil: contexts are passed on, no span is recorded).
    public var export: SpanExport?
    /// The span's name: `herald-<stage> process`.
    public var spanName: String

    /// The sampler's draws and new ids: a fast generator seeded from the system's, so a batch costs one lock and no
    /// system call per record.
    private let random: RandomSource

    public init(sampler: TraceSampler, entryTopics: Set<String>, export: SpanExport? = nil, stage: String = "stage") {
        self.sampler = sampler
        self.entryTopics = entryTopics
        self.export = export
        self.spanName = "herald-\(stage) process"
        self.random = RandomSource()
    }

    /// Adds to a traced event's span what the stage decided about it, as events at `time`: each suppression with
    /// its reason (the explain trail's reason codes, so the trace and the trail tell the same story), each provider
    /// answer, retry and dead token, and the dead letter. Each provider request send reports becomes a child span
    /// of `span` (with `export`; `providerRequestSpan`).
    static func record(_ result: StageResult, on span: EventSpan, at time: UInt64, export: SpanExport? = nil) {
        span.setAttribute("herald.outputs", Int64(result.outputs.count))
        for note in result.notes {
            switch note {
            case .suppressed(let reason):
                span.addEvent("suppressed", atNanoseconds: time, attributes: ["herald.reason": reason])
            case .apnsAnswer(let status, let reason):
                span.addEvent(
                    "provider answer", atNanoseconds: time,
                    attributes: [
                        "http.response.status_code": status.map(String.init) ?? "none", "herald.reason": reason,
                    ])
            case .retried(let reason):
                span.addEvent("retried", atNanoseconds: time, attributes: ["herald.reason": reason])
            case .tokenDead(let reason):
                span.addEvent("token dead", atNanoseconds: time, attributes: ["herald.reason": reason])
            case .duplicate:
                span.addEvent("duplicate", atNanoseconds: time)
            case .providerRequest(let request):
                if let export { providerRequestSpan(request, under: span, export: export) }
            default:
                continue
            }
        }
        if let letter = result.deadLetter {
            span.setAttribute("herald.dead_letter", letter.reason)
            span.addEvent("dead letter", atNanoseconds: time, attributes: ["herald.reason": letter.reason])
        }
    }

    /// Records one provider request of send as a child of the stage's span: kind `client`, named `POST`, from the
    /// moment its job was handed to the transport to its answer, with the HTTP semantic conventions' attributes
    /// and Herald's own (docs/operations.md, "Tracing"). Never the token or the message.
    static func providerRequestSpan(_ request: ProviderRequest, under parent: EventSpan, export: SpanExport) {
        let span = export.startChildSpan(
            "POST", of: parent, kind: .client, startNanoseconds: request.startNanoseconds)
        span.setAttribute("herald.provider", request.provider)
        span.setAttribute("http.request.method", "POST")
        if let server = request.server {
            span.setAttribute("server.address", server.host)
            span.setAttribute("server.port", Int64(server.port))
        }
        if let status = request.status { span.setAttribute("http.response.status_code", Int64(status)) }
        span.setAttribute("herald.reason", request.reason)
        if let failure = request.failure {
            span.setAttribute("error.type", failure)
            span.setError(request.reason.isEmpty ? failure : request.reason)
        }
        if let id = request.messageID {
            span.setAttribute(request.provider == "fcm" ? "herald.fcm_message" : "herald.apns_id", id)
        }
        span.setAttribute("herald.attempt", Int64(request.attempt))
        // The transport's own retries of the request, each with the answer it retried.
        for retry in request.retries {
            span.addEvent(
                "retry", atNanoseconds: retry.timeNanoseconds,
                attributes: [
                    "http.response.status_code": retry.status.map(String.init) ?? "none", "herald.reason": retry.reason,
                ])
        }
        span.end(atNanoseconds: max(request.endNanoseconds, request.startNanoseconds))
    }

    /// Sets `herald.event_id` and `herald.app_id` on each span whose input the processor can tell them of
    /// (`StageProcessor.traceIdentity`), so `heraldctl trace <event>` finds the event's traces.
    static func identify(_ spans: [Int: EventSpan], inputs: [StageInput], processor: any StageProcessor) {
        for (index, span) in spans where index < inputs.count {
            guard let identity = processor.traceIdentity(of: inputs[index]) else { continue }
            span.setAttribute("herald.event_id", identity.eventID)
            span.setAttribute("herald.app_id", identity.appID)
        }
    }

    /// Starts the stage's span of each traced input (`traces[i]` non-nil), a child of the context it arrived with:
    /// from the record's timestamp (its wait in the topic), with an event where processing began. Returns the
    /// spans by input index and the contexts to pass on (each span as the parent of its event's outputs); without
    /// an exporter, no span and the contexts unchanged.
    func startSpans(
        _ batch: [ConsumerRecord], traces: [TraceContext?], processingStarted: UInt64
    ) -> (spans: [Int: EventSpan], contexts: [TraceContext?]) {
        guard let export else { return ([:], traces) }
        var spans: [Int: EventSpan] = [:]
        var contexts = traces
        for index in traces.indices {
            guard let traced = traces[index] else { continue }
            let record = batch[index]
            // A trace the sampler started (an entry record without a valid context) gets its root span here.
            let root = entryTopics.contains(record.topic) && Self.incoming(record) == nil
            // A producer sets the timestamp: one far in the future saturates (and the start is then the processing time).
            let timestamp = record.timestamp.map {
                UInt64(Saturating.multiply(max(0, $0.millisecondsSinceEpoch), 1_000_000))
            }
            let start = min(timestamp ?? processingStarted, processingStarted)
            let span = export.startSpan(
                spanName, continuing: traced, root: root, kind: .consumer, startNanoseconds: start)
            span.setAttribute("messaging.system", "kafka")
            span.setAttribute("messaging.operation.type", "process")
            span.setAttribute("messaging.destination.name", record.topic)
            span.setAttribute("messaging.destination.partition.id", String(record.partition))
            span.setAttribute("messaging.kafka.offset", record.offset)
            span.setAttribute("herald.wait_in_topic_ms", Int64((processingStarted - start) / 1_000_000))
            span.addEvent("processing", atNanoseconds: processingStarted)
            spans[index] = span
            contexts[index] = span.context
        }
        return (spans, contexts)
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

    /// `context` as a processor sees it on its input (`StageInput.trace`).
    static func propagation(_ context: TraceContext) -> TracePropagation {
        TracePropagation(traceparent: context.traceparentBytes, tracestate: context.traceState.map { Array($0.utf8) })
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
