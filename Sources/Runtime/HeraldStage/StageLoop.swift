import CoreMetrics
import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldTracing
import Logging
import ServiceLifecycle
import Synchronization

/// Settings of the stage loop.
public struct StageLoopConfiguration: Sendable {
    /// Where undecodable / unprocessable inputs go.
    public var dlqTopic: String
    /// Records handed out by the consumer and not yet completed; at it the loop takes no more (backpressure)
    /// until work completes.
    public var maxInFlight: Int
    /// Batches processed at once. 1 keeps each partition's order end to end (every stage but send): batches are
    /// processed one after another and their outputs enqueued in order, while earlier batches still wait for
    /// the broker's acknowledgements.
    public var maxConcurrentBatches: Int
    /// First delay before producing again outputs the broker did not acknowledge (doubles up to 5 s).
    public var produceRetryDelay: Duration
    /// The most bytes of an original record a DLQ record carries. A longer original is cut to this size and the
    /// DLQ record keeps its full size and SHA-256 (with the source topic, partition and offset), so the DLQ
    /// record always fits the broker's limit.
    public var dlqMaxOriginalBytes: Int
    /// Rung with the topics of every output the broker acknowledged (the next stage's idle consumers wake at once).
    public var doorbell: Doorbell?
    /// How long the explain trail's entries gather before they are written (`ExplainWriter`; the pipeline file's
    /// `explain.write_interval_ms`).
    public var explainInterval: Duration
    /// Trace contexts read from the inputs and written on their outputs; nil (tracing off): no header is read or
    /// written.
    public var tracing: StageTracing?

    public init(
        dlqTopic: String, maxInFlight: Int = 5000, maxConcurrentBatches: Int = 1,
        produceRetryDelay: Duration = .milliseconds(200), dlqMaxOriginalBytes: Int = 65_536,
        explainInterval: Duration = ExplainWriter.defaultInterval
    ) {
        self.explainInterval = explainInterval
        self.dlqTopic = dlqTopic
        self.maxInFlight = max(1, maxInFlight)
        self.maxConcurrentBatches = max(1, maxConcurrentBatches)
        self.produceRetryDelay = produceRetryDelay
        self.dlqMaxOriginalBytes = max(0, dlqMaxOriginalBytes)
    }
}

/// The loop every stage runs: take the records that are there (waiting only when there are none), process them,
/// enqueue every output, and complete the inputs once the broker acknowledged their outputs, so committed offsets
/// advance only past records whose outputs were acknowledged (at least once).
///
/// - The next batch is taken and processed while earlier ones still wait for their acknowledgements; with
///   `maxConcurrentBatches` 1 outputs are enqueued in input order, so each partition's order holds end to end.
/// - Inputs a processor cannot handle go to the DLQ as `DLQRecord`s (original bytes, cut to
///   `dlqMaxOriginalBytes` with size and SHA-256 kept; source topic, partition and offset; stage, reason,
///   detail, time), counted by reason; data never stops the loop.
/// - Outputs the broker does not acknowledge for a passing reason are produced again with backoff; their inputs
///   complete only then. An output the broker refuses for good (too large, invalid) becomes a DLQ record; if the
///   DLQ refuses that too it is counted in `herald_dlq_dropped_total` and logged, and the partition moves on.
/// - Backpressure: at `maxInFlight` uncompleted records the loop takes no more until work completes; the
///   consumer's bounded prefetch then fills, and a buffer full for a second pauses its assignment.
/// - Crash-loop breaker (`CrashBreaker`, when given): each batch is noted in Redis before it is processed and the
///   note cleared once it completed; a batch found noted after a crash is processed again one record at a time,
///   each noted alone, and a record found noted alone (in flight at two crashes in a row) is dead-lettered
///   `crashed`.
/// - Graceful shutdown (SIGTERM): stop consuming, let the running batches finish (processors hand back what
///   they cannot finish: those inputs are not completed and are redelivered), commit, flush, close.
public final class StageLoop: Service, Sendable {
    private let consumer: KafkaConsumer
    private let producers: Mutex<KafkaProducer>
    /// Makes a new producer after a fatal error of the current one (nil: a fatal error stops the loop).
    private let makeProducer: (@Sendable () throws -> KafkaProducer)?
    private let processor: any StageProcessor
    private let configuration: StageLoopConfiguration
    private let metrics: StageMetrics
    private let logger: Logger
    private let explain: ExplainWriter?
    /// Notes each batch before it is processed, so a record that makes the stage trap is found and dead-lettered
    /// (`CrashBreaker`); nil: no notes.
    private let breaker: CrashBreaker?
    private let now: @Sendable () -> Date
    private let state = Mutex(LoopState())
    /// Woken whenever a batch finishes (in-flight went down, a processing slot freed).
    private let progress = Wakeup()
    /// Signalled when shutdown begins: a processor sleeping in its `BatchContext` (a held retry, a Redis outage)
    /// wakes at once.
    private let stopSignal = StopSignal()

