import CoreMetrics
import Foundation
import HeraldCore
import Metrics
import Prometheus
import Synchronization

/// The process-wide metrics backend. Executables call `bootstrap()` once, first thing; libraries only ever use
/// swift-metrics objects (or a `StageMetrics` handed to them).
public enum HeraldMetrics {
    private static let state = Mutex<PrometheusCollectorRegistry?>(nil)

    /// Bucket bounds of every duration histogram (`herald_stage_latency_seconds` and the others), 0.1 ms to 30 s:
    /// fine below 5 ms, where a stage's own time per hop is held (docs/performance.md, "Herald's own time per hop"),
    /// coarse above.
    public static let latencyBuckets: [Duration] = [
        .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2),
        .milliseconds(3), .milliseconds(4), .milliseconds(5), .milliseconds(10), .milliseconds(25),
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
        .milliseconds(2500), .seconds(5), .seconds(10), .seconds(30),
    ]

    /// A Prometheus metrics factory over `registry`, with Herald's histogram buckets.
    public static func makeFactory(registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = latencyBuckets
        return factory
    }

    /// The counted histograms (`CountedHistogram`) made for each registry; the registries are kept with them.
    private static let countedSets = Mutex<[(registry: PrometheusCollectorRegistry, set: CountedHistograms)]>([])

    static func counted(for registry: PrometheusCollectorRegistry) -> CountedHistograms {
        countedSets.withLock { sets in
            if let known = sets.first(where: { $0.registry === registry }) { return known.set }
            let made = CountedHistograms()
            sets.append((registry, made))
            return made
        }
    }

    /// What `/metrics` serves for `registry`: its series in the Prometheus text format, then the counted
    /// histograms the stage made for it (`herald_stage_latency_seconds` and the other per-record durations).
    public static func emit(_ registry: PrometheusCollectorRegistry) -> [UInt8] {
        var buffer = registry.emitToBuffer()
        countedSets.withLock { sets in sets.first(where: { $0.registry === registry })?.set }?.emit(into: &buffer)
        return buffer
    }

    /// Bootstraps swift-metrics with a Prometheus factory (`MetricsSystem.bootstrap(PrometheusMetricsFactory(registry:))`)
    /// and returns the registry `/metrics` serves. Calling it again returns the same registry and changes nothing.
    @discardableResult
    public static func bootstrap() -> PrometheusCollectorRegistry {
        state.withLock { existing in
            if let existing { return existing }
            let registry = PrometheusCollectorRegistry()
            MetricsSystem.bootstrap(makeFactory(registry: registry))
            existing = registry
            return registry
        }
    }
}

/// One metric a stage exports: its name, type, labels, the stages that export it, and the line docs/operations.md
/// shows. `StageMetrics.declarations` is the list for what HeraldStage records; HeraldPushProviders declares its clients'
/// families (`APNsClientMetrics.declarations`). A test checks the docs table against these declarations, and
/// that no Herald source names a `herald_*` metric that is not declared.
public struct MetricDeclaration: Sendable, Hashable {
    public let name: String
    public let type: String
    public let labels: String
    /// `every stage`, or the stages that export it.
    public let stages: String
    public let meaning: String

    public init(_ name: String, _ type: String, labels: String, stages: String = "every stage", _ meaning: String) {
        self.name = name
        self.type = type
        self.labels = labels
        self.stages = stages
        self.meaning = meaning
    }

    /// The docs table (header included) for `declarations`.
    public static func markdownTable(_ declarations: [MetricDeclaration]) -> String {
        var lines = ["| metric | type | labels | exported by | meaning |", "| --- | --- | --- | --- | --- |"]
        for d in declarations {
            lines.append("| `\(d.name)` | \(d.type) | \(d.labels) | \(d.stages) | \(d.meaning) |")
        }
        return lines.joined(separator: "\n")
    }
}

