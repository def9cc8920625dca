import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import Logging
import ServiceLifecycle

/// The loop suppress's two timers run (`DigestService`, `BurstFlushService`), with what they share: the apps they
/// look at, a producer of their own, the explain trail, metrics and logs.
struct FlushTimer: Sendable {
    let apps: LiveAppDirectory
    let producer: KafkaProducer
    let explain: ExplainWriter?
    let metrics: StageMetrics
    let logger: Logger

    init(
        apps: LiveAppDirectory, producer: KafkaProducer, explain: (any ExplainSink)?, metrics: StageMetrics,
        logger: Logger
    ) {
        self.apps = apps
        self.producer = producer
        self.explain = explain.map { sink in
            ExplainWriter(sink: sink, logger: logger) { metrics.explainDropped(count: $0) }
        }
        self.metrics = metrics
        self.logger = logger
    }

    /// What a pass found: its explain entries, and the wait before the next pass.
    struct Outcome {
        var explain: [ExplainEntry]
        var wait: Duration
    }

    /// Runs until shutdown. While `isActive` holds for the current apps: a pass (given the apps, the time in epoch ms
    /// and a way to produce its outputs), its explain entries written, then the wait it answers. A pass that fails
    /// (Redis or the broker down) is logged with `failure` and counted, and `activeWait` follows; what it leased is
    /// taken again. While `isActive` does not hold, only a reload can give the timer work: `BurstFlusher.idleInterval`
    /// apart. Ends with `settle` and the producer's last flush.
    func run(
        failure: Logger.Message, activeWait: Duration, isActive: (AppDirectory) -> Bool,
        settle: (@Sendable () async -> Void)? = nil,
        pass: (AppDirectory, Int64, @escaping @Sendable ([FlushOutput]) async throws -> Void) async throws -> Outcome
    ) async {
        let producer = self.producer
        let produce: @Sendable ([FlushOutput]) async throws -> Void = { outputs in
            try await producer.sendAll(outputs.map(Self.record))
        }
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let directory = apps.current
            var wait = BurstFlusher.idleInterval
            if isActive(directory) {
                wait = activeWait
                do {
                    let outcome = try await pass(directory, BatchContext.millis(Date()), produce)
                    explain?.submit(outcome.explain)
                    wait = outcome.wait
                } catch {
                    metrics.redisError(code: "transient")
                    logger.warning(failure, metadata: ["error": "\(error)"])
                }
            }
            let pause = wait
            try? await cancelWhenGracefulShutdown { try await Task.sleep(for: pause) }
        }
        await settle?()
        try? await producer.flush(timeout: .seconds(5))
    }
}

extension FlushTimer {
    /// The record of a timer's output: a traced one (`FlushOutput.trace`) with its `traceparent` and `tracestate`
    /// headers, an untraced one with none.
    static func record(_ flushed: FlushOutput) -> ProducerRecord {
        let output = flushed.output
        var headers: [KafkaHeader] = []
        if let trace = flushed.trace {
            headers.append(KafkaHeader(key: TracePropagation.traceparentHeader, value: trace.traceparent))
            if let state = trace.tracestate {
                headers.append(KafkaHeader(key: TracePropagation.tracestateHeader, value: state))
            }
        }
        return ProducerRecord(topic: output.topic, key: output.key, value: output.value, headers: headers)
    }
}

extension StageSetup {
    /// `before` and the timer service `make` builds around a producer of its own; a producer that cannot be made ends
    /// the process, status 1 (`name` names the timer in the log line).
    func withFlushTimer(
        before: [any Service], named name: String, make: (KafkaProducer) -> any Service
    ) -> [any Service] {
        do {
            return before + [make(try producer())]
        } catch {
            logger.critical("the \(name) producer could not start", metadata: [LogKey.error: "\(error)"])
            StageProcess.exit(1)
        }
    }
}