    struct LoopState {
        var stopping = false
        /// A fatal producer error: the loop stops and `run()` throws it (the process exits and is restarted).
        var fatal: KafkaError?
        var inFlight = 0
        var processing = 0
    }

    public init(
        consumer: KafkaConsumer, producer: KafkaProducer,
        makeProducer: (@Sendable () throws -> KafkaProducer)? = nil, processor: any StageProcessor,
        configuration: StageLoopConfiguration, metrics: StageMetrics, logger: Logger,
        explain: (any ExplainSink)? = nil, breaker: CrashBreaker? = nil,
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.breaker = breaker
        self.consumer = consumer
        self.producers = Mutex(producer)
        self.makeProducer = makeProducer
        self.processor = processor
        self.configuration = configuration
        self.metrics = metrics
        self.logger = logger
        self.explain = explain.map { sink in
            ExplainWriter(
                sink: sink, interval: configuration.explainInterval, logger: logger,
                changed: { metrics.explainPending(change: $0) }, dropped: { metrics.explainDropped(count: $0) })
        }
        self.now = now
    }

    /// True once graceful shutdown began.
    public var isStopping: Bool { state.withLock { $0.stopping } }

    /// Records consumed and not yet completed.
    public var inFlight: Int { state.withLock { $0.inFlight } }

    /// Begins a graceful stop (what SIGTERM does through the service group).
    public func stop() {
        state.withLock { $0.stopping = true }
        stopSignal.stop()
        progress.wake()
    }

    public func run() async throws {
        try await withGracefulShutdownHandler {
            try await self.loop()
        } onGracefulShutdown: {
            self.stop()
        }
    }

    private func loop() async throws {
        let context = {
            var context = BatchContext(now: now, stop: stopSignal)
            // Without a sink no entry is written; with one, only what it keeps is worth making.
            let sink = explain?.sink
            context.keepsRoutineExplain = { appID, eventID, user in
                sink?.keepsRoutine(appID: appID, eventID: eventID, user: user) ?? false
            }
            return context
        }()
        let ordered = configuration.maxConcurrentBatches == 1
        var lastLag = ContinuousClock.now
        var reportedLag = Set<TopicPartition>()
        var failure: KafkaError?
        await withDiscardingTaskGroup { group in
            while !isStopping {
                // Backpressure: at the in-flight bound (or with every processing slot taken) stop taking records and
                // wait for progress. The consumer is not paused here: its prefetch buffer fills and its poll thread
                // stops polling, and only a buffer full for a second pauses the assignment (`FetchFlowControl`).
                // Pausing at every touch of the bound threw away librdkafka's fetched records each time, and
                // librdkafka fetched again only on its one-second timer: a backlog drained in one burst per second.
                let ticket = progress.ticket()
                let (inFlight, processing) = state.withLock { ($0.inFlight, $0.processing) }
                if inFlight >= configuration.maxInFlight || processing >= configuration.maxConcurrentBatches {
                    await progress.wait(after: ticket, timeout: .milliseconds(500))
                    continue
                }
                let batch: [ConsumerRecord]?
                do throws(KafkaError) {
                    batch = try await consumer.nextBatch()
                } catch {
                    if error.code == .fatal || error.code == .closed {
                        failure = error
                        break
                    }
                    logger.warning("consume failed; retrying", metadata: [LogKey.error: "\(error)"])
                    _ = await context.sleep(.milliseconds(200))
                    continue
                }
                guard let batch else { break }
                if ContinuousClock.now - lastLag > .seconds(1) {
                    // The consumer measures lag every `lagInterval`; partitions no longer assigned read 0.
                    lastLag = ContinuousClock.now
                    let lags = consumer.lag
                    for partition in reportedLag.subtracting(lags.keys) {
                        metrics.setConsumerLag(topic: partition.topic, partition: partition.partition, lag: 0)
                    }
                    for (partition, lag) in lags {
                        metrics.setConsumerLag(topic: partition.topic, partition: partition.partition, lag: lag)
                    }
                    reportedLag = Set(lags.keys)
                }
                if batch.isEmpty { continue }
                let count = batch.count
                // The gauge is set under the lock, here and in `conclude`: set after it, a batch's count taken
                // before another batch completed could be written after that completion's, and stay on the gauge.
                state.withLock { s in
                    s.inFlight += count
                    s.processing += 1
                    metrics.setInFlight(s.inFlight)
                }
                // Each record's trace context, decided once for everything produced for it, and for a traced one its
                // span in this stage, started before any of its outputs is produced.
                let (traces, spans) = beginTraces(batch)
                if ordered {
                    // Process and enqueue here, in order; only the wait for acknowledgements runs beside the loop.
                    // A processor may produce part of its outputs ahead (resolve's paged fan-out).
                    var batchContext = context
                    batchContext.emit = { [self] outputs, index in
                        guard index >= 0, index < batch.count else { return false }
                        return await self.emitNow(
                            outputs, input: batch[index], trace: traces?[index] ?? nil, context: context)
                    }
                    var prepared = await prepare(batch, traces: traces, spans: spans, context: batchContext)
                    let pending = await enqueue(prepared, context: context)
                    prepared.handed = .now
                    state.withLock { $0.processing -= 1 }
                    group.addTask { [prepared] in await self.conclude(prepared, pending, context: context) }
                } else {
                    group.addTask {
                        var prepared = await self.prepare(batch, traces: traces, spans: spans, context: context)
                        let pending = await self.enqueue(prepared, context: context)
                        prepared.handed = .now
                        self.state.withLock { $0.processing -= 1 }
                        self.progress.wake()
                        await self.conclude(prepared, pending, context: context)
                    }
                }
            }
        }
        await finish()
        if let failure = failure ?? state.withLock({ $0.fatal }) { throw failure }
    }