/// The metrics a stage process reports, each declared once (`Name`, `declarations`) and recorded through a method
/// of its own. Every series carries the label `stage`. The `herald_lane_*` series come from a lane's metrics
/// (`lane(_:)`), one per stage loop.
public struct StageMetrics: Sendable {
    public enum Name {
        public static let consumed = "herald_consumed_total"
        public static let produced = "herald_produced_total"
        public static let latency = "herald_stage_latency_seconds"
        public static let processing = "herald_stage_processing_seconds"
        public static let ackWait = "herald_stage_ack_wait_seconds"
        public static let suppressed = "herald_suppressed_total"
        public static let apnsResponses = "herald_apns_responses_total"
        public static let retries = "herald_retries_total"
        public static let dlq = "herald_dlq_total"
        public static let dlqDropped = "herald_dlq_dropped_total"
        public static let inFlight = "herald_in_flight"
        public static let consumerLag = "herald_consumer_lag"
        public static let redisErrors = "herald_redis_errors_total"
        public static let laneConsumed = "herald_lane_consumed_total"
        public static let laneLatency = "herald_lane_latency_seconds"
        public static let laneInFlight = "herald_lane_in_flight"
        public static let producerReplaced = "herald_producer_replaced_total"
        public static let crashBreaker = "herald_crash_breaker_total"
        public static let explainDropped = "herald_explain_dropped_total"
        public static let traceSpansDropped = "herald_trace_spans_dropped_total"
        public static let explainPending = "herald_explain_pending"
        public static let sendDuplicates = "herald_send_duplicates_total"
        public static let sendPhase = "herald_send_phase_seconds"
        public static let ingestWarnings = "herald_ingest_warnings_total"
        public static let classified = "herald_classified_total"
        public static let coalesced = "herald_coalesced_total"
        public static let readSync = "herald_read_sync_total"
        public static let digests = "herald_digests_total"
        public static let translations = "herald_translations_total"
        public static let tokenFeedback = "herald_token_feedback_total"
        public static let registryOps = "herald_registry_ops_total"
        public static let ready = "herald_ready"
        public static let readinessCheck = "herald_readiness_check"
        public static let configReloads = "herald_config_reloads_total"
        public static let apiRequests = "herald_api_requests_total"
        public static let buildInfo = "herald_build_info"
        /// Recorded by HeraldKafka's consumer (`KafkaConsumerConfiguration.metricsPrefix`, `herald_kafka`, + `_consumer_errors_total`).
        public static let kafkaConsumerErrors = "herald_kafka_consumer_errors_total"
        /// Recorded by HeraldKafka's consumer at each rebalance (`herald_kafka` + `_partitions_assigned_total` /
        /// `_partitions_revoked_total`).
        public static let kafkaPartitionsAssigned = "herald_kafka_partitions_assigned_total"
        public static let kafkaPartitionsRevoked = "herald_kafka_partitions_revoked_total"
        public static let httpConnectionsClosed = "herald_http_connections_closed_total"
        public static let doorbellRings = "herald_doorbell_rings_total"
        public static let doorbellRingFailures = "herald_doorbell_ring_failures_total"
        public static let doorbellWakes = "herald_doorbell_wakes_total"
    }

