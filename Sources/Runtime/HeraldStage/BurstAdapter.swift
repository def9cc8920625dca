import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldRedis
import Logging
import ServiceLifecycle
import Synchronization

/// suppress's `BurstLedger` over Redis (`StateStore.stepBursts`, `claimDueBursts`, `confirmBursts`: one single-shard
/// Lua script per message or shard, pipelined in one round trip; a held message's event kept once for every burst
/// holding it; docs/redis-keys.md "Bursts").
public struct RedisBurstLedger: BurstLedger {
    public let store: StateStore
    /// When this process last held a message back (the flush timer's pace follows it).
    public let activity = BurstActivity()

    public init(store: StateStore) {
        self.store = store
    }

    public func step(_ messages: [BurstMessage]) async throws -> [BurstStep] {
        let steps = try await store.stepBursts(messages)
        for (message, step) in zip(messages, steps) {
            if case .held = step { activity.noteHeld(at: message.at) }
        }
        return steps
    }

    public func claimDue(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        try await store.claimDueBursts(app: app, policy: policy, now: now)
    }

    public func confirm(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        try await store.confirmBursts(app: app, policy: policy, flushed: flushed, now: now)
    }

    /// Gives back the references to shared events still waiting for a round trip (the process stops); what cannot
    /// be given back stays until the copies' TTL.
    public func settle() async {
        try? await store.releaseBurstEvents()
    }
}

/// When this process last held a message back, by coalescing or the flood guard (epoch ms, the stages' clock).
public final class BurstActivity: Sendable {
    private let last = Mutex<Int64?>(nil)

    public init() {}

    public func noteHeld(at: Int64) {
        last.withLock { $0 = max($0 ?? at, at) }
    }

    public var lastHeldAt: Int64? { last.withLock { $0 } }
}

extension StageSetup {
    /// suppress's burst ledger: best effort like the explain trail (Redis is not a readiness check; a bad Redis
    /// setting turns coalescing off with a warning, and a failing Redis delivers a batch without it).
    public func bestEffortBurstLedger() -> RedisBurstLedger? {
        do {
            let connection = RedisConnection(configuration: try redisConfiguration(), logger: logger)
            return RedisBurstLedger(store: StateStore(connection: connection, logger: logger))
        } catch {
            logger.warning("burst coalescing off: \(error)")
            return nil
        }
    }

    /// `before` and, with a ledger, suppress's burst flush timer (with a producer of its own; one that cannot be
    /// made ends the process, status 1).
    public func withBurstFlush(
        before: [any Service], ledger: RedisBurstLedger?, apps: LiveAppDirectory, explain: (any ExplainSink)?
    ) -> [any Service] {
        guard let ledger else { return before }
        let topics = pipeline.kafka.topics
        let flusher = BurstFlusher(ledger: ledger) { lane in topics.deliverable(lane) }
        return withFlushTimer(before: before, named: "burst flush") { producer in
            BurstFlushService(
                flusher: flusher, apps: apps, producer: producer, explain: explain, activity: ledger.activity,
                metrics: context.metrics, logger: logger, settle: { await ledger.settle() })
        }
    }
}

/// Runs suppress's burst flush timer (`BurstFlusher`) until shutdown, a pass every `BurstFlusher.interval` while this
/// process's held messages may wait for a flush and every `BurstFlusher.idleInterval` otherwise
/// (`BurstFlusher.nextWait`), producing the flushes through a producer of its own. A failing pass (Redis or the broker down) is logged and counted; its
/// flushes stay leased and are taken again.
public struct BurstFlushService: Service {
    let flusher: BurstFlusher
    let timer: FlushTimer
    let activity: BurstActivity?
    let settle: (@Sendable () async -> Void)?

    /// - Parameter activity: this process's holds; nil: every pass `BurstFlusher.interval` apart.
    /// - Parameter settle: run once when the timer stops (the ledger's last bookkeeping).
    public init(
        flusher: BurstFlusher, apps: LiveAppDirectory, producer: KafkaProducer, explain: (any ExplainSink)?,
        activity: BurstActivity? = nil, metrics: StageMetrics, logger: Logger,
        settle: (@Sendable () async -> Void)? = nil
    ) {
        self.settle = settle
        self.activity = activity
        self.flusher = flusher
        self.timer = FlushTimer(apps: apps, producer: producer, explain: explain, metrics: metrics, logger: logger)
    }

    public func run() async throws {
        let (metrics, logger, activity) = (timer.metrics, timer.logger, self.activity)
        await timer.run(
            failure: "burst flush failed; retried", activeWait: BurstFlusher.interval,
            isActive: { $0.apps.values.contains(where: { $0.coalesce.isOn || $0.floodGuard.isOn }) },
            settle: settle
        ) { directory, now, produce in
            let pass = try await flusher.pass(apps: directory, now: now, produce: produce)
            if pass.flushed > pass.summaries {
                metrics.coalesced(outcome: "flushed", count: pass.flushed - pass.summaries)
            }
            if pass.summaries > 0 { metrics.coalesced(outcome: "flood_summary", count: pass.summaries) }
            for detail in pass.invalid {
                metrics.coalesced(outcome: "invalid")
                logger.error("a held burst record did not decode; burst dropped", metadata: ["error": "\(detail)"])
            }
            for lost in pass.missing {
                metrics.coalesced(outcome: "missing")
                logger.warning(
                    "a held message's event was gone from Redis; its flush was not sent",
                    metadata: [
                        LogKey.app: "\(lost.app)", LogKey.user: "\(lost.user)",
                        LogKey.conversation: "\(lost.conversation)", LogKey.count: "\(lost.count)",
                    ])
            }
            var wait = BurstFlusher.interval
            if let activity {
                let found = pass.flushed > 0 || !pass.invalid.isEmpty || !pass.missing.isEmpty
                wait = BurstFlusher.nextWait(
                    lastHeldAt: activity.lastHeldAt, foundDue: found, now: BatchContext.millis(Date()), apps: directory)
            }
            return FlushTimer.Outcome(explain: pass.explain, wait: wait)
        }
    }
}