    /// The producer in use (replaced after a fatal error when the loop has a factory).
    private var producer: KafkaProducer { producers.withLock { $0 } }

    /// After a fatal error of `failed` (the idempotent producer was fenced, or its sequence numbers no longer
    /// match the broker's): a new producer takes over when the loop can make one, and what was not acknowledged
    /// is produced again through it; otherwise the loop stops. Returns whether the loop can go on.
    private func replaceProducer(_ failed: KafkaProducer, after error: KafkaError) -> Bool {
        guard let makeProducer else {
            failFatally(error)
            return false
        }
        let replaced: Bool
        do {
            let fresh = try makeProducer()
            replaced = producers.withLock { current -> Bool in
                guard current === failed else { return false }  // another task replaced it already
                current = fresh
                return true
            }
            if !replaced { Task { try? await fresh.shutdown(timeout: .seconds(1)) } }
        } catch {
            failFatally(error as? KafkaError ?? KafkaError(code: .fatal, reason: "\(error)"))
            return false
        }
        if replaced {
            logger.error(
                "fatal producer error; producing through a new producer (unacknowledged outputs are produced again)",
                metadata: [LogKey.error: "\(error)"])
            metrics.producerReplaced()
            Task { try? await failed.shutdown(timeout: .seconds(1)) }
        }
        return true
    }

    /// Stops the loop for good after a fatal producer error: its outputs can no longer be acknowledged, so the
    /// uncompleted inputs are left to be redelivered to a new process.
    private func failFatally(_ error: KafkaError) {
        let first = state.withLock { s -> Bool in
            defer { if s.fatal == nil { s.fatal = error } }
            return s.fatal == nil
        }
        if first {
            logger.critical(
                "fatal producer error; stopping the stage (uncompleted inputs are redelivered)",
                metadata: [LogKey.error: "\(error)"])
        }
        stop()
    }

    /// Commit what completed, flush the producer, leave the group, write the explain entries still gathering.
    private func finish() async {
        do { try await consumer.commit() } catch {
            logger.warning("final commit failed (the inputs are redelivered)", metadata: [LogKey.error: "\(error)"])
        }
        await consumer.shutdown()
        do { try await producer.shutdown(timeout: .seconds(5)) } catch {
            logger.warning("producer flush at shutdown failed", metadata: [LogKey.error: "\(error)"])
        }
        await explain?.flush()
        logger.info("stage loop stopped")
    }

    // MARK: One batch

