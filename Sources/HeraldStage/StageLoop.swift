import CoreMetrics
import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import Logging
import ServiceLifecycle

/// Settings of the batch loop.
public struct StageLoopConfiguration: Sendable {
    /// Where undecodable / unprocessable inputs go.
    public var dlqTopic: String
    /// Records handed out by the consumer and not yet completed; beyond it the consumer is paused
    /// (backpressure) until work completes.
    public var maxInFlight: Int
    /// Batches processed at once. 1 keeps each partition's order end to end (every stage but send).
    public var maxConcurrentBatches: Int
    /// First delay before producing again outputs the broker did not acknowledge (doubles up to 5 s).
    public var produceRetryDelay: Duration

    public init(dlqTopic: String, maxInFlight: Int = 5000, maxConcurrentBatches: Int = 1,
                produceRetryDelay: Duration = .milliseconds(200)) {
        self.dlqTopic = dlqTopic
        self.maxInFlight = max(1, maxInFlight)
        self.maxConcurrentBatches = max(1, maxConcurrentBatches)
        self.produceRetryDelay = produceRetryDelay
    }
}

/// The loop every stage runs: consume a batch (N records or T ms), process it, produce all outputs and
/// wait for the broker's delivery reports, and only then complete the inputs, so committed offsets
/// advance only past records whose outputs were acknowledged (at least once).
///
/// - Inputs a processor cannot handle go to the DLQ as `DLQRecord`s (original bytes, source topic, stage,
///   reason, detail, time), counted by reason; data never stops the loop.
/// - Outputs the broker rejects are produced again with backoff; their inputs do not complete until then.
/// - Backpressure: at `maxInFlight` uncompleted records the consumer is paused, and resumed when work completes.
/// - Graceful shutdown (SIGTERM): stop consuming, let the running batches finish (processors hand back what
///   they cannot finish: those inputs are not completed and are redelivered), commit, flush, close.
public final class StageLoop: Service, Sendable {
    private let consumer: KafkaConsumer
    private let producer: KafkaProducer
    private let processor: any StageProcessor
    private let configuration: StageLoopConfiguration
    private let metrics: StageMetrics
    private let logger: Logger
    private let explain: (any ExplainSink)?
    private let now: @Sendable () -> Date
    private let state = Locked(LoopState())

    struct LoopState {
        var stopping = false
        var inFlight = 0
        var pausedByUs = false
        var explainWrites = 0
    }

    /// Explain writes in the background, at most this many at once; beyond it entries are dropped (counted in
    /// `herald_explain_dropped_total`), so a slow or absent Redis never slows the pipeline down.
    static let maxExplainWrites = 4

    public init(consumer: KafkaConsumer, producer: KafkaProducer, processor: any StageProcessor,
                configuration: StageLoopConfiguration, metrics: StageMetrics, logger: Logger,
                explain: (any ExplainSink)? = nil, now: @escaping @Sendable () -> Date = { Date() }) {
        self.consumer = consumer
        self.producer = producer
        self.processor = processor
        self.configuration = configuration
        self.metrics = metrics
        self.logger = logger
        self.explain = explain
        self.now = now
    }

    /// True once graceful shutdown began.
    public var isStopping: Bool { state.withLock { $0.stopping } }

    /// Records consumed and not yet completed.
    public var inFlight: Int { state.withLock { $0.inFlight } }

    /// Begins a graceful stop (what SIGTERM does through the service group).
    public func stop() { state.withLock { $0.stopping = true } }

    public func run() async throws {
        try await withGracefulShutdownHandler {
            try await self.loop()
        } onGracefulShutdown: {
            self.stop()
        }
    }