    /// Everything HeraldStage records, in the order of the docs table.
    public static let declarations: [MetricDeclaration] = [
        MetricDeclaration(Name.consumed, "counter", labels: "stage, topic", "records consumed"),
        MetricDeclaration(
            Name.produced, "counter", labels: "stage, topic", "records produced and acknowledged by the broker"),
        MetricDeclaration(
            Name.latency, "histogram (0.1 ms to 30 s)", labels: "stage",
            "from consumption to outputs acknowledged (per record: its batch's time)"),
        MetricDeclaration(
            Name.processing, "histogram (0.1 ms to 30 s)", labels: "stage",
            "the stage's own part of `herald_stage_latency_seconds`: from consumption to the outputs handed to the producer (decoding, Redis round trips, rendering; at send, the provider's answers too)"
        ),
        MetricDeclaration(
            Name.ackWait, "histogram (0.1 ms to 30 s)", labels: "stage",
            "the broker's part of `herald_stage_latency_seconds`: from the outputs handed to the producer to the broker's last acknowledgement (the producer's linger, the produce round trip, produce retries)"
        ),
        MetricDeclaration(
            Name.suppressed, "counter", labels: "stage, reason",
            "suppressions by reason code (docs/behaviour.md §6: `sender`, `app_off`, `ignored`, `no_devices`, `online`, `conversation_off`, `muted`, `trigger_off`, `not_mentioned`, `snoozed`, `dnd`; ingest's drops); send counts `expired` here (a notification whose `apns-expiration` passed before it could be sent)"
        ),
        MetricDeclaration(
            Name.apnsResponses, "counter", labels: "stage, status, reason", stages: "send",
            "provider answers by HTTP status and reason (APNs, and FCM and webhook answers with their reasons: `UNREGISTERED`, `HTTP503`, ...)"
        ),
        MetricDeclaration(Name.retries, "counter", labels: "stage, reason", stages: "send", "retries scheduled"),
        MetricDeclaration(
            Name.sendDuplicates, "counter", labels: "stage", stages: "send",
            "notifications not sent again because their idempotency record says delivered"),
        MetricDeclaration(
            Name.sendPhase, "histogram (0.1 ms to 30 s)", labels: "stage, lane, phase", stages: "send",
            "where a send batch's time goes: `claim` (the Redis claim round trip), `answer` (from handing the batch to the provider clients to its last answer), `confirm` (writing the last delivery records after it)"
        ),
        MetricDeclaration(
            Name.tokenFeedback, "counter", labels: "stage, reason", stages: "send",
            "dead tokens reported to `herald.token-feedback`, by provider reason"),
        MetricDeclaration(
            Name.ingestWarnings, "counter", labels: "stage, field", stages: "ingest",
            "fields accepted in a repaired or defaulted form"),
        MetricDeclaration(
            Name.classified, "counter", labels: "stage, class", stages: "ingest, resolve",
            "priority classes (`urgent`, `high`, `normal`, `bulk`; docs/pipeline.md, \"Priority lanes\"): events by class at ingest, notifications (recipients) by class at resolve, where the member threshold and mentions are applied"
        ),
        MetricDeclaration(
            Name.coalesced, "counter", labels: "stage, outcome", stages: "suppress",
            "messages of a coalesced burst after its first (docs/behaviour.md §6a): `update` replaced the burst's notification at once, `held` was held back (also `herald_suppressed_total{reason=\"coalesced\"}`), `flushed` counts the updates that showed held messages once the update interval passed, `invalid` a held record that did not decode, `missing` a flush not sent because its held message's event was gone from Redis (docs/behaviour.md §6a); the flood guard's `flood_held` (also `herald_suppressed_total{reason=\"flood_guard\"}`) and `flood_summary` (docs/behaviour.md §6b)"
        ),
        MetricDeclaration(
            Name.translations, "counter", labels: "stage, outcome", stages: "suppress",
            "texts asked of an app's translator (docs/behaviour.md §7a), one per message and language in a batch: `hit` (found in the Redis cache), `translated` (the translator answered), `timeout` (no answer within the app's `translator.deadline_ms`), `failed` (refused connection, a non-2xx answer, an answer that is not LibreTranslate's JSON); on `timeout` and `failed` the push goes out with the original text and the explain trail says `translation_failed:<code>`"
        ),
        MetricDeclaration(
            Name.readSync, "counter", labels: "stage, outcome", stages: "registry",
            "clears of a `mark_read` for the user's other devices (docs/behaviour.md §6c): `sent` (a background push to each), `rate_limited` (the conversation had one within the app's interval), `user_limit` (the user had the app's clears this minute), `no_other_device`, `off` (the app's `read_sync` is off), `app_off` (the app's `push` is off)"
        ),
        MetricDeclaration(
            Name.digests, "counter", labels: "stage, outcome", stages: "suppress",
            "the digest when Do Not Disturb or a snooze ends (docs/behaviour.md §6d): messages `counted` for a digest, `replayed` (counted before), `count_failed` (Redis failed; no digest counts them); digests `sent`, `nothing` (every conversation read), `rescheduled` (the window was extended), `expired` (past the app's `deadline_seconds`; explained `digest_expired`), `no_devices`, `off` (the app's push or digest turned off)"
        ),
        MetricDeclaration(
            Name.registryOps, "counter", labels: "stage, op, outcome", stages: "registry",
            "state updates applied, by op and outcome (`applied`, `applied_moved`, `stale`, ...)"),
        MetricDeclaration(Name.dlq, "counter", labels: "stage, reason", "records written to `herald.dlq`"),
        MetricDeclaration(
            Name.dlqDropped, "counter", labels: "stage",
            "dead letters the DLQ refused too (logged; the partition moves on)"),
        MetricDeclaration(
            Name.producerReplaced, "counter", labels: "stage",
            "producers replaced after a fatal librdkafka error"),
        MetricDeclaration(
            Name.crashBreaker, "counter", labels: "stage, action",
            "the crash-loop breaker: `rerun_batch`, a batch in flight at a crash processed again one record at a time; `dead_letter`, a record in flight at two crashes in a row dead-lettered `crashed`"
        ),
        MetricDeclaration(
            Name.explainDropped, "counter", labels: "stage",
            "explain entries dropped because Redis was slow or absent"),
        MetricDeclaration(
            Name.traceSpansDropped, "counter", labels: "stage, reason",
            "spans of traced events not exported: `queue_full` (more than `tracing.max_queue_spans` waiting, the collector slow or down), `export_failed` (the collector refused the batch or did not answer within 10 s); only with tracing on"
        ),
        MetricDeclaration(
            Name.explainPending, "gauge", labels: "stage",
            "explain entries gathering or being written (`explain.write_interval_ms`); they reach Redis within about that interval"
        ),
        MetricDeclaration(
            Name.inFlight, "gauge", labels: "stage",
            "work started and not yet acknowledged (the sum over the stage's lanes)"),
        MetricDeclaration(
            Name.doorbellRings, "counter", labels: "stage",
            "doorbell rings published (the local profile's idle backoff, docs/kafka.md): at most one per topic per half `idle.after_ms`"
        ),
        MetricDeclaration(
            Name.doorbellRingFailures, "counter", labels: "stage",
            "doorbell rings Redis did not take (the next consumers then wait for their next probe)"),
        MetricDeclaration(
            Name.doorbellWakes, "counter", labels: "stage",
            "doorbell rings heard for one of the stage's topics (each wakes an idle consumer at once)"),
        MetricDeclaration(
            Name.laneConsumed, "counter", labels: "stage, lane",
            "records consumed by the lane's loop (`priority`, `bulk`; docs/pipeline.md, \"Priority lanes\"): the lane's throughput"
        ),
        MetricDeclaration(
            Name.laneLatency, "histogram (0.1 ms to 30 s)", labels: "stage, lane",
            "`herald_stage_latency_seconds` of one lane"),
        MetricDeclaration(Name.laneInFlight, "gauge", labels: "stage, lane", "`herald_in_flight` of one lane"),
        MetricDeclaration(
            Name.consumerLag, "gauge", labels: "stage, topic, partition",
            "high watermark minus committed offset (what KEDA scales on), in Kafka records: between the stages one packs up to 256 notifications"
        ),
        MetricDeclaration(
            Name.redisErrors, "counter", labels: "stage, code", stages: "resolve, suppress, send, registry",
            "Redis failures by `RedisError` code"),
        MetricDeclaration(
            Name.ready, "gauge", labels: "stage",
            "1 when `/readyz` would answer 200, else 0; set from a fresh readiness evaluation on every `/metrics` scrape (the `HeraldStageNotReady` alert)"
        ),
        MetricDeclaration(
            Name.readinessCheck, "gauge", labels: "stage, check",
            "1 per passing readiness check, 0 per failing one (`kafka`, `redis`, `apns`, ...)"),
        MetricDeclaration(
            Name.configReloads, "counter", labels: "stage, outcome", stages: "render, send",
            "pipeline file reloads (SIGHUP or a changed file), `applied` or `refused` (the old configuration keeps running)"
        ),
        MetricDeclaration(
            Name.apiRequests, "counter", labels: "stage, route, status, client", stages: "registry",
            "registry API requests by route template (`PATCH /v1/apps/{app}/users/{user}/preferences`; `unknown`, `unauthenticated`, `method_not_allowed`), HTTP status and calling client (`-` when unauthenticated)"
        ),
        MetricDeclaration(
            Name.buildInfo, "gauge", labels: "stage, version",
            "always 1; `version` is Herald's version (`HeraldVersion.current`, CHANGELOG.md)"),
        MetricDeclaration(
            Name.httpConnectionsClosed, "counter", labels: "stage, endpoint, reason",
            "HTTP connections the server closed itself, by endpoint (`metrics`: the stage's `/metrics` port; `api`: the registry API) and reason: `read_timeout`, `idle_timeout`, `connection_cap` (refused with 503 over `HERALD_HTTP_MAX_CONNECTIONS`), `refused_at_head` (401, 403, 404, 413 or 429 answered before the body was read), `write_timeout` (an answer the client did not take within `HERALD_HTTP_WRITE_TIMEOUT_MS`)"
        ),
    ]