    /// A processed batch: its results and every record to produce, with the input each belongs to.
    struct Prepared: Sendable {
        var batch: [ConsumerRecord]
        var results: [StageResult]
        var records: [ProducerRecord]
        var owner: [Int]
        var started: ContinuousClock.Instant
        /// When the records were handed to the producer: the end of the stage's own processing, the start of the
        /// wait for the broker's acknowledgements.
        var handed: ContinuousClock.Instant? = nil
        /// The crash-loop breaker's notes of the batch (cleared in `conclude`), and the partition whose record was
        /// processed alone last.
        var plan: CrashBreaker.Plan? = nil
        var alone: TopicPartition? = nil
        /// The stage's span of each traced input, by index, ended once its outputs were acknowledged.
        var spans: [Int: EventSpan] = [:]
    }

    /// Each record's trace context to pass on (nil: tracing is off) and the spans of the traced ones (`StageTracing`):
    /// a span starts at its record's timestamp and notes now as the start of processing; its outputs carry it as
    /// their parent.
    private func beginTraces(_ batch: [ConsumerRecord]) -> ([TraceContext?]?, [Int: EventSpan]) {
        guard let tracing = configuration.tracing else { return (nil, [:]) }
        let (spans, contexts) = tracing.startSpans(
            batch, traces: tracing.contexts(of: batch), processingStarted: Self.nanoseconds(now()))
        return (contexts, spans)
    }

    /// `traces`: the trace context to pass on for each record of `batch` (nil: tracing is off); `spans`: the
    /// stage's span of each traced record, by index, ended in `conclude`.
    func prepare(
        _ batch: [ConsumerRecord], traces: [TraceContext?]? = nil, spans: [Int: EventSpan] = [:],
        context: BatchContext
    ) async -> Prepared {
        let started = ContinuousClock.now
        // A batch holds one topic or a few, mostly in runs: counted by a scan, not a hash of each record's topic.
        var perTopic: [(topic: String, count: Int)] = []
        for index in batch.indices {
            if let last = perTopic.indices.last, perTopic[last].topic == batch[index].topic {
                perTopic[last].count += 1
            } else if let known = perTopic.firstIndex(where: { $0.topic == batch[index].topic }) {
                perTopic[known].count += 1
            } else {
                perTopic.append((batch[index].topic, 1))
            }
        }
        for (topic, count) in perTopic { metrics.consumed(topic: topic, count: count) }

        var inputs = batch.map { StageInput(topic: $0.topic, key: $0.key, value: $0.value) }
        if let traces {
            for index in traces.indices {
                if let traced = traces[index] { inputs[index].trace = StageTracing.propagation(traced) }
            }
        }
        if !spans.isEmpty { StageTracing.identify(spans, inputs: inputs, processor: processor) }
        let plan = await breaker?.begin(batch)
        var alone: TopicPartition?
        var results: [StageResult]
        if let plan, !plan.isPlain, let breaker {
            // Records that were in flight at a crash: each processed alone, noted first; records in flight at two
            // crashes in a row are dead-lettered. The rest goes in runs, in the batch's order.
            results = []
            results.reserveCapacity(batch.count)
            var index = 0
            while index < batch.count {
                switch plan.dispositions[index] {
                case .crashed:
                    results.append(
                        .dlq(
                            CrashBreaker.reason,
                            "in flight at two crashes in a row (the second time processed on its own); not processed again"
                        ))
                    index += 1
                case .alone:
                    await breaker.noteAlone(batch[index], previous: alone)
                    alone = batch[index].topicPartition
                    results += await process(inputs[index..<index + 1], context: context)
                    index += 1
                case .batch:
                    var end = index + 1
                    while end < batch.count, plan.dispositions[end] == .batch { end += 1 }
                    if let previous = alone {
                        await breaker.clearAlone(previous)
                        alone = nil
                    }
                    results += await process(inputs[index..<end], context: context)
                    index = end
                }
            }
        } else {
            results = await process(inputs[...], context: context)
        }

        // The trace context of each traced input, as the headers its first output carries (`StageTracing`).
        let traceHeaders = traces.map { contexts in contexts.map { $0.map(StageTracing.headers) } }

        // Every output (and DLQ record), remembering which input it belongs to.
        let time = BatchContext.millis(now())
        var records: [ProducerRecord] = []
        var owner: [Int] = []
        records.reserveCapacity(batch.count)
        owner.reserveCapacity(batch.count)
        // By index, not `enumerated()`: each result is read in place instead of copied out.
        for index in results.indices where !results[index].handBack {
            // Only the first output carries a traced event's context (`StageTracing`, "one chain per event").
            var headers = traceHeaders?[index] ?? []
            for output in results[index].outputs {
                records.append(
                    ProducerRecord(topic: output.topic, key: output.key, value: output.value, headers: headers))
                owner.append(index)
                headers = []
            }
            if let letter = results[index].deadLetter {
                let input = batch[index]
                var record = deadLetterRecord(
                    original: input.value ?? [], input: input, reason: letter.reason, detail: letter.detail,
                    time: time)
                // A traced event's dead letter carries its context, so `heraldctl dlq` and the trace meet.
                if let carried = traceHeaders?[index] { record.headers = carried }
                records.append(record)
                owner.append(index)
            }
        }
        if !spans.isEmpty {
            let processed = Self.nanoseconds(now())
            for (index, span) in spans where index < results.count {
                StageTracing.record(results[index], on: span, at: processed, export: configuration.tracing?.export)
            }
        }
        return Prepared(
            batch: batch, results: results, records: records, owner: owner, started: started, plan: plan,
            alone: alone, spans: spans)
    }

