import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldRedis
import Logging
import ServiceLifecycle

/// suppress's `DigestLedger` over Redis (Digests.swift: the user's digest hash, the schedule's shards;
/// docs/redis-keys.md "Digests").
public struct RedisDigestLedger: DigestLedger {
    public let store: StateStore

    public init(store: StateStore) {
        self.store = store
    }

    public func count(_ counts: [DigestCount], now: Int64) async throws -> [Bool] {
        try await store.countDigests(counts, now: now)
    }

    public func claimDue(app: String, now: Int64) async throws -> [DueDigest] {
        try await store.claimDueDigests(app: app, now: now)
    }

    public func confirm(app: String, _ digest: DueDigest) async throws {
        try await store.confirmDigest(app: app, digest)
    }

    public func reschedule(
        app: String, _ digest: DueDigest, window: DigestSummary.Window, end: Int64, deadlineMilliseconds: Int64,
        now: Int64
    ) async throws {
        try await store.rescheduleDigest(
            app: app, digest, window: window, end: end, deadlineMilliseconds: deadlineMilliseconds, now: now)
    }

    public func users(app: String, _ users: [String], now: Int64) async throws -> [String: UserState] {
        try await store.loadUsers(app: app, users: users, now: now)
    }
}

extension StageSetup {
    /// `before` and, with a ledger, suppress's digest timer (with a producer of its own; one that cannot be made
    /// ends the process, status 1).
    public func withDigests(
        before: [any Service], ledger: RedisDigestLedger?, apps: LiveAppDirectory, explain: (any ExplainSink)?
    ) -> [any Service] {
        guard let ledger else { return before }
        let topics = pipeline.kafka.topics
        let flusher = DigestFlusher(ledger: ledger) { lane in topics.deliverable(lane) }
        return withFlushTimer(before: before, named: "digest") { producer in
            DigestService(
                flusher: flusher, apps: apps, producer: producer, explain: explain, metrics: context.metrics,
                logger: logger)
        }
    }
}

/// Runs suppress's digest timer (`DigestFlusher`) until shutdown: a pass every `interval` while an app has the
/// digest on, `BurstFlusher.interval` apart while digests are found due. A failing pass (Redis or the broker down)
/// is logged and counted; its digests stay leased and are taken again.
public struct DigestService: Service {
    /// How often a process looks for due digests (a digest goes out at most this much after its window ends).
    public static let interval: Duration = .seconds(1)
    let flusher: DigestFlusher
    let timer: FlushTimer

    public init(
        flusher: DigestFlusher, apps: LiveAppDirectory, producer: KafkaProducer, explain: (any ExplainSink)?,
        metrics: StageMetrics, logger: Logger
    ) {
        self.flusher = flusher
        self.timer = FlushTimer(apps: apps, producer: producer, explain: explain, metrics: metrics, logger: logger)
    }

    public func run() async throws {
        let metrics = timer.metrics
        await timer.run(
            failure: "digest pass failed; retried", activeWait: Self.interval,
            isActive: { $0.apps.values.contains(where: { $0.digest.isOn }) }
        ) { directory, now, produce in
            let pass = try await flusher.pass(apps: directory, now: now, produce: produce)
            for (outcome, n) in pass.outcomes { metrics.digests(outcome: outcome, count: n) }
            return FlushTimer.Outcome(
                explain: pass.explain, wait: pass.foundDue ? BurstFlusher.interval : Self.interval)
        }
    }
}