    private func loop() async throws {
        let context = BatchContext(now: now, isStopping: { [state] in state.withLock { $0.stopping } })
        var lastLag = ContinuousClock.now
        var failure: KafkaError?
        await withTaskGroup(of: Void.self) { group in
            var running = 0
            while !isStopping {
                let (inFlight, paused) = state.withLock { ($0.inFlight, $0.pausedByUs) }
                if running >= configuration.maxConcurrentBatches || inFlight >= configuration.maxInFlight {
                    if inFlight >= configuration.maxInFlight, !paused {
                        consumer.pause()
                        state.withLock { $0.pausedByUs = true }
                        logger.info("in-flight bound reached; consumer paused", metadata: ["in_flight": "\(inFlight)"])
                    }
                    if running > 0 {
                        await group.next()
                        running -= 1
                    }
                    continue
                }
                if paused {
                    consumer.resume()
                    state.withLock { $0.pausedByUs = false }
                    logger.info("consumer resumed", metadata: ["in_flight": "\(inFlight)"])
                }
                let batch: [ConsumerRecord]?
                do {
                    batch = try await consumer.nextBatch()
                } catch {
                    if let kafkaError = error as? KafkaError, kafkaError.code == .fatal || kafkaError.code == .closed {
                        failure = kafkaError
                        break
                    }
                    logger.warning("consume failed; retrying", metadata: [LogKey.error: "\(error)"])
                    try? await Task.sleep(for: .milliseconds(200))
                    continue
                }
                guard let batch else { break }
                if ContinuousClock.now - lastLag > .seconds(5) {
                    lastLag = ContinuousClock.now
                    for (partition, lag) in consumer.lag {
                        metrics.setConsumerLag(topic: partition.topic, partition: partition.partition, lag: lag)
                    }
                }
                if batch.isEmpty { continue }
                let count = batch.count
                let total = state.withLock { $0.inFlight += count; return $0.inFlight }
                metrics.setInFlight(total)
                running += 1
                group.addTask {
                    await self.handle(batch, context: context)
                    let left = self.state.withLock { $0.inFlight -= count; return $0.inFlight }
                    self.metrics.setInFlight(left)
                }
            }
            await group.waitForAll()
        }
        await finish()
        if let failure { throw failure }
    }

    /// Commit what completed, flush the producer, leave the group.
    private func finish() async {
        do { try await consumer.commit() } catch {
            logger.warning("final commit failed (the inputs are redelivered)", metadata: [LogKey.error: "\(error)"])
        }
        await consumer.shutdown()
        do { try await producer.shutdown(timeout: .seconds(5)) } catch {
            logger.warning("producer flush at shutdown failed", metadata: [LogKey.error: "\(error)"])
        }
        logger.info("stage loop stopped")
    }

    // MARK: One batch

    func handle(_ batch: [ConsumerRecord], context: BatchContext) async {
        let started = ContinuousClock.now
        var perTopic: [String: Int] = [:]
        for record in batch { perTopic[record.topic, default: 0] += 1 }
        for (topic, count) in perTopic { metrics.consumed(topic: topic, count: count) }

        let inputs = batch.map { StageInput(topic: $0.topic, key: $0.key, value: $0.value) }
        var results = await processor.process(inputs, context: context)
        if results.count != batch.count {
            logger.error("processor returned \(results.count) results for \(batch.count) inputs; handing the batch back")
            results = Array(repeating: .handedBack, count: batch.count)
        }

        // Every output (and DLQ record), remembering which input it belongs to.
        let time = BatchContext.millis(now())
        var records: [ProducerRecord] = []
        var owner: [Int] = []
        var explainEntries: [ExplainEntry] = []
        for (index, result) in results.enumerated() where !result.handBack {
            for output in result.outputs {
                records.append(ProducerRecord(topic: output.topic, key: output.key, value: output.value))
                owner.append(index)
            }
            if let letter = result.deadLetter {
                let input = batch[index]
                let dlq = DLQRecord(original: input.value ?? [], sourceTopic: input.topic, stage: processor.stage,
                                    reason: letter.reason, detail: letter.detail, time: time)
                records.append(ProducerRecord(topic: configuration.dlqTopic, key: input.key, value: Self.encode(dlq)))
                owner.append(index)
            }
            explainEntries += result.explain
        }

        let failedOwners = await produce(records, owner: owner, context: context)

        // Complete what is done; record what happened.
        var completed: [ConsumerRecord] = []
        for (index, result) in results.enumerated() {
            if result.handBack || failedOwners.contains(index) { continue }
            completed.append(batch[index])
            record(result, input: batch[index])
        }
        consumer.complete(completed)
        let elapsed = ContinuousClock.now - started
        for _ in completed { metrics.recordLatency(elapsed) }

        if let explain, !explainEntries.isEmpty { writeExplain(explainEntries, to: explain) }
    }