    /// `date` in nanoseconds since the epoch (span times).
    static func nanoseconds(_ date: Date) -> UInt64 {
        UInt64(max(0, date.timeIntervalSince1970 * 1_000_000_000))
    }

    /// The processor's results for `inputs` (handed back whole when it returns the wrong number).
    private func process(_ inputs: ArraySlice<StageInput>, context: BatchContext) async -> [StageResult] {
        CrashTrigger.trapIfMarked(inputs.lazy.map(\.value))
        let results = await processor.process(Array(inputs), context: context)
        if results.count != inputs.count {
            logger.error(
                "processor returned \(results.count) results for \(inputs.count) inputs; handing the batch back")
            return Array(repeating: .handedBack, count: inputs.count)
        }
        return results
    }

    /// Enqueues the batch's records (in order). Nil when the producer is closed (shutting down): the inputs are
    /// then not completed.
    private func enqueue(_ prepared: Prepared, context: BatchContext) async -> PendingDelivery? {
        while true {
            let current = producer
            do throws(KafkaError) {
                return try await current.enqueue(prepared.records)
            } catch {
                if error.code == .fatal, replaceProducer(current, after: error), !context.isStopping() { continue }
                if error.code == .closed || error.code == .fatal || context.isStopping() {
                    logger.warning(
                        "cannot enqueue outputs; the inputs are redelivered", metadata: [LogKey.error: "\(error)"])
                    return nil
                }
                logger.warning("enqueue failed; trying again", metadata: [LogKey.error: "\(error)"])
                guard await context.sleep(configuration.produceRetryDelay) else { return nil }
            }
        }
    }

    /// Produces `outputs` of `input` now and waits for the broker's acknowledgements (produced again with backoff
    /// when not taken for a passing reason; dead-lettered when refused for good). False when shutdown began
    /// before all were acknowledged. The producer keeps order per partition, so these follow the outputs of
    /// earlier batches.
    private func emitNow(
        _ outputs: [StageOutput], input: ConsumerRecord, trace: TraceContext?, context: BatchContext
    ) async -> Bool {
        if outputs.isEmpty { return true }
        // The first output of each call carries a traced event's context (`StageTracing`, "one chain per event").
        let headers = trace.map(StageTracing.headers) ?? []
        let records = outputs.indices.map { position in
            ProducerRecord(
                topic: outputs[position].topic, key: outputs[position].key, value: outputs[position].value,
                headers: position == 0 ? headers : [])
        }
        let prepared = Prepared(
            batch: [input], results: [StageResult()], records: records,
            owner: Array(repeating: 0, count: records.count), started: .now)
        guard let pending = await enqueue(prepared, context: context) else { return false }
        let reports = await pending.unitReports()
        let failed = await settle(prepared, reports: reports, context: context)
        return failed.isEmpty
    }