    /// The process's own CPU, memory and descriptors (`ProcessMetrics`), written at each scrape (listed last in the
    /// docs table).
    public static let processDeclarations = ProcessMetrics.families.map {
        MetricDeclaration($0.name, $0.type, labels: "stage", $0.meaning)
    }

    /// The stage's Kafka consumer's own counters, recorded inside HeraldKafka (listed after the provider clients'
    /// families in the docs table).
    public static let kafkaConsumerDeclarations = [
        MetricDeclaration(
            Name.kafkaConsumerErrors, "counter", labels: "group",
            "consume, commit and rebalance errors of the stage's Kafka consumer"),
        MetricDeclaration(
            Name.kafkaPartitionsAssigned, "counter", labels: "group",
            "partitions assigned to the stage's consumer by rebalances (a cooperative rebalance counts only those that moved here)"
        ),
        MetricDeclaration(
            Name.kafkaPartitionsRevoked, "counter", labels: "group",
            "partitions revoked from the stage's consumer by rebalances and at shutdown (cooperative: only those that moved away)"
        ),
    ]

    public let stage: String
    private let factory: any MetricsFactory
    private let latencyTimer: BatchTimer
    private let processingTimer: BatchTimer
    private let ackWaitTimer: BatchTimer
    private let inFlightMeter: CoreMetrics.Meter
    /// Set on a lane's metrics: the lane's name and series, and the in-flight of every lane (for the total).
    public private(set) var lane: String?
    private var laneSeries: (latency: BatchTimer, inFlight: CoreMetrics.Meter, consumed: CoreMetrics.Counter)?
    private var laneTotals = LaneTotals()