    /// Produces `records` until each is acknowledged; returns the inputs whose outputs could not be produced
    /// before shutdown (they are not completed).
    private func produce(_ records: [ProducerRecord], owner: [Int], context: BatchContext) async -> Set<Int> {
        var pending = Array(records.indices)
        var delay = configuration.produceRetryDelay
        while !pending.isEmpty {
            let batch = pending.map { records[$0] }
            var failed: [Int] = []
            do {
                let reports = try await producer.send(batch)
                var produced: [String: Int] = [:]
                for (position, report) in reports.enumerated() {
                    if report.isDelivered {
                        produced[report.topic, default: 0] += 1
                    } else {
                        failed.append(pending[position])
                        if failed.count == 1 {
                            logger.warning("broker did not acknowledge an output; producing again",
                                           metadata: [LogKey.error: "\(report.error.map { "\($0)" } ?? "")", "topic": "\(report.topic)"])
                        }
                    }
                }
                for (topic, count) in produced { metrics.produced(topic: topic, count: count) }
            } catch {
                logger.warning("produce failed", metadata: [LogKey.error: "\(error)"])
                failed = pending
            }
            pending = failed
            if pending.isEmpty { break }
            guard await context.sleep(delay) else { break }
            delay = min(delay * 2, .seconds(5))
        }
        return Set(pending.map { owner[$0] })
    }

    private func record(_ result: StageResult, input: ConsumerRecord) {
        if let letter = result.deadLetter {
            metrics.deadLettered(reason: letter.reason)
            logger.warning("dead-lettered", metadata: [
                "reason": "\(letter.reason)", "detail": "\(letter.detail)", "topic": "\(input.topic)",
                "partition": "\(input.partition)", "offset": "\(input.offset)",
            ])
        }
        for note in result.notes {
            switch note {
            case .suppressed(let reason):
                metrics.suppressed(reason: reason)
                if processor.stage == "ingest" {
                    logger.info("event dropped", metadata: ["reason": "\(reason)", "topic": "\(input.topic)",
                                                            "partition": "\(input.partition)", "offset": "\(input.offset)"])
                }
            case .apnsAnswer(let status, let reason):
                metrics.apnsResponse(status: status ?? 0, reason: reason)
            case .retried(let reason):
                metrics.retried(reason: reason)
            case .duplicate:
                counter("herald_send_duplicates_total", []).increment()
            case .tokenDead(let reason):
                counter("herald_token_feedback_total", [("reason", StageMetrics.labelValue(reason))]).increment()
            case .registry(let op, let outcome):
                counter("herald_registry_ops_total", [("op", StageMetrics.labelValue(op)),
                                                      ("outcome", StageMetrics.labelValue(outcome))]).increment()
            }
        }
    }

    static func encode(_ dlq: DLQRecord) -> [UInt8] { StageCodec.encode(dlq) }

    /// The explain trail is best effort: written off the batch's path, dropped (and counted) when Redis lags.
    private func writeExplain(_ entries: [ExplainEntry], to sink: any ExplainSink) {
        let admitted = state.withLock { s -> Bool in
            guard s.explainWrites < Self.maxExplainWrites else { return false }
            s.explainWrites += 1
            return true
        }
        guard admitted else {
            counter("herald_explain_dropped_total", []).increment(by: entries.count)
            return
        }
        Task {
            do { try await sink.record(entries) } catch {
                self.logger.warning("explain trail write failed", metadata: [LogKey.error: "\(error)", "entries": "\(entries.count)"])
                self.counter("herald_explain_dropped_total", []).increment(by: entries.count)
            }
            self.state.withLock { $0.explainWrites -= 1 }
        }
    }

    private func counter(_ name: String, _ labels: [(String, String)]) -> CoreMetrics.Counter {
        CoreMetrics.Counter(label: name, dimensions: [("stage", processor.stage)] + labels)
    }
}