    /// Waits for the broker's answers, produces again what it did not take, then completes the inputs and
    /// records what happened.
    private func conclude(_ prepared: Prepared, _ pending: PendingDelivery?, context: BatchContext) async {
        defer { progress.wake() }
        let batch = prepared.batch
        var failedOwners = Set<Int>()
        if let pending {
            let reports = await pending.unitReports()
            failedOwners = await settle(prepared, reports: reports, context: context)
        } else {
            failedOwners = Set(prepared.owner)
        }
        let acknowledged = ContinuousClock.now

        // Complete what is done; record what happened.
        var completedCount = 0
        var tally = Tally()
        var explainEntries: [ExplainEntry] = []
        func isDone(_ index: Int) -> Bool { !prepared.results[index].handBack && !failedOwners.contains(index) }
        for index in prepared.results.indices where isDone(index) {
            completedCount += 1
            tally.add(
                prepared.results, at: index, inputs: batch, stage: processor.stage, logger: logger,
                trace: prepared.spans.isEmpty ? nil : prepared.spans[index]?.context)
            if let sink = explain?.sink {
                // Read in place: only the entries the sink keeps are copied.
                for position in prepared.results[index].explain.indices
                where sink.keeps(prepared.results[index].explain[position]) {
                    explainEntries.append(prepared.results[index].explain[position])
                }
            }
        }
        consumer.complete(batch) { $0 < prepared.results.count && isDone($0) }
        state.withLock { s in
            s.inFlight -= batch.count
            metrics.setInFlight(s.inFlight)
        }
        let elapsed = ContinuousClock.now - prepared.started
        metrics.recordLatency(elapsed, count: completedCount)
        let handed = prepared.handed ?? acknowledged
        metrics.recordLatencyParts(
            processing: handed - prepared.started, ackWait: acknowledged - handed, count: completedCount)
        tally.record(metrics: metrics)

        explain?.submit(explainEntries)
        if !prepared.spans.isEmpty {
            // A traced event's span ends when its outputs were acknowledged (or given up at shutdown).
            let end = Self.nanoseconds(now())
            let waited = UInt64(Saturating.multiply(max(0, (acknowledged - handed).microseconds), 1000))
            let handedAt = end - min(waited, end)
            for (index, span) in prepared.spans {
                span.addEvent("outputs enqueued", atNanoseconds: min(handedAt, end))
                if !isDone(index) { span.setAttribute("herald.completed", "false") }
                span.end(atNanoseconds: end)
            }
        }
        // Completed (or handed back at shutdown): no longer in flight.
        if let plan = prepared.plan { await breaker?.end(plan, alone: prepared.alone) }
    }

    /// Looks at the delivery reports of a batch: what failed for a passing reason is produced again (with
    /// backoff) until acknowledged; what the broker refused for good is dead-lettered instead. Returns the
    /// inputs whose outputs could not be produced before shutdown (they are not completed).
    private func settle(_ prepared: Prepared, reports: DeliveryReports, context: BatchContext) async -> Set<Int> {
        // Counted per topic by a scan (a batch's outputs go to one topic or a few, mostly in runs), each record's
        // report read in place where it is its pack's.
        var produced: [(topic: String, count: Int)] = []
        var retry: [(record: ProducerRecord, owner: Int)] = []
        var rejected: [(record: ProducerRecord, owner: Int, error: KafkaError)] = []
        for position in 0..<min(reports.count, prepared.records.count) {
            let unit = reports.unit(position)
            if let error = reports.units[unit].error {
                if error.isPermanentRecordRejection {
                    rejected.append((prepared.records[position], prepared.owner[position], error))
                } else {
                    retry.append((prepared.records[position], prepared.owner[position]))
                }
            } else if let last = produced.indices.last, produced[last].topic == reports.units[unit].topic {
                produced[last].count += 1
            } else if let known = produced.firstIndex(where: { $0.topic == reports.units[unit].topic }) {
                produced[known].count += 1
            } else {
                produced.append((reports.units[unit].topic, 1))
            }
        }
        for (topic, count) in produced { metrics.produced(topic: topic, count: count) }
        configuration.doorbell?.ring(produced.lazy.map(\.topic))
        if !rejected.isEmpty { retry += await deadLetterRejected(rejected, prepared: prepared) }

        var delay = configuration.produceRetryDelay
        var warned = false
        while !retry.isEmpty {
            if !warned {
                warned = true
                logger.warning(
                    "broker did not acknowledge \(retry.count) outputs; producing again",
                    metadata: ["topic": "\(retry[0].record.topic)"])
            }
            let current = producer
            if let fatal = current.fatalError {
                guard replaceProducer(current, after: fatal) else { break }
            }
            guard await context.sleep(delay) else { break }
            delay = min(delay * 2, .seconds(5))
            let again: [DeliveryReport]
            do {
                again = try await producer.send(retry.map(\.record))
            } catch {
                logger.warning("produce failed", metadata: [LogKey.error: "\(error)"])
                continue
            }
            var still: [(record: ProducerRecord, owner: Int)] = []
            var refused: [(record: ProducerRecord, owner: Int, error: KafkaError)] = []
            for (position, report) in again.enumerated() where position < retry.count {
                if let error = report.error {
                    if error.isPermanentRecordRejection {
                        refused.append((retry[position].record, retry[position].owner, error))
                    } else {
                        still.append(retry[position])
                    }
                } else {
                    metrics.produced(topic: report.topic, count: 1)
                    configuration.doorbell?.ring(CollectionOfOne(report.topic))
                }
            }
            if !refused.isEmpty { still += await deadLetterRejected(refused, prepared: prepared) }
            retry = still
        }
        return Set(retry.map(\.owner))
    }