    /// - Parameters:
    ///   - stage: the stage name (`ingest`, `resolve`, `suppress`, `render`, `send`, `registry`).
    ///   - factory: where the metrics go; `MetricsSystem.factory` (after `HeraldMetrics.bootstrap()`) by default,
    ///     or a factory of its own in tests.
    public init(stage: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.stage = stage
        self.factory = factory
        self.latencyTimer = BatchTimer(label: Name.latency, dimensions: [("stage", stage)], factory: factory)
        self.processingTimer = BatchTimer(label: Name.processing, dimensions: [("stage", stage)], factory: factory)
        self.ackWaitTimer = BatchTimer(label: Name.ackWait, dimensions: [("stage", stage)], factory: factory)
        self.inFlightMeter = CoreMetrics.Meter(label: Name.inFlight, dimensions: [("stage", stage)], factory: factory)
        // Make the fixed series visible at zero from the start.
        self.inFlightMeter.set(0)
        CoreMetrics.Gauge(
            label: Name.buildInfo, dimensions: [("stage", stage), ("version", HeraldVersion.current)], factory: factory
        ).record(1)
    }

    /// The same metrics for one lane's stage loop: they also feed the `herald_lane_*` series, and
    /// `herald_in_flight` is the sum over the lanes.
    public func lane(_ name: String) -> StageMetrics {
        var copy = self
        copy.lane = name
        let dimensions = [("stage", stage), ("lane", Self.labelValue(name))]
        copy.laneSeries = (
            BatchTimer(label: Name.laneLatency, dimensions: dimensions, factory: factory),
            CoreMetrics.Meter(label: Name.laneInFlight, dimensions: dimensions, factory: factory),
            CoreMetrics.Counter(label: Name.laneConsumed, dimensions: dimensions, factory: factory)
        )
        copy.laneSeries?.inFlight.set(0)
        copy.laneSeries?.consumed.increment(by: 0)
        return copy
    }

    /// Records the phases of a send batch (`claim`, `answer`, `confirm`) on the lane's series; the timers are made
    /// once, here, not per batch.
    public func sendPhaseRecorder() -> @Sendable (_ phase: String, _ duration: Duration) -> Void {
        let lane = Self.labelValue(lane ?? "bulk")
        var timers: [String: Metrics.Timer] = [:]
        for phase in ["claim", "answer", "confirm"] {
            timers[phase] = Metrics.Timer(
                label: Name.sendPhase, dimensions: [("stage", stage), ("lane", lane), ("phase", phase)],
                factory: factory)
        }
        let made = timers
        return { phase, duration in made[phase]?.record(duration: duration) }
    }

