import Foundation
import HeraldCore

/// Kafka topic names (defaults of docs/behaviour.md §1).
public struct TopicNames: Sendable, Hashable {
    public var chatEvents = "chat.events"
    public var ingested = "herald.ingested"
    public var resolved = "herald.resolved"
    public var deliverable = "herald.deliverable"
    public var outbound = "herald.outbound"
    public var retry = "herald.retry"
    public var dlq = "herald.dlq"
    public var tokenFeedback = "herald.token-feedback"
    public var registry = "herald.registry"
    /// The priority lane's twins of the inter-stage topics (urgent and high classes; docs/pipeline.md).
    public var ingestedPriority = "herald.ingested.priority"
    public var resolvedPriority = "herald.resolved.priority"
    public var deliverablePriority = "herald.deliverable.priority"
    public var outboundPriority = "herald.outbound.priority"
    public var retryPriority = "herald.retry.priority"
    public init() {}

    /// The lane's topics between the stages.
    public func ingested(_ lane: Lane) -> String { lane == .priority ? ingestedPriority : ingested }
    public func resolved(_ lane: Lane) -> String { lane == .priority ? resolvedPriority : resolved }
    public func deliverable(_ lane: Lane) -> String { lane == .priority ? deliverablePriority : deliverable }
    public func outbound(_ lane: Lane) -> String { lane == .priority ? outboundPriority : outbound }
    public func retry(_ lane: Lane) -> String { lane == .priority ? retryPriority : retry }

    /// The topics between the stages, which only Herald's stages read: their records are packed
    /// (docs/kafka.md, "Packed records").
    public var interStage: [String] {
        [
            ingested, resolved, deliverable, outbound, retry, ingestedPriority, resolvedPriority,
            deliverablePriority, outboundPriority, retryPriority,
        ]
    }

    /// Every topic the pipeline uses.
    public var all: [String] {
        [
            chatEvents, ingested, resolved, deliverable, outbound, retry, dlq, tokenFeedback, registry,
            ingestedPriority, resolvedPriority, deliverablePriority, outboundPriority, retryPriority,
        ]
    }
}

/// `kafka:` section.
public struct KafkaConfig: Sendable, Hashable {
    /// Bootstrap servers, comma separated. A stage's `HERALD_KAFKA_BROKERS` overrides (HeraldStage's `ConfigKey`).
    public var brokers = "127.0.0.1:9092"
    public var clientID = "herald"
    public var topics = TopicNames()
    /// Consumer group session timeout.
    public var sessionTimeoutMs = 10_000
    /// How every stage's groups move partitions when a member joins or leaves (`kafka.rebalance`): `cooperative`
    /// (incremental, KIP-429; the default) or `eager` (the whole group stops for each rebalance; for the first step
    /// of moving a running fleet to cooperative, docs/kafka.md "Rebalancing"). A stage's `HERALD_KAFKA_REBALANCE`
    /// overrides.
    public var rebalance = "cooperative"
    /// Extra librdkafka properties, passed through unchanged.
    public var properties: [String: String] = [:]
    /// librdkafka properties whose values come from environment variables (`kafka.properties_env`: property ->
    /// variable name), for secrets such as `sasl.password`; read when a stage starts (`resolvedProperties`).
    public var propertiesEnv: [String: String] = [:]
    /// librdkafka properties whose values are the contents of files (`kafka.properties_file`: property -> path),
    /// for secrets such as `sasl.password` or `ssl.key.pem` mounted from a Kubernetes Secret.
    public var propertiesFile: [String: String] = [:]
    /// The broker the consumer and producer tuning is made for (`kafka.profile`, docs/kafka.md "Broker profiles").
    /// A stage's `HERALD_KAFKA_PROFILE` overrides.
    public var profile = KafkaProfile.production
    /// The profile's keys the pipeline file sets by hand; they win over the profile (`profileOverrides` names them).
    public var tuning = KafkaTuningOverrides()
    /// Packed records between the stages (`kafka.pack`, docs/kafka.md "Packed records"): at most this many
    /// records and bytes per Kafka record; `max_records: 1` turns packing off.
    public var packMaxRecords = 256
    public var packMaxBytes = 65_536
    /// The nice value given to the threads that run the bulk lane's work (`kafka.bulk_nice`, 0 to 19; 0 leaves
    /// them alone): when the cores are busy, the priority lane's work gets the CPU first.
    public var bulkNice = 10
    public init() {}

    /// The bulk lane's consumer and producer settings (`kafka.flow`): the profile's, with the keys set by hand.
    public var bulkFlow: LaneFlow {
        let base = profile.bulkFlow
        return LaneFlow(
            fetchWaitMs: tuning.bulkFetchWaitMs ?? base.fetchWaitMs, lingerMs: tuning.bulkLingerMs ?? base.lingerMs)
    }