    /// Dead-letters outputs the broker refused for good. Returns the DLQ records that failed for a passing
    /// reason (to be produced again); those the DLQ refuses for good are dropped, counted and logged.
    private func deadLetterRejected(
        _ rejected: [(record: ProducerRecord, owner: Int, error: KafkaError)],
        prepared: Prepared
    ) async -> [(record: ProducerRecord, owner: Int)] {
        let time = BatchContext.millis(now())
        var letters: [ProducerRecord] = []
        for item in rejected {
            let input = prepared.batch[item.owner]
            let name = item.error.librdkafkaName ?? item.error.code.rawValue
            logger.error(
                "broker refused an output for good; dead-lettering it",
                metadata: [
                    "topic": "\(item.record.topic)", "error": "\(name)", "bytes": "\(item.record.value?.count ?? 0)",
                    "source_partition": "\(input.partition)", "source_offset": "\(input.offset)",
                ])
            metrics.deadLettered(reason: "produce_rejected")
            letters.append(
                deadLetterRecord(
                    original: item.record.value ?? [], input: input, reason: "produce_rejected",
                    detail: "output to \(item.record.topic) refused by the broker: \(name)",
                    time: time, target: item.record.topic))
        }
        var again: [(record: ProducerRecord, owner: Int)] = []
        let reports: [DeliveryReport]
        do { reports = try await producer.send(letters) } catch {
            return zip(letters, rejected).map { ($0, $1.owner) }
        }
        for (position, report) in reports.enumerated() where position < letters.count {
            guard let error = report.error else { continue }
            if error.isPermanentRecordRejection {
                metrics.deadLetterDropped()
                logger.error(
                    "the DLQ refused a dead letter too; dropped",
                    metadata: [
                        "topic": "\(configuration.dlqTopic)", "error": "\(error.librdkafkaName ?? "")",
                    ])
            } else {
                again.append((letters[position], rejected[position].owner))
            }
        }
        return again
    }

    /// The DLQ record for `original` (an input, or an output the broker refused), cut to the configured size.
    /// `target`: the topic an output was meant for (a refused output), so a replay puts it there.
    func deadLetterRecord(
        original: [UInt8], input: ConsumerRecord, reason: String, detail: String,
        time: Int64, target: String? = nil
    ) -> ProducerRecord {
        let dlq = DLQRecord(
            original: original, maxOriginalBytes: configuration.dlqMaxOriginalBytes,
            sourceTopic: input.topic, sourcePartition: input.partition, sourceOffset: input.offset,
            targetTopic: target, stage: processor.stage, reason: reason, detail: detail, time: time)
        return ProducerRecord(topic: configuration.dlqTopic, key: input.key, value: StageCodec.encode(dlq))
    }
}

/// What a batch's results add to the counters, summed per series so each series is touched once per batch.
struct Tally {
    var suppressed: [String: Int] = [:]
    var answers: [APNsAnswerKey: Int] = [:]
    var retried: [String: Int] = [:]
    var deadLettered: [String: Int] = [:]
    var duplicates = 0
    var tokenDead: [String: Int] = [:]
    var registry: [RegistryKey: Int] = [:]
    var inputWarnings: [String: Int] = [:]
    var coalesced: [String: Int] = [:]
    var readSync: [String: Int] = [:]
    var digests: [String: Int] = [:]
    var translations: [String: Int] = [:]
    var classified: [String: Int] = [:]

    struct APNsAnswerKey: Hashable { var status: Int; var reason: String }
    struct RegistryKey: Hashable { var op: String; var outcome: String }

