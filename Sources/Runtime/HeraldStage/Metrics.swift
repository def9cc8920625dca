import CoreMetrics
import Foundation
import Metrics
import Prometheus
import Synchronization

/// The process-wide metrics backend. Executables call `bootstrap()` once, first thing; libraries only ever use
/// swift-metrics objects (or a `StageMetrics` handed to them).
public enum HeraldMetrics {
    private static let state = Mutex<PrometheusCollectorRegistry?>(nil)

    /// Bucket bounds of the stage latency histogram (`herald_stage_latency_seconds`), 1 ms to 30 s.
    public static let latencyBuckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25),
        .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
        .milliseconds(2500), .seconds(5), .seconds(10), .seconds(30),
    ]

    /// A Prometheus metrics factory over `registry`, with Herald's histogram buckets.
    public static func makeFactory(registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = latencyBuckets
        return factory
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

/// The metrics every stage reports, named once. Every series carries the label `stage`.
///
/// | metric | type | labels |
/// | --- | --- | --- |
/// | `herald_consumed_total` | counter | stage, topic |
/// | `herald_produced_total` | counter | stage, topic |
/// | `herald_stage_latency_seconds` | histogram | stage |
/// | `herald_suppressed_total` | counter | stage, reason |
/// | `herald_apns_responses_total` | counter | stage, status, reason |
/// | `herald_retries_total` | counter | stage, reason |
/// | `herald_dlq_total` | counter | stage, reason |
/// | `herald_in_flight` | gauge | stage |
/// | `herald_consumer_lag` | gauge | stage, topic, partition |
/// | `herald_connections` | gauge | stage, kind |
/// | `herald_jwt_renewals_total` | counter | stage |
/// | `herald_redis_errors_total` | counter | stage, code |
/// | `herald_lane_consumed_total` | counter | stage, lane |
/// | `herald_lane_latency_seconds` | histogram | stage, lane |
/// | `herald_lane_in_flight` | gauge | stage, lane |
///
/// The `herald_lane_*` series come from a lane's metrics (`lane(_:)`), one per stage loop.
public struct StageMetrics: Sendable {
    public enum Name {
        public static let consumed = "herald_consumed_total"
        public static let produced = "herald_produced_total"
        public static let latency = "herald_stage_latency_seconds"
        public static let suppressed = "herald_suppressed_total"
        public static let apnsResponses = "herald_apns_responses_total"
        public static let retries = "herald_retries_total"
        public static let dlq = "herald_dlq_total"
        public static let inFlight = "herald_in_flight"
        public static let consumerLag = "herald_consumer_lag"
        public static let connections = "herald_connections"
        public static let jwtRenewals = "herald_jwt_renewals_total"
        public static let redisErrors = "herald_redis_errors_total"
        public static let laneConsumed = "herald_lane_consumed_total"
        public static let laneLatency = "herald_lane_latency_seconds"
        public static let laneInFlight = "herald_lane_in_flight"
    }

    public let stage: String
    private let factory: any MetricsFactory
    private let latencyTimer: Metrics.Timer
    private let inFlightMeter: CoreMetrics.Meter
    private let jwtRenewalCounter: CoreMetrics.Counter
    /// Set on a lane's metrics: the lane's name and series, and the in-flight of every lane (for the total).
    public private(set) var lane: String?
    private var laneSeries: (latency: Metrics.Timer, inFlight: CoreMetrics.Meter, consumed: CoreMetrics.Counter)?
    private var laneTotals = LaneTotals()

    /// - Parameters:
    ///   - stage: the stage name (`ingest`, `resolve`, `suppress`, `render`, `send`, `registry`).
    ///   - factory: where the metrics go; `MetricsSystem.factory` (after `HeraldMetrics.bootstrap()`) by default,
    ///     or a factory of its own in tests.
    public init(stage: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.stage = stage
        self.factory = factory
        self.latencyTimer = Metrics.Timer(label: Name.latency, dimensions: [("stage", stage)], factory: factory)
        self.inFlightMeter = CoreMetrics.Meter(label: Name.inFlight, dimensions: [("stage", stage)], factory: factory)
        self.jwtRenewalCounter = CoreMetrics.Counter(label: Name.jwtRenewals, dimensions: [("stage", stage)], factory: factory)
        // Make the fixed series visible at zero from the start.
        self.inFlightMeter.set(0)
        self.jwtRenewalCounter.increment(by: 0)
    }

    /// The same metrics for one lane's stage loop: they also feed the `herald_lane_*` series, and
    /// `herald_in_flight` is the sum over the lanes.
    public func lane(_ name: String) -> StageMetrics {
        var copy = self
        copy.lane = name
        let dimensions = [("stage", stage), ("lane", Self.labelValue(name))]
        copy.laneSeries = (Metrics.Timer(label: Name.laneLatency, dimensions: dimensions, factory: factory),
                           CoreMetrics.Meter(label: Name.laneInFlight, dimensions: dimensions, factory: factory),
                           CoreMetrics.Counter(label: Name.laneConsumed, dimensions: dimensions, factory: factory))
        copy.laneSeries?.inFlight.set(0)
        copy.laneSeries?.consumed.increment(by: 0)
        return copy
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

    /// Time from a record's consumption to its outputs being acknowledged.
    public func recordLatency(_ duration: Duration) {
        latencyTimer.record(duration: duration)
        laneSeries?.latency.record(duration: duration)
    }

    /// A suppression, by reason code (docs/behaviour.md §6) (`sender`, `ignored`, `no_devices`, `online`, ...).
    public func suppressed(reason: String, count: Int = 1) {
        counter(Name.suppressed, [("reason", Self.labelValue(reason))]).increment(by: count)
    }

    /// An APNs answer: HTTP status and APNs reason (empty for 200).
    public func apnsResponse(status: Int, reason: String?, count: Int = 1) {
        counter(Name.apnsResponses, [("status", String(status)), ("reason", Self.labelValue(reason ?? ""))]).increment(by: count)
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
        inFlightMeter.set(Double(laneTotals.set(lane, value)))
    }

    /// The consumer group's lag on one partition (high watermark minus committed offset).
    public func setConsumerLag(topic: String, partition: Int32, lag: Int64) {
        CoreMetrics.Gauge(label: Name.consumerLag, dimensions: [("stage", stage), ("topic", topic), ("partition", String(partition))], factory: factory)
            .record(lag)
    }

    /// Open connections of a kind (`kafka`, `redis`, `apns`).
    public func setConnections(kind: String, count: Int) {
        CoreMetrics.Gauge(label: Name.connections, dimensions: [("stage", stage), ("kind", Self.labelValue(kind))], factory: factory)
            .record(count)
    }

    /// A provider JWT was renewed.
    public func jwtRenewed() { jwtRenewalCounter.increment() }

    /// A Redis call failed, by `RedisError` code.
    public func redisError(code: String) {
        counter(Name.redisErrors, [("code", Self.labelValue(code))]).increment()
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
    /// Sets one lane's value; returns the sum over the lanes.
    func set(_ lane: String, _ value: Int) -> Int {
        values.withLock { $0[lane] = value; return $0.values.reduce(0, +) }
    }
}