    /// The priority lane's (and ingest's) settings (`kafka.priority_flow`).
    public var priorityFlow: LaneFlow {
        let base = profile.priorityFlow
        return LaneFlow(
            fetchWaitMs: tuning.priorityFetchWaitMs ?? base.fetchWaitMs,
            lingerMs: tuning.priorityLingerMs ?? base.lingerMs)
    }

    /// How an idle consumer fetches less (`kafka.idle`); nil when off.
    public var idleBackoff: IdleBackoff? {
        let base = profile.idleBackoff
        let after = tuning.idleAfterMs ?? base?.afterMs ?? 0
        let probe = tuning.idleProbeIntervalMs ?? base?.probeIntervalMs ?? IdleBackoff.defaultProbeIntervalMs
        let doorbell = tuning.idleDoorbellProbeIntervalMs ?? base?.doorbellProbeIntervalMs ?? 0
        return after > 0
            ? IdleBackoff(afterMs: after, probeIntervalMs: probe, doorbellProbeIntervalMs: doorbell) : nil
    }

    /// One line per profile key the pipeline file overrides by hand, naming the key, its value and the profile's
    /// (a stage logs them at startup). Overrides are allowed: the profile is a starting point, not a lock.
    public var profileOverrides: [String] {
        var lines: [String] = []
        func note(_ key: String, _ value: Int?, _ profileValue: Int?) {
            guard let value else { return }
            let theirs = profileValue.map(String.init) ?? "off"
            lines.append("kafka.\(key): \(value) set by hand (profile \(profile.rawValue): \(theirs))")
        }
        note("flow.fetch_wait_ms", tuning.bulkFetchWaitMs, profile.bulkFlow.fetchWaitMs)
        note("flow.linger_ms", tuning.bulkLingerMs, profile.bulkFlow.lingerMs)
        note("priority_flow.fetch_wait_ms", tuning.priorityFetchWaitMs, profile.priorityFlow.fetchWaitMs)
        note("priority_flow.linger_ms", tuning.priorityLingerMs, profile.priorityFlow.lingerMs)
        note("idle.after_ms", tuning.idleAfterMs, profile.idleBackoff?.afterMs)
        note("idle.probe_interval_ms", tuning.idleProbeIntervalMs, profile.idleBackoff?.probeIntervalMs)
        note(
            "idle.doorbell_probe_interval_ms", tuning.idleDoorbellProbeIntervalMs,
            profile.idleBackoff?.doorbellProbeIntervalMs)
        for key in KafkaProfile.librdkafkaKeys.sorted() where properties[key] != nil || propertiesEnv[key] != nil {
            lines.append(
                "kafka.properties.\(key) set by hand: it replaces the profile's per-lane value in every consumer "
                    + "and producer")
        }
        return lines
    }

    /// `properties` with the values of `properties_env` and `properties_file` read in. Throws when a variable is
    /// unset or empty or a file cannot be read; the error names the property and the variable or path, never a
    /// value. A file's trailing newline is dropped.
    public func resolvedProperties(environment: [String: String]) throws(ConfigError) -> [String: String] {
        var out = properties
        for (key, variable) in propertiesEnv.sorted(by: { $0.key < $1.key }) {
            guard let value = environment[variable], !value.isEmpty else {
                throw ConfigError(
                    path: "kafka.properties_env.\(key)", message: "environment variable \(variable) is not set")
            }
            out[key] = value
        }
        for (key, path) in propertiesFile.sorted(by: { $0.key < $1.key }) {
            let text: String
            do {
                text = try String(contentsOfFile: path, encoding: .utf8)
            } catch {
                throw ConfigError(path: "kafka.properties_file.\(key)", message: "cannot read \(path)")
            }
            var value = Substring(text)
            while value.last == "\n" || value.last == "\r" { value = value.dropLast() }
            guard !value.isEmpty else {
                throw ConfigError(path: "kafka.properties_file.\(key)", message: "\(path) is empty")
            }
            out[key] = String(value)
        }
        return out
    }

    /// librdkafka properties that hold secrets: written inline under `properties` they draw a warning.
    public static let secretProperties: Set<String> = [
        "sasl.password", "ssl.key.password", "ssl.key.pem", "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
    ]
}

/// `kafka.profile`: which broker the consumers' and producers' defaults are tuned for (docs/kafka.md, "Broker
/// profiles").
public enum KafkaProfile: String, Sendable, Hashable, CaseIterable {
    /// Apache Kafka and compatible managed services. The broker parks a fetch until a record arrives (with
    /// `fetch.min.bytes` 1), so long fetch waits cost no latency and keep idle consumers nearly silent; the bulk
    /// lane's producers linger a little to batch.
    case production
    /// The local broker (Tansu), which answers a fetch that found nothing only when about half its wait is over:
    /// short waits bound each hop's delay at a light load.
    case local