    /// Adds `results[index]`, read in place (a result and its input copied out would be retained and released
    /// field by field, for every record).
    /// `trace`: the context of the input's span in this stage when it is traced; its log lines then carry
    /// `trace_id` and `span_id`.
    mutating func add(
        _ results: [StageResult], at index: Int, inputs: [ConsumerRecord], stage: String, logger: Logger,
        trace: TraceContext? = nil
    ) {
        func traced(_ metadata: Logger.Metadata) -> Logger.Metadata {
            guard let trace else { return metadata }
            return metadata.merging([LogKey.traceID: "\(trace.traceIDHex)", LogKey.spanID: "\(trace.spanIDHex)"]) {
                a, _ in a
            }
        }
        if let letter = results[index].deadLetter {
            deadLettered[letter.reason, default: 0] += 1
            logger.warning(
                "dead-lettered",
                metadata: traced([
                    "reason": "\(letter.reason)", "detail": "\(letter.detail)", "topic": "\(inputs[index].topic)",
                    "partition": "\(inputs[index].partition)", "offset": "\(inputs[index].offset)",
                ]))
        }
        for note in results[index].notes {
            switch note {
            case .suppressed(let reason):
                suppressed[reason, default: 0] += 1
                if stage == "ingest" {
                    logger.info(
                        "event dropped",
                        metadata: traced([
                            "reason": "\(reason)", "topic": "\(inputs[index].topic)",
                            "partition": "\(inputs[index].partition)", "offset": "\(inputs[index].offset)",
                        ]))
                }
            case .apnsAnswer(let status, let reason):
                answers[APNsAnswerKey(status: status ?? 0, reason: reason), default: 0] += 1
            case .retried(let reason):
                retried[reason, default: 0] += 1
            case .duplicate:
                duplicates += 1
            case .tokenDead(let reason):
                tokenDead[reason, default: 0] += 1
            case .registry(let op, let outcome):
                registry[RegistryKey(op: op, outcome: outcome), default: 0] += 1
            case .inputWarning(let field):
                inputWarnings[field, default: 0] += 1
            case .classified(let priorityClass, let count):
                classified[priorityClass, default: 0] += count
            case .coalesced(let outcome):
                coalesced[outcome, default: 0] += 1
            case .readSync(let outcome):
                readSync[outcome, default: 0] += 1
            case .digest(let outcome):
                digests[outcome, default: 0] += 1
            case .translation(let outcome):
                translations[outcome, default: 0] += 1
            case .providerRequest:
                // A span (`StageTracing`), not a count: the answer itself is counted by its `apnsAnswer` note.
                break
            }
        }
    }

    func record(metrics: StageMetrics) {
        for (reason, n) in deadLettered { metrics.deadLettered(reason: reason, count: n) }
        for (reason, n) in suppressed { metrics.suppressed(reason: reason, count: n) }
        for (key, n) in answers { metrics.apnsResponse(status: key.status, reason: key.reason, count: n) }
        for (reason, n) in retried { metrics.retried(reason: reason, count: n) }
        if duplicates > 0 { metrics.sendDuplicates(count: duplicates) }
        for (field, n) in inputWarnings { metrics.ingestWarning(field: field, count: n) }
        for (priorityClass, n) in classified { metrics.classified(priorityClass, count: n) }
        for (outcome, n) in coalesced { metrics.coalesced(outcome: outcome, count: n) }
        for (outcome, n) in readSync { metrics.readSync(outcome: outcome, count: n) }
        for (outcome, n) in digests { metrics.digests(outcome: outcome, count: n) }
        for (outcome, n) in translations { metrics.translations(outcome: outcome, count: n) }
        for (reason, n) in tokenDead { metrics.tokenFeedback(reason: reason, count: n) }
        for (key, n) in registry { metrics.registryOp(op: key.op, outcome: key.outcome, count: n) }
    }
}

/// A wake-up signal for one waiter: `ticket()` before checking a condition, then `wait(after:)` returns at once
/// if `wake()` was called since the ticket, else at the next `wake()` (or the timeout).
final class Wakeup: Sendable {
    private struct State {
        var generation: UInt64 = 0
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Mutex(State())

    func ticket() -> UInt64 { state.withLock { $0.generation } }

    func wake() {
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            s.generation &+= 1
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }

    func wait(after ticket: UInt64, timeout: Duration) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = self.state.withLock { s -> Bool in
                        if s.generation != ticket { return true }
                        s.waiter?.resume()
                        s.waiter = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            }
            group.addTask {
                // Only a timeout that ran out wakes the waiter: a timer cancelled because a real wake-up came
                // first must not count as one more (the next wait would return at once, spinning the loop).
                do {
                    try await Task.sleep(for: timeout)
                    self.wake()
                } catch {}
            }
            await group.next()
            group.cancelAll()
        }
    }
}