    /// Records consumed from `topic`.
    public func consumed(topic: String, count: Int = 1) {
        counter(Name.consumed, [("topic", topic)]).increment(by: count)
        laneSeries?.consumed.increment(by: count)
    }

    /// Records produced to `topic` (acknowledged by the broker).
    public func produced(topic: String, count: Int = 1) {
        counter(Name.produced, [("topic", topic)]).increment(by: count)
    }

    /// Time from a record's consumption to its outputs being acknowledged, for `count` records (a batch's
    /// records count once each, with the batch's time).
    public func recordLatency(_ duration: Duration, count: Int = 1) {
        latencyTimer.record(duration, count: count)
        laneSeries?.latency.record(duration, count: count)
    }

    /// The two parts of a batch's latency, once per completed record: the stage's own processing (consumption to
    /// outputs handed to the producer) and the wait for the broker's acknowledgements after it.
    public func recordLatencyParts(processing: Duration, ackWait: Duration, count: Int) {
        processingTimer.record(processing, count: count)
        ackWaitTimer.record(ackWait, count: count)
    }

    /// A suppression, by reason code (docs/behaviour.md §6) (`sender`, `ignored`, `no_devices`, `online`, ...).
    public func suppressed(reason: String, count: Int = 1) {
        counter(Name.suppressed, [("reason", Self.labelValue(reason))]).increment(by: count)
    }

    /// An APNs answer: HTTP status and APNs reason (empty for 200).
    public func apnsResponse(status: Int, reason: String?, count: Int = 1) {
        counter(Name.apnsResponses, [("status", String(status)), ("reason", Self.labelValue(reason ?? ""))]).increment(
            by: count)
    }

    /// A retry scheduled (to `herald.retry` or in process), by cause.
    public func retried(reason: String, count: Int = 1) {
        counter(Name.retries, [("reason", Self.labelValue(reason))]).increment(by: count)
    }

    /// A record written to the DLQ, by reason.
    public func deadLettered(reason: String, count: Int = 1) {
        counter(Name.dlq, [("reason", Self.labelValue(reason))]).increment(by: count)
    }

    /// Work started / finished: the in-flight gauge.
    public func inFlightIncrement(by amount: Int = 1) { inFlightMeter.increment(by: Double(amount)) }
    public func inFlightDecrement(by amount: Int = 1) { inFlightMeter.decrement(by: Double(amount)) }
    public func setInFlight(_ value: Int) {
        guard let lane, let laneSeries else { return inFlightMeter.set(Double(value)) }
        laneSeries.inFlight.set(Double(value))
        laneTotals.set(lane, value) { inFlightMeter.set(Double($0)) }
    }

    /// The consumer group's lag on one partition (high watermark minus committed offset).
    public func setConsumerLag(topic: String, partition: Int32, lag: Int64) {
        CoreMetrics.Gauge(
            label: Name.consumerLag,
            dimensions: [("stage", stage), ("topic", topic), ("partition", String(partition))], factory: factory
        )
        .record(lag)
    }

    /// A Redis call failed, by `RedisError` code.
    public func redisError(code: String) {
        counter(Name.redisErrors, [("code", Self.labelValue(code))]).increment()
    }

    /// A dead letter the DLQ refused too.
    public func deadLetterDropped() { counter(Name.dlqDropped, []).increment() }

    /// The crash-loop breaker acted (`rerun_batch`, `dead_letter`); a count of 0 makes the series visible.
    public func crashBreaker(action: String, count: Int = 1) {
        counter(Name.crashBreaker, [("action", Self.labelValue(action))]).increment(by: count)
    }

    /// The producer was replaced after a fatal error.
    public func producerReplaced() { counter(Name.producerReplaced, []).increment() }

    /// Explain entries dropped (Redis slow or absent).
    public func explainDropped(count: Int) { counter(Name.explainDropped, []).increment(by: count) }

    /// Spans not exported (`queue_full`, `export_failed`).
    public func traceSpansDropped(reason: String, count: Int) {
        counter(Name.traceSpansDropped, [("reason", Self.labelValue(reason))]).increment(by: count)
    }