    public var bulkFlow: LaneFlow {
        switch self {
        case .production: LaneFlow(fetchWaitMs: 500, lingerMs: 5)
        case .local: LaneFlow(fetchWaitMs: 50, lingerMs: 1)
        }
    }

    public var priorityFlow: LaneFlow {
        switch self {
        case .production: LaneFlow(fetchWaitMs: 500, lingerMs: 0)
        case .local: LaneFlow(fetchWaitMs: 10, lingerMs: 0)
        }
    }

    public var idleBackoff: IdleBackoff? {
        switch self {
        case .production: nil
        // Apache Kafka parks an empty fetch until a record arrives: an idle consumer costs little there. Tansu
        // answers every empty fetch: idle consumers probe instead, and the stages ring the next ones awake. 5 s, not
        // 1: the local broker stalls for about a second now and then under load, and a consumer sent idle by such a
        // stall pays a wake on top of it (docs/performance.md, "Idle and the first record").
        case .local: IdleBackoff(afterMs: 5_000, probeIntervalMs: 250, doorbellProbeIntervalMs: 2_000)
        }
    }

    /// The librdkafka properties the profile's keys become; setting one of them under `kafka.properties` overrides
    /// the profile for every lane (allowed, and logged).
    static let librdkafkaKeys: Set<String> = ["fetch.wait.max.ms", "linger.ms", "queue.buffering.max.ms"]

    static func parse(_ raw: String, path: String) throws(ConfigError) -> KafkaProfile {
        guard let p = KafkaProfile(rawValue: raw) else {
            throw ConfigError(
                path: path,
                message:
                    "unknown Kafka profile \(raw); expected production (Apache Kafka and managed services) or local (Tansu)"
            )
        }
        return p
    }

    /// A profile name from the environment (`HERALD_KAFKA_PROFILE`).
    public static func named(_ raw: String) throws(ConfigError) -> KafkaProfile {
        try parse(raw, path: "HERALD_KAFKA_PROFILE")
    }
}

/// The profile's keys set by hand in the pipeline file (nil: the profile's value).
public struct KafkaTuningOverrides: Sendable, Hashable {
    public var bulkFetchWaitMs: Int?
    public var bulkLingerMs: Int?
    public var priorityFetchWaitMs: Int?
    public var priorityLingerMs: Int?
    public var idleAfterMs: Int?
    public var idleProbeIntervalMs: Int?
    public var idleDoorbellProbeIntervalMs: Int?
    public init() {}
}

/// How a consumer that received nothing for `afterMs` fetches: it pauses its partitions and asks the broker for
/// their end offsets once every `probeIntervalMs`, until records are waiting; then it fetches continuously again.
///
/// With `doorbellProbeIntervalMs` above 0 the stages ring a doorbell (Redis pub/sub) when they produced to a topic
/// between stages, which wakes that topic's idle consumers at once; those consumers probe only every
/// `doorbellProbeIntervalMs` (in case a ring was lost). Consumers of topics no stage produces to (the chat back
/// end's events, registry writes) keep `probeIntervalMs`.
public struct IdleBackoff: Sendable, Hashable {
    public static let defaultProbeIntervalMs = 1_000
    public var afterMs: Int
    public var probeIntervalMs: Int
    /// 0: no doorbell.
    public var doorbellProbeIntervalMs: Int
    public init(afterMs: Int, probeIntervalMs: Int, doorbellProbeIntervalMs: Int = 0) {
        self.afterMs = afterMs
        self.probeIntervalMs = probeIntervalMs
        self.doorbellProbeIntervalMs = doorbellProbeIntervalMs
    }

    /// Whether stages ring the doorbell and consumers of rung topics listen for it.
    public var doorbell: Bool { doorbellProbeIntervalMs > 0 }
}

/// How a lane's consumers fetch and its producers batch. A broker such as Tansu answers a fetch that found nothing
/// when (about half) its wait is over, not when a record arrives, so `fetch_wait_ms` bounds each hop's delay while
/// records trickle in; each idle consumer makes about one empty fetch per half wait, which is what a short wait
/// costs (docs/performance.md, "How to read these figures"). Apache Kafka answers as soon as a record arrives.
public struct LaneFlow: Sendable, Hashable {
    /// librdkafka `fetch.wait.max.ms`.
    public var fetchWaitMs: Int
    /// librdkafka `linger.ms` of the lane's producers.
    public var lingerMs: Int
    public init(fetchWaitMs: Int, lingerMs: Int) {
        self.fetchWaitMs = fetchWaitMs
        self.lingerMs = lingerMs
    }
}