    /// Explain entries handed to the writer (positive) or written or dropped (negative).
    public func explainPending(change: Int) {
        let meter = CoreMetrics.Meter(label: Name.explainPending, dimensions: [("stage", stage)], factory: factory)
        if change >= 0 { meter.increment(by: Double(change)) } else { meter.decrement(by: Double(-change)) }
    }

    /// send: notifications not sent again (their idempotency record says delivered).
    public func sendDuplicates(count: Int) { counter(Name.sendDuplicates, []).increment(by: count) }

    /// ingest: a field accepted in a repaired or defaulted form.
    public func ingestWarning(field: String, count: Int = 1) {
        counter(Name.ingestWarnings, [("field", Self.labelValue(field))]).increment(by: count)
    }

    /// ingest and resolve: events (ingest) or recipients (resolve) given a priority class.
    public func classified(_ priorityClass: String, count: Int = 1) {
        counter(Name.classified, [("class", Self.labelValue(priorityClass))]).increment(by: count)
    }

    /// suppress: a message of a coalesced burst or held by the flood guard, by outcome (`update`, `held`, `flushed`,
    /// `invalid`, `missing`, `flood_held`, `flood_summary`).
    public func coalesced(outcome: String, count: Int = 1) {
        counter(Name.coalesced, [("outcome", Self.labelValue(outcome))]).increment(by: count)
    }

    /// registry: what became of a `mark_read`'s clear (`sent`, `rate_limited`, `user_limit`, `no_other_device`, `off`, `app_off`).
    public func readSync(outcome: String, count: Int = 1) {
        counter(Name.readSync, [("outcome", Self.labelValue(outcome))]).increment(by: count)
    }

    /// suppress: digests by outcome (docs/behaviour.md §6d).
    public func digests(outcome: String, count: Int = 1) {
        counter(Name.digests, [("outcome", Self.labelValue(outcome))]).increment(by: count)
    }

    /// suppress: texts asked of a translator, by outcome (`hit`, `translated`, `timeout`, `failed`).
    public func translations(outcome: String, count: Int = 1) {
        counter(Name.translations, [("outcome", Self.labelValue(outcome))]).increment(by: count)
    }

    /// send: a dead token reported to `herald.token-feedback`.
    public func tokenFeedback(reason: String, count: Int = 1) {
        counter(Name.tokenFeedback, [("reason", Self.labelValue(reason))]).increment(by: count)
    }

    /// registry: a state update applied (or not), by op and outcome.
    public func registryOp(op: String, outcome: String, count: Int = 1) {
        counter(Name.registryOps, [("op", Self.labelValue(op)), ("outcome", Self.labelValue(outcome))]).increment(
            by: count)
    }

    private func counter(_ name: String, _ labels: [(String, String)]) -> CoreMetrics.Counter {
        // The Prometheus registry returns the existing series for the same name and labels.
        CoreMetrics.Counter(label: name, dimensions: [("stage", stage)] + labels, factory: factory)
    }

    /// Label values from the wire (an unknown APNs reason) are bounded: at most 64 characters of
    /// `[A-Za-z0-9_.-]`, everything else becomes `_`, so a bad value cannot break the exposition format.
    public static func labelValue(_ raw: String) -> String {
        if raw.utf8.count <= 64, raw.utf8.allSatisfy(isAllowed) { return raw }
        return String(decoding: raw.prefix(64).utf8.map { isAllowed($0) ? $0 : UInt8(ascii: "_") }, as: UTF8.self)
    }

    private static func isAllowed(_ b: UInt8) -> Bool {
        (b >= 0x61 && b <= 0x7a) || (b >= 0x41 && b <= 0x5a) || (b >= 0x30 && b <= 0x39)
            || b == UInt8(ascii: "_") || b == UInt8(ascii: ".") || b == UInt8(ascii: "-")
    }
}

/// The in-flight count of each lane of a stage, shared by the lanes' metrics.
final class LaneTotals: Sendable {
    private let values = Mutex<[String: Int]>([:])
    /// Sets one lane's value and hands the sum over the lanes to `publish`, under the lock: two lanes setting at
    /// once publish their sums in the order they took them, so the last sum published is the current one.
    func set(_ lane: String, _ value: Int, publish: (Int) -> Void) {
        values.withLock {
            $0[lane] = value
            publish($0.values.reduce(0, +))
        }
    }
}
