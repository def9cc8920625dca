// The pipeline file (pipelines/*.yaml) as typed configuration. Every key is
// bound here, with its default next to it; unknown keys become warnings that
// the caller logs (they are never silently ignored). See docs/pipeline-config.md.

import Foundation
import HeraldCore
import Yams

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

/// `redis:` section.
public struct RedisConfig: Sendable, Hashable {
    /// A stage's `HERALD_REDIS_HOST` / `HERALD_REDIS_PORT` override (HeraldStage's `ConfigKey`).
    public var host = "127.0.0.1"
    public var port = 6379
    public var database = 0
    /// Prefix of every key Herald writes.
    public var keyPrefix = "herald"
    /// Commands per pipelined batch.
    public var pipelineBatch = 64
    /// How long an online (presence) entry lives unless refreshed.
    public var presenceTTLSeconds = 120
    /// How long resolve remembers that it counted an event for a user (apps with `counts: true`).
    public var idempotencyTTLSeconds = 86_400
    public init() {}
}

/// `explain:` section: what the explain trail keeps beyond its compact form (docs/pipeline-config.md).
public struct ExplainConfig: Sendable, Hashable {
    /// `full_trail:` users, apps and a sampled share of events whose every entry is kept, routine ones included.
    public var fullTrail = FullTrailPolicy()
    /// `last_decision_shards:` the hashes the users' latest decisions are spread over, per app. Redis keeps a hash
    /// of at most 512 entries (its default) as a compact listpack (about 55 bytes a user) and a larger one as a hashtable (about
    /// 125), so a deployment sets about its users / 100 (docs/capacity.md).
    public var lastDecisionShards = 1_024
    /// `log_shards:` the lists each hour's log is spread over, per app. Reading an event's trail reads its shard's
    /// lists over the retention, so a deployment keeps each under a few thousand lines: about the lines of its
    /// busiest hour / 1,000 (docs/capacity.md).
    public var logShards = 256
    /// `write_interval_ms:` how long a stage gathers explain entries before it writes them (at most): one write
    /// then carries many batches' entries, fewer and larger Redis commands. 0 writes as soon as entries arrive.
    public var writeIntervalMs = 1_000
    public init() {}
}

/// `idempotency:` section: send's delivery records (docs/redis-keys.md, "Idempotency").
public struct IdempotencyConfig: Sendable, Hashable {
    /// A copy of a delivered (event, device) pair that arrives within this long after the delivery is never sent
    /// again; a record lives between one and two windows.
    public var replayWindowSeconds = 3_600
    /// `shards:` the hashes one replay window's records are spread over, per app: about the deliveries of a window
    /// / 100, so each stays a compact listpack (docs/capacity.md).
    public var shards = 1_024
    public init() {}
}

/// One stage's consumer settings under `stages:`.
public struct StageSettings: Sendable, Hashable {
    public var groupID: String
    /// Most records handled per batch.
    public var batchSize = 500
    /// Longest wait to fill a batch.
    public var batchTimeoutMs = 50
    /// Port of `/metrics`, `/healthz`, `/readyz`.
    public var metricsPort: Int
    public init(groupID: String, metricsPort: Int) {
        self.groupID = groupID
        self.metricsPort = metricsPort
    }
}

/// The stage names, in pipeline order.
public enum StageName: String, CaseIterable, Sendable {
    case ingest, resolve, suppress, render, send, registry
}

/// `stages:` section: defaults are group `herald-<stage>` and metrics ports 9101-9106.
public struct StagesConfig: Sendable, Hashable {
    public var settings: [String: StageSettings]
    public init() {
        var s: [String: StageSettings] = [:]
        for (n, stage) in StageName.allCases.enumerated() {
            s[stage.rawValue] = StageSettings(groupID: "herald-\(stage.rawValue)", metricsPort: 9101 + n)
        }
        settings = s
    }

    public subscript(stage: StageName) -> StageSettings {
        settings[stage.rawValue] ?? StageSettings(groupID: "herald-\(stage.rawValue)", metricsPort: 9100)
    }
}

/// `api:` section: the registry HTTP API that herald-registry serves (docs/registry-api.md).
public struct APIConfig: Sendable, Hashable {
    /// Port of the API; nil (the default) serves no API. Env `HERALD_API_PORT` overrides.
    public var port: Int?
    /// Address the API binds. Env `HERALD_API_HOST` overrides.
    public var host = "127.0.0.1"
    /// The calling back ends: client name -> the environment variable that holds its bearer token
    /// (tokens never sit in the file).
    public var clients: [String: String] = [:]
    /// Client name -> the apps it may use (`api.clients.<name>.apps`); a client not listed here may use every app
    /// the pipeline serves.
    public var clientApps: [String: [String]] = [:]
    public init() {}
}

/// The whole pipeline file.
public struct PipelineConfig: Sendable {
    public var apps: AppDirectory
    public var kafka = KafkaConfig()
    public var redis = RedisConfig()
    public var stages = StagesConfig()
    public var api = APIConfig()
    public var explain = ExplainConfig()
    public var idempotency = IdempotencyConfig()

    public init(apps: AppDirectory = AppDirectory()) {
        self.apps = apps
    }

    /// The environment variables the file names in its `*_env` keys (`password_env`, `p12_password_env`,
    /// `translator.api_key_env`, `api.clients.<name>.token_env`): a stage reads them, so they are not unknown keys.
    public var environmentKeys: Set<String> {
        var keys = Set(api.clients.values)
        for app in [apps.fallback] + Array(apps.apps.values) {
            keys.formUnion(app.credentials.compactMap(\.p12PasswordEnv))
            keys.formUnion(app.webhooks.compactMap(\.passwordEnv))
            if let name = app.translator?.apiKeyEnv { keys.insert(name) }
        }
        return keys
    }
}

/// A pipeline file could not be read; `path` is the dotted key path.
public struct ConfigError: Error, Sendable, Hashable, CustomStringConvertible {
    public var path: String
    public var message: String
    public var description: String { "\(path): \(message)" }
}

/// A pipeline file and the warnings (unknown keys) found while reading it.
public struct LoadedPipeline: Sendable {
    public var config: PipelineConfig
    public var warnings: [String]
}

public enum PipelineLoader {
    /// Reads a pipeline file from disk.
    public static func load(path: String) throws(ConfigError) -> LoadedPipeline {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigError(path: path, message: "cannot read: \(error.localizedDescription)")
        }
        return try load(yaml: text)
    }

    /// Parses pipeline YAML. The environment is not read here: a stage applies its overrides through HeraldStage's
    /// `ConfigKey`s (`PipelineConfig.applying`).
    public static func load(yaml: String) throws(ConfigError) -> LoadedPipeline {
        let root: Node?
        do {
            root = try Yams.compose(yaml: yaml)
        } catch {
            // Only the position and the problem: Yams's description goes on to quote the offending lines, which
            // may hold a secret (an inline webhook password), and this message is logged.
            let summary =
                "\(error)".split(separator: "\n", omittingEmptySubsequences: true).first.map(String.init) ?? "\(error)"
            throw ConfigError(path: "(file)", message: "not valid YAML: \(summary)")
        }
        var r = Reader()
        var config = PipelineConfig()
        guard let root else { return LoadedPipeline(config: config, warnings: []) }
        let top = try r.mapping(root, "")
        r.check(top, "", known: ["api", "apps", "defaults", "explain", "idempotency", "kafka", "redis", "stages"])
        // `defaults:` is the base of every listed app: an app's keys override it, mappings merged key by key.
        // Only listed apps exist; records of any other app id are dead-lettered `unknown_app`.
        var fallback = AppConfig()
        var defaultsWarnings = Set<String>()
        let defaultsNode = top["defaults"]
        if let d = defaultsNode {
            let before = r.warnings.count
            fallback = try readApp(&r, d, path: "defaults", appID: "default")
            defaultsWarnings = Set(r.warnings[before...])
        }
        var apps: [String: AppConfig] = [:]
        if let a = top["apps"] {
            for (id, node) in try r.mapping(a, "apps").pairs {
                let path = "apps.\(id)"
                // The app id is part of every Redis key, before the hash tag: a brace in it would become the tag.
                guard !id.isEmpty, !id.contains("{"), !id.contains("}") else {
                    throw ConfigError(path: path, message: "an app id must not be empty or contain { or }")
                }
                let before = r.warnings.count
                apps[id] = try readApp(&r, defaultsNode.map { merged(node, over: $0) } ?? node, path: path, appID: id)
                // A key the defaults section got wrong is reported once, under `defaults`.
                let mine = r.warnings[before...].filter { w in
                    !(w.hasPrefix(path + ".") && defaultsWarnings.contains("defaults." + w.dropFirst(path.count + 1)))
                }
                r.warnings.removeSubrange(before...)
                r.warnings += mine
            }
        }
        config.apps = AppDirectory(apps: apps, fallback: fallback, listedOnly: true)
        if let k = top["kafka"] { config.kafka = try readKafka(&r, k) }
        if let x = top["redis"] { config.redis = try readRedis(&r, x) }
        if let x = top["api"] { config.api = try readAPI(&r, x) }
        if let s = top["stages"] { config.stages = try readStages(&r, s) }
        if let x = top["explain"] { config.explain = try readExplain(&r, x) }
        if let x = top["idempotency"] { config.idempotency = try readIdempotency(&r, x) }

        return LoadedPipeline(config: config, warnings: r.warnings)
    }

    /// `app` with every key of `base` it lacks; where both hold a mapping, merged the same way, key by key.
    /// Any other value of `app` (a scalar, a list) replaces the base's.
    static func merged(_ app: Node, over base: Node) -> Node {
        guard case .mapping(let b) = base else { return app }
        if case .scalar = app, app.null != nil { return base }  // `app9:` with nothing: all defaults
        guard case .mapping(var a) = app else { return app }
        for (key, value) in b {
            if let mine = a[key] { a[key] = merged(mine, over: value) } else { a[key] = value }
        }
        return .mapping(a)
    }

    static let appKeys: Set<String> = [
        "payload", "multi_device", "badge", "counts", "templates", "catalogs", "credentials",
        "expiration_seconds", "call_expiration_seconds", "fcm_credentials", "webhooks",
        "fcm", "collapse_id", "apns", "sendbird", "cometchat", "user_defaults",
        "priority", "interruption_level", "relevance_score", "coalesce", "flood_guard", "read_sync",
        "push", "webpush", "digest", "translator",
    ]

    static func readApp(_ r: inout Reader, _ node: Node, path: String, appID: String) throws(ConfigError) -> AppConfig {
        let m = try r.mapping(node, path)
        r.check(m, path, known: appKeys)
        var profile = PayloadProfile.compact
        if let p = m["payload"] {
            let pm = try r.mapping(p, path + ".payload")
            r.check(pm, path + ".payload", known: ["profile", "key"])
            let name = try r.string(pm["profile"], path + ".payload.profile") ?? "compact"
            let key = try r.string(pm["key"], path + ".payload.key") ?? "sendbird"
            switch name {
            case "compact": profile = .compact
            case "sendbird":
                // The object sits beside Herald's own keys (APNs `aps`, `e`; FCM data `message`, `title`, ...): a
                // key of the same name would be written twice.
                guard !PayloadProfile.reservedSendbirdKeys.contains(key), !key.isEmpty else {
                    throw ConfigError(
                        path: path + ".payload.key",
                        message:
                            "\"\(key)\" is taken by the payload itself; choose another (e.g. sendbird)")
                }
                profile = .sendbird(key: key)
            case "cometchat": profile = .cometchat
            default:
                throw ConfigError(
                    path: path + ".payload.profile", message: "expected compact, sendbird or cometchat, got \(name)")
            }
            if pm["key"] != nil, name != "sendbird" {
                r.warnings.append("\(path).payload.key: only used by the sendbird profile")
            }
        }
        var multi = MultiDeviceMode.allOffline
        if let raw = try r.string(m["multi_device"], path + ".multi_device") {
            guard let v = MultiDeviceMode(rawValue: raw) else {
                throw ConfigError(
                    path: path + ".multi_device",
                    message: "expected all_offline, any_offline or offline_only, got \(raw)")
            }
            multi = v
        }
        let badge = try r.bool(m["badge"], path + ".badge") ?? true
        var templates = TemplateConfig()
        if let t = m["templates"] {
            let tp = path + ".templates"
            let tm = try r.mapping(t, tp)
            r.check(tm, tp, known: ["default", "alternative", "title", "custom_types"])
            if let d = tm["default"] {
                templates.defaultPair = try readPair(
                    &r, d, tp + ".default", fallback: ("{sender_name}: {message}", "{filename}"))
            }
            if let a = tm["alternative"] {
                templates.alternativePair = try readPair(
                    &r, a, tp + ".alternative", fallback: ("New message arrived", "New file arrived"))
            }
            templates.title = try r.string(tm["title"], tp + ".title")
            if let c = tm["custom_types"] {
                for (name, pair) in try r.mapping(c, tp + ".custom_types").pairs {
                    templates.customTypes[name] = try readPair(
                        &r, pair, tp + ".custom_types.\(name)", fallback: ("{sender_name}: {message}", "{filename}"))
                }
            }
        }
        var catalogs: [String: [String: String]] = [:]
        if let c = m["catalogs"] {
            let known = Set(CatalogKey.allCases.map(\.rawValue))
            for (locale, table) in try r.mapping(c, path + ".catalogs").pairs {
                let lp = path + ".catalogs.\(locale)"
                let tm = try r.mapping(table, lp)
                r.check(tm, lp, known: known)
                var strings: [String: String] = [:]
                for (key, value) in tm.pairs where known.contains(key) {
                    strings[key] = try r.string(value, lp + ".\(key)")
                }
                catalogs[locale] = strings
            }
        }
        var credentials: [APNsCredential] = []
        if let c = m["credentials"] {
            for (n, item) in try r.sequence(c, path + ".credentials").enumerated() {
                credentials.append(try readCredential(&r, item, path: path + ".credentials[\(n)]"))
            }
        }
        let expiration = try r.int(m["expiration_seconds"], path + ".expiration_seconds", in: 0...2_592_000) ?? 86_400
        let callExpiration =
            try r.int(m["call_expiration_seconds"], path + ".call_expiration_seconds", in: 0...2_592_000) ?? 30
        var fcmCredentials: [FCMCredential] = []
        if let c = m["fcm_credentials"] {
            for (n, item) in try r.sequence(c, path + ".fcm_credentials").enumerated() {
                let ip = path + ".fcm_credentials[\(n)]"
                let im = try r.mapping(item, ip)
                r.check(im, ip, known: ["provider_id", "service_account_file", "include_notification"])
                guard let id = try r.string(im["provider_id"], ip + ".provider_id"), !id.isEmpty else {
                    throw ConfigError(path: ip + ".provider_id", message: "missing")
                }
                guard let file = try r.string(im["service_account_file"], ip + ".service_account_file"), !file.isEmpty
                else {
                    throw ConfigError(path: ip + ".service_account_file", message: "missing")
                }
                if fcmCredentials.contains(where: { $0.providerID == id }) {
                    throw ConfigError(path: ip + ".provider_id", message: "\(id) is used twice")
                }
                fcmCredentials.append(
                    FCMCredential(
                        providerID: id, serviceAccountFile: file,
                        includeNotification: try r.bool(im["include_notification"], ip + ".include_notification")
                            ?? true))
            }
        }
        var webhooks: [WebhookCredential] = []
        if let c = m["webhooks"] {
            for (n, item) in try r.sequence(c, path + ".webhooks").enumerated() {
                let ip = path + ".webhooks[\(n)]"
                let im = try r.mapping(item, ip)
                r.check(
                    im, ip,
                    known: ["provider_id", "url", "username", "password_env", "password", "region", "every_recipient"])
                guard let id = try r.string(im["provider_id"], ip + ".provider_id"), !id.isEmpty else {
                    throw ConfigError(path: ip + ".provider_id", message: "missing")
                }
                guard let url = try r.string(im["url"], ip + ".url"),
                    url.hasPrefix("https://") || url.hasPrefix("http://")
                else {
                    throw ConfigError(path: ip + ".url", message: "expected an https:// URL")
                }
                if url.hasPrefix("http://") { r.warnings.append("\(ip).url: not HTTPS; use it only for local tests") }
                let hook = WebhookCredential(
                    providerID: id, url: url, username: try r.string(im["username"], ip + ".username"),
                    passwordEnv: try r.string(im["password_env"], ip + ".password_env"),
                    password: try r.string(im["password"], ip + ".password"),
                    region: try r.string(im["region"], ip + ".region") ?? "us",
                    everyRecipient: try r.bool(im["every_recipient"], ip + ".every_recipient") ?? false)
                if hook.password != nil {
                    r.warnings.append("\(ip).password: a password in the pipeline file; prefer password_env")
                }
                webhooks.append(hook)
            }
        }
        var fcm = FCMOptions()
        if let f = m["fcm"] {
            let fm = try r.mapping(f, path + ".fcm")
            r.check(fm, path + ".fcm", known: ["channel_id", "click_action"])
            fcm = FCMOptions(
                channelID: try r.string(fm["channel_id"], path + ".fcm.channel_id"),
                clickAction: try r.string(fm["click_action"], path + ".fcm.click_action"))
        }
        var collapseID = CollapseIDSource.none
        if let raw = try r.string(m["collapse_id"], path + ".collapse_id") {
            guard let source = CollapseIDSource(rawValue: raw) else {
                throw ConfigError(path: path + ".collapse_id", message: "expected none or message, got \(raw)")
            }
            collapseID = source
        }
        let options = try readPayloadOptions(&r, m, path: path, profile: profile)
        let userDefaults = try readUserDefaults(&r, m["user_defaults"], path: path + ".user_defaults")
        var priority = PriorityPolicy()
        if let p = m["priority"] {
            let pm = try r.mapping(p, path + ".priority")
            r.check(pm, path + ".priority", known: Set(PriorityPolicy.keys + ["bulk_member_threshold"]))
            for key in PriorityPolicy.keys {
                guard let raw = try r.string(pm[key], path + ".priority.\(key)") else { continue }
                guard let value = PriorityClass(rawValue: raw) else {
                    throw ConfigError(
                        path: path + ".priority.\(key)",
                        message: "expected one of urgent, high, normal, bulk, got \(raw)")
                }
                priority[key] = value
            }
            if let n = try r.int(pm["bulk_member_threshold"], path + ".priority.bulk_member_threshold") {
                priority.bulkMemberThreshold = n
            }
        }
        var app = AppConfig(
            appID: appID, payloadProfile: profile, multiDevice: multi, badge: badge,
            templates: templates, catalogs: catalogs, credentials: credentials,
            expirationSeconds: Int64(expiration), callExpirationSeconds: Int64(callExpiration),
            fcmCredentials: fcmCredentials, webhooks: webhooks, fcm: fcm,
            collapseID: collapseID, payloadOptions: options, userDefaults: userDefaults,
            priority: priority)
        app.counts = try r.bool(m["counts"], path + ".counts") ?? false
        app.interruption = try readInterruption(&r, m, path: path)
        app.coalesce = try readCoalesce(&r, m["coalesce"], path: path + ".coalesce")
        app.floodGuard = try readFloodGuard(&r, m["flood_guard"], path: path + ".flood_guard")
        app.readSync = try readReadSync(&r, m["read_sync"], path: path + ".read_sync")
        app.push = try readSwitch(&r, m["push"], path: path + ".push") ?? true
        app.webPush = try readWebPush(&r, m["webpush"], path: path + ".webpush")
        app.digest = try readDigest(&r, m["digest"], path: path + ".digest")
        app.translator = try readTranslator(&r, m["translator"], path: path + ".translator")
        return app
    }

    /// `translator:` of an app (or of `defaults:`, for every app): `off` (the default), or `url` (the
    /// LibreTranslate server), `api_key_env`, `deadline_ms` (50 to 30000; default 1000), `cache_ttl_seconds` (0 to 30
    /// days; default 3600; 0 keeps nothing) and `cache_max_entries` (0 to 10,000,000; default 10,000; 0 keeps nothing)
    /// (docs/behaviour.md §7a).
    static func readTranslator(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> TranslatorPolicy?
    {
        guard let node else { return nil }
        if node.mapping == nil {
            guard try r.string(node, path) == "off" else {
                throw ConfigError(
                    path: path,
                    message: "expected off or {url, api_key_env, deadline_ms, cache_ttl_seconds, cache_max_entries}")
            }
            return nil
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["url", "api_key_env", "deadline_ms", "cache_ttl_seconds", "cache_max_entries"])
        guard let url = try r.string(m["url"], path + ".url"), url.hasPrefix("https://") || url.hasPrefix("http://"),
            url.utf8.count <= ChatEvent.Limits.urlBytes
        else {
            throw ConfigError(path: path + ".url", message: "expected the translator's https:// URL")
        }
        if url.hasPrefix("http://") {
            r.warnings.append(
                "\(path).url: not HTTPS; message texts cross the network in the clear (use it only for local tests)")
        }
        var apiKeyEnv: String?
        if let name = try r.string(m["api_key_env"], path + ".api_key_env") {
            guard !name.isEmpty else {
                throw ConfigError(
                    path: path + ".api_key_env", message: "empty (the environment variable holding the API key)")
            }
            apiKeyEnv = name
        }
        let deadline = try r.int(m["deadline_ms"], path + ".deadline_ms", in: 50...30_000)
        let ttl = try r.int(m["cache_ttl_seconds"], path + ".cache_ttl_seconds", in: 0...2_592_000)
        let entries = try r.int(m["cache_max_entries"], path + ".cache_max_entries", in: 0...10_000_000)
        return TranslatorPolicy(
            url: url, apiKeyEnv: apiKeyEnv,
            deadlineMilliseconds: deadline.map(Int64.init) ?? TranslatorPolicy.defaultDeadlineMilliseconds,
            cacheTTLMilliseconds: ttl.map { Int64($0) * 1000 } ?? TranslatorPolicy.defaultCacheTTLMilliseconds,
            cacheMaxEntries: entries ?? TranslatorPolicy.defaultCacheMaxEntries)
    }

    /// An on/off switch: `on`/`off` or `true`/`false` (nil when absent).
    static func readSwitch(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> Bool? {
        guard let node else { return nil }
        if let v = node.bool { return v }
        switch try r.string(node, path) {
        case "on"?: return true
        case "off"?: return false
        default: throw ConfigError(path: path, message: "expected on or off")
        }
    }

    /// `read_sync:` of an app: `on` (the default), `off`, or `{enabled, conversation_seconds (0 to 60; default 3),
    /// per_minute (1 to 1000; default 20)}` (docs/behaviour.md §6c).
    static func readReadSync(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> ReadSyncPolicy {
        guard let node else { return ReadSyncPolicy() }
        if node.mapping == nil {
            switch try r.string(node, path) {
            case "on"?, "true"?: return ReadSyncPolicy()
            case "off"?, "false"?: return .off
            default:
                throw ConfigError(
                    path: path, message: "expected on, off or {enabled, conversation_seconds, per_minute}")
            }
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["enabled", "conversation_seconds", "per_minute"])
        let defaults = ReadSyncPolicy()
        let seconds = try r.int(
            m["conversation_seconds"], path + ".conversation_seconds", in: 0...ReadSync.maxIntervalSeconds)
        return ReadSyncPolicy(
            enabled: try r.bool(m["enabled"], path + ".enabled") ?? true,
            conversationIntervalMilliseconds: seconds.map { Int64($0) * 1000 }
                ?? defaults.conversationIntervalMilliseconds,
            perMinute: try r.int(m["per_minute"], path + ".per_minute", in: 1...1000) ?? defaults.perMinute)
    }

    /// `digest:` of an app: `off` (the default), `on`, or `{conversations_named (0 to 10; default 3), sound (default
    /// false), deadline_seconds (60 to 604800; default 3600)}` (docs/behaviour.md §6d).
    static func readDigest(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> DigestPolicy {
        guard let node else { return DigestPolicy() }
        if node.mapping == nil {
            switch try r.string(node, path) {
            case "on"?, "true"?: return DigestPolicy(enabled: true)
            case "off"?, "false"?: return DigestPolicy()
            default:
                throw ConfigError(
                    path: path, message: "expected on, off or {conversations_named, sound, deadline_seconds}")
            }
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["conversations_named", "sound", "deadline_seconds"])
        let defaults = DigestPolicy(enabled: true)
        let named = try r.int(
            m["conversations_named"], path + ".conversations_named", in: 0...Digest.maxNamedConversations)
        let deadline = try r.int(m["deadline_seconds"], path + ".deadline_seconds", in: 60...604_800)
        return DigestPolicy(
            enabled: true, conversationsNamed: named ?? defaults.conversationsNamed,
            sound: try r.bool(m["sound"], path + ".sound") ?? false,
            deadlineMilliseconds: deadline.map { Int64($0) * 1000 } ?? defaults.deadlineMilliseconds)
    }

    /// `flood_guard:` of an app: `off` (the default), or `per_minute` (1 to 10000) (docs/behaviour.md §6b).
    static func readFloodGuard(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> FloodPolicy {
        guard let node else { return FloodPolicy() }
        if node.mapping == nil {
            guard try r.string(node, path) == "off" else {
                throw ConfigError(path: path, message: "expected off or {per_minute}")
            }
            return FloodPolicy()
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["per_minute"])
        guard let limit = try r.int(m["per_minute"], path + ".per_minute", in: 1...10_000) else {
            throw ConfigError(path: path + ".per_minute", message: "missing (1 to 10000)")
        }
        return FloodPolicy(perMinute: limit)
    }

    /// `coalesce:` of an app: `off` (the default), or `window_seconds` (1 to 3600) and `update_seconds` (0 to the
    /// window; default half of it) (docs/behaviour.md §6a).
    static func readCoalesce(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> CoalescePolicy {
        guard let node else { return CoalescePolicy() }
        if node.mapping == nil {
            guard try r.string(node, path) == "off" else {
                throw ConfigError(path: path, message: "expected off or {window_seconds, update_seconds}")
            }
            return CoalescePolicy()
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["window_seconds", "update_seconds"])
        guard let window = try r.int(m["window_seconds"], path + ".window_seconds", in: 1...3600) else {
            throw ConfigError(path: path + ".window_seconds", message: "missing (1 to 3600)")
        }
        let update = try r.int(m["update_seconds"], path + ".update_seconds", in: 0...window)
        return CoalescePolicy(
            windowMilliseconds: Int64(window) * 1000, updateMilliseconds: update.map { Int64($0) * 1000 })
    }

    /// `interruption_level:` and `relevance_score:` of an app: `off`, or per rule a level (`passive`, `active`,
    /// `time-sensitive`, `critical`) or a score from 0 to 1 over the defaults (docs/pipeline-config.md).
    static func readInterruption(
        _ r: inout Reader, _ m: YAMLMap, path: String
    ) throws(ConfigError)
        -> InterruptionPolicy
    {
        var policy = InterruptionPolicy()
        let rules = Set(InterruptionPolicy.rules)
        if let node = m["interruption_level"] {
            let p = path + ".interruption_level"
            if node.mapping == nil {
                guard try r.string(node, p) == "off" else {
                    throw ConfigError(path: p, message: "expected off or a mapping of rule to level")
                }
                policy.levels = nil
            } else {
                let lm = try r.mapping(node, p)
                r.check(lm, p, known: rules)
                for (rule, value) in lm.pairs where rules.contains(rule) {
                    let raw = try r.string(value, p + "." + rule) ?? ""
                    guard let level = InterruptionLevel(rawValue: raw) else {
                        throw ConfigError(
                            path: p + "." + rule,
                            message: "expected passive, active, time-sensitive or critical, got \(raw)")
                    }
                    policy.levels?[rule] = level
                }
            }
        }
        if let node = m["relevance_score"] {
            let p = path + ".relevance_score"
            if node.mapping == nil {
                guard try r.string(node, p) == "off" else {
                    throw ConfigError(path: p, message: "expected off or a mapping of rule to a score from 0 to 1")
                }
                policy.relevance = nil
            } else {
                let sm = try r.mapping(node, p)
                r.check(sm, p, known: rules)
                for (rule, value) in sm.pairs where rules.contains(rule) {
                    let raw = try r.string(value, p + "." + rule) ?? ""
                    guard let score = Double(raw), score >= 0, score <= 1 else {
                        throw ConfigError(path: p + "." + rule, message: "expected a number from 0 to 1, got \(raw)")
                    }
                    policy.relevance?[rule] = Int((score * 100).rounded())
                }
            }
        }
        return policy
    }

    /// `apns:`, `sendbird:` and `cometchat:` of an app (docs/pipeline-config.md).
    static func readPayloadOptions(
        _ r: inout Reader, _ m: YAMLMap, path: String,
        profile: PayloadProfile
    ) throws(ConfigError) -> PayloadOptions {
        var o = PayloadOptions()
        if let a = m["apns"] {
            let ap = path + ".apns"
            let am = try r.mapping(a, ap)
            r.check(
                am, ap, known: ["alert_string", "content_available", "mutable_content", "sound", "conversation_sounds"])
            o.alertString = try r.bool(am["alert_string"], ap + ".alert_string") ?? false
            o.contentAvailable = try r.bool(am["content_available"], ap + ".content_available") ?? false
            o.mutableContent = try r.bool(am["mutable_content"], ap + ".mutable_content") ?? false
            o.sound = try r.string(am["sound"], ap + ".sound")
            if let cs = am["conversation_sounds"] {
                for (conversation, sound) in try r.mapping(cs, ap + ".conversation_sounds").pairs {
                    o.conversationSounds[conversation] = try r.string(
                        sound, ap + ".conversation_sounds.\(conversation)")
                }
            }
        }
        if let s = m["sendbird"] {
            let sp = path + ".sendbird"
            let sm = try r.mapping(s, sp)
            r.check(
                sm, sp,
                known: [
                    "type_codes", "group_channel_type", "channel_unread_count", "push_title", "push_alert",
                    "audience_type", "mentioned_users",
                ])
            if case .sendbird = profile {} else { r.warnings.append("\(sp): only used by the sendbird profile") }
            if let codes = try r.string(sm["type_codes"], sp + ".type_codes") {
                guard codes == "v3" || codes == "v4" else {
                    throw ConfigError(
                        path: sp + ".type_codes",
                        message: "expected v3 (MESG/FILE/ADMM) or v4 (User/File/Admin), got \(codes)")
                }
                o.sendbirdV3TypeCodes = codes == "v3"
            }
            if let t = try r.string(sm["group_channel_type"], sp + ".group_channel_type") {
                guard t == "group_messaging" || t == "chat" else {
                    throw ConfigError(
                        path: sp + ".group_channel_type", message: "expected group_messaging or chat, got \(t)")
                }
                o.sendbirdGroupChannelType = t
            }
            o.sendbirdChannelUnreadCount = try r.bool(sm["channel_unread_count"], sp + ".channel_unread_count") ?? true
            o.sendbirdPushTitle = try r.bool(sm["push_title"], sp + ".push_title") ?? false
            o.sendbirdPushAlert = try r.bool(sm["push_alert"], sp + ".push_alert") ?? false
            o.sendbirdAudienceType = try r.string(sm["audience_type"], sp + ".audience_type")
            o.sendbirdMentionedUsers = try r.bool(sm["mentioned_users"], sp + ".mentioned_users") ?? false
        }
        if let c = m["cometchat"] {
            let cp = path + ".cometchat"
            let cm = try r.mapping(c, cp)
            r.check(cm, cp, known: ["include_message", "custom"])
            if case .cometchat = profile {} else { r.warnings.append("\(cp): only used by the cometchat profile") }
            o.cometchatIncludeMessage = try r.bool(cm["include_message"], cp + ".include_message") ?? false
            if let text = try r.string(cm["custom"], cp + ".custom") {
                guard let v = try? JSONValue.parse(Array(text.utf8)), case .object = v else {
                    throw ConfigError(path: cp + ".custom", message: "expected a JSON object written as a string")
                }
                o.cometchatCustom = v
            }
        }
        return o
    }

    /// `user_defaults:`: `preset: easemob` (display style simple_banner), `display_style`, `template`, `trigger`.
    static func readUserDefaults(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> Preferences? {
        guard let node else { return nil }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["preset", "display_style", "template", "trigger"])
        var p = Preferences()
        if let preset = try r.string(m["preset"], path + ".preset") {
            guard preset == "easemob" else {
                throw ConfigError(path: path + ".preset", message: "expected easemob, got \(preset)")
            }
            p.displayStyle = .simpleBanner
        }
        if let d = try r.string(m["display_style"], path + ".display_style") {
            switch d {
            case "summary": p.displayStyle = .summary
            case "simple_banner", "simple": p.displayStyle = .simpleBanner
            default:
                throw ConfigError(path: path + ".display_style", message: "expected summary or simple_banner, got \(d)")
            }
        }
        if let t = try r.string(m["template"], path + ".template") {
            guard let v = TemplateChoice(rawValue: t) else {
                throw ConfigError(path: path + ".template", message: "expected default or alternative, got \(t)")
            }
            p.template = v
        }
        if let t = try r.string(m["trigger"], path + ".trigger") {
            guard let v = PushTrigger(rawValue: t) else {
                throw ConfigError(path: path + ".trigger", message: "expected all, mention_only or off, got \(t)")
            }
            p.trigger = v
        }
        return p
    }

    static func readPair(
        _ r: inout Reader, _ node: Node, _ path: String,
        fallback: (String, String)
    ) throws(ConfigError) -> TemplatePair {
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["text", "file"])
        return TemplatePair(
            text: try r.string(m["text"], path + ".text") ?? fallback.0,
            file: try r.string(m["file"], path + ".file") ?? fallback.1)
    }

    static func readCredential(_ r: inout Reader, _ node: Node, path: String) throws(ConfigError) -> APNsCredential {
        let m = try r.mapping(node, path)
        r.check(
            m, path,
            known: [
                "bundle_id", "environment", "team_id", "key_id", "key_file", "certificate_file",
                "private_key_file", "p12_file", "p12_password_env", "p12_password", "provider_id",
                "content_available", "mutable_content",
            ])
        guard let bundle = try r.string(m["bundle_id"], path + ".bundle_id"), !bundle.isEmpty else {
            throw ConfigError(path: path + ".bundle_id", message: "missing")
        }
        var env = APNsEnvironment.production
        if let e = try r.string(m["environment"], path + ".environment") {
            guard let v = APNsEnvironment(rawValue: e) else {
                throw ConfigError(path: path + ".environment", message: "expected production or sandbox, got \(e)")
            }
            env = v
        }
        var cred = APNsCredential(
            bundleID: bundle, environment: env,
            teamID: try r.string(m["team_id"], path + ".team_id"),
            keyID: try r.string(m["key_id"], path + ".key_id"),
            keyFile: try r.string(m["key_file"], path + ".key_file"),
            certificateFile: try r.string(m["certificate_file"], path + ".certificate_file"),
            privateKeyFile: try r.string(m["private_key_file"], path + ".private_key_file"),
            p12File: try r.string(m["p12_file"], path + ".p12_file"),
            p12PasswordEnv: try r.string(m["p12_password_env"], path + ".p12_password_env"),
            p12Password: try r.string(m["p12_password"], path + ".p12_password"))
        cred.providerID = try r.string(m["provider_id"], path + ".provider_id")
        cred.contentAvailable = try r.bool(m["content_available"], path + ".content_available")
        cred.mutableContent = try r.bool(m["mutable_content"], path + ".mutable_content")
        if cred.p12Password != nil {
            r.warnings.append("\(path).p12_password: a password in the pipeline file; prefer p12_password_env")
        }
        if cred.auth == nil {
            throw ConfigError(
                path: path, message: "needs team_id + key_id + key_file (token auth), certificate_file, or p12_file")
        }
        return cred
    }

    static func readKafka(_ r: inout Reader, _ node: Node) throws(ConfigError) -> KafkaConfig {
        var k = KafkaConfig()
        let m = try r.mapping(node, "kafka")
        r.check(
            m, "kafka",
            known: [
                "brokers", "client_id", "topics", "session_timeout_ms", "properties", "properties_env",
                "properties_file", "profile", "flow", "priority_flow", "idle", "pack", "bulk_nice", "rebalance",
            ])
        if let v = try r.string(m["brokers"], "kafka.brokers") { k.brokers = v }
        if let v = try r.string(m["client_id"], "kafka.client_id") { k.clientID = v }
        if let v = try r.int(m["session_timeout_ms"], "kafka.session_timeout_ms") { k.sessionTimeoutMs = v }
        if let v = try r.string(m["rebalance"], "kafka.rebalance") {
            guard ["cooperative", "eager"].contains(v) else {
                throw ConfigError(path: "kafka.rebalance", message: "expected cooperative or eager, got \(v)")
            }
            k.rebalance = v
        }
        if let v = try r.string(m["profile"], "kafka.profile") {
            k.profile = try KafkaProfile.parse(v, path: "kafka.profile")
        }
        if let t = m["topics"] {
            let tm = try r.mapping(t, "kafka.topics")
            r.check(
                tm, "kafka.topics",
                known: [
                    "chat_events", "ingested", "resolved", "deliverable", "outbound",
                    "retry", "dlq", "token_feedback", "registry", "ingested_priority",
                    "resolved_priority", "deliverable_priority", "outbound_priority",
                    "retry_priority",
                ])
            func set(_ key: String, _ target: inout String) throws(ConfigError) {
                if let v = try r.string(tm[key], "kafka.topics.\(key)") { target = v }
            }
            try set("chat_events", &k.topics.chatEvents)
            try set("ingested", &k.topics.ingested)
            try set("resolved", &k.topics.resolved)
            try set("deliverable", &k.topics.deliverable)
            try set("outbound", &k.topics.outbound)
            try set("retry", &k.topics.retry)
            try set("dlq", &k.topics.dlq)
            try set("token_feedback", &k.topics.tokenFeedback)
            try set("registry", &k.topics.registry)
            try set("ingested_priority", &k.topics.ingestedPriority)
            try set("resolved_priority", &k.topics.resolvedPriority)
            try set("deliverable_priority", &k.topics.deliverablePriority)
            try set("outbound_priority", &k.topics.outboundPriority)
            try set("retry_priority", &k.topics.retryPriority)
        }
        func flow(_ key: String, _ wait: inout Int?, _ linger: inout Int?) throws(ConfigError) {
            guard let n = m[key] else { return }
            let p = "kafka.\(key)"
            let fm = try r.mapping(n, p)
            r.check(fm, p, known: ["fetch_wait_ms", "linger_ms"])
            wait = try r.int(fm["fetch_wait_ms"], p + ".fetch_wait_ms", in: 0...300_000)
            linger = try r.int(fm["linger_ms"], p + ".linger_ms", in: 0...900_000)
        }
        try flow("flow", &k.tuning.bulkFetchWaitMs, &k.tuning.bulkLingerMs)
        try flow("priority_flow", &k.tuning.priorityFetchWaitMs, &k.tuning.priorityLingerMs)
        if let n = m["idle"] {
            let im = try r.mapping(n, "kafka.idle")
            r.check(im, "kafka.idle", known: ["after_ms", "probe_interval_ms", "doorbell_probe_interval_ms"])
            k.tuning.idleAfterMs = try r.int(im["after_ms"], "kafka.idle.after_ms", in: 0...86_400_000)
            k.tuning.idleProbeIntervalMs = try r.int(
                im["probe_interval_ms"], "kafka.idle.probe_interval_ms", in: 10...600_000)
            k.tuning.idleDoorbellProbeIntervalMs = try r.int(
                im["doorbell_probe_interval_ms"], "kafka.idle.doorbell_probe_interval_ms", in: 0...600_000)
        }
        if let v = try r.int(m["bulk_nice"], "kafka.bulk_nice", in: 0...19) { k.bulkNice = v }
        if let n = m["pack"] {
            let pm = try r.mapping(n, "kafka.pack")
            r.check(pm, "kafka.pack", known: ["max_records", "max_bytes"])
            if let v = try r.int(pm["max_records"], "kafka.pack.max_records", in: 1...10_000) { k.packMaxRecords = v }
            if let v = try r.int(pm["max_bytes"], "kafka.pack.max_bytes", in: 1024...16_777_216) { k.packMaxBytes = v }
        }
        if let p = m["properties"] {
            for (key, value) in try r.mapping(p, "kafka.properties").pairs {
                guard let s = value.string else {
                    throw ConfigError(path: "kafka.properties.\(key)", message: "expected a scalar")
                }
                k.properties[key] = s
                if KafkaConfig.secretProperties.contains(key) {
                    r.warnings.append(
                        "kafka.properties.\(key): a secret in the pipeline file; prefer properties_env or properties_file"
                    )
                }
            }
        }
        func names(_ key: String) throws(ConfigError) -> [String: String] {
            guard let n = m[key] else { return [:] }
            var out: [String: String] = [:]
            for (property, value) in try r.mapping(n, "kafka.\(key)").pairs {
                guard let s = value.string, !s.isEmpty else {
                    throw ConfigError(path: "kafka.\(key).\(property)", message: "expected a non-empty string")
                }
                if k.properties[property] != nil {
                    throw ConfigError(
                        path: "kafka.\(key).\(property)", message: "also set under kafka.properties; keep one")
                }
                out[property] = s
            }
            return out
        }
        k.propertiesEnv = try names("properties_env")
        k.propertiesFile = try names("properties_file")
        if let key = Set(k.propertiesEnv.keys).intersection(k.propertiesFile.keys).sorted().first {
            throw ConfigError(
                path: "kafka.properties_file.\(key)", message: "also set under kafka.properties_env; keep one")
        }
        return k
    }

    static func readAPI(_ r: inout Reader, _ node: Node) throws(ConfigError) -> APIConfig {
        var api = APIConfig()
        let m = try r.mapping(node, "api")
        r.check(m, "api", known: ["port", "host", "clients"])
        api.port = try r.int(m["port"], "api.port", in: 0...65535)
        if let host = try r.string(m["host"], "api.host") { api.host = host }
        if let c = m["clients"] {
            for (name, entry) in try r.mapping(c, "api.clients").pairs {
                let path = "api.clients.\(name)"
                let em = try r.mapping(entry, path)
                r.check(em, path, known: ["token_env", "apps"])
                guard let env = try r.string(em["token_env"], path + ".token_env"), !env.isEmpty else {
                    throw ConfigError(
                        path: path + ".token_env",
                        message: "missing (the environment variable holding the client's token)")
                }
                api.clients[name] = env
                if let apps = em["apps"] {
                    var list: [String] = []
                    for (i, item) in try r.sequence(apps, path + ".apps").enumerated() {
                        guard let app = try r.string(item, path + ".apps[\(i)]"), !app.isEmpty else {
                            throw ConfigError(path: path + ".apps[\(i)]", message: "expected an app id")
                        }
                        list.append(app)
                    }
                    guard !list.isEmpty else {
                        throw ConfigError(
                            path: path + ".apps", message: "empty (leave it out to let the client use every app)")
                    }
                    api.clientApps[name] = list
                }
            }
        }
        return api
    }

    static func readRedis(_ r: inout Reader, _ node: Node) throws(ConfigError) -> RedisConfig {
        var x = RedisConfig()
        let m = try r.mapping(node, "redis")
        r.check(
            m, "redis",
            known: [
                "host", "port", "database", "key_prefix", "pipeline_batch",
                "presence_ttl_seconds", "idempotency_ttl_seconds",
            ])
        if let v = try r.string(m["host"], "redis.host") { x.host = v }
        if let v = try r.int(m["port"], "redis.port") { x.port = v }
        if let v = try r.int(m["database"], "redis.database") { x.database = v }
        if let v = try r.string(m["key_prefix"], "redis.key_prefix") { x.keyPrefix = v }
        if let v = try r.int(m["pipeline_batch"], "redis.pipeline_batch") { x.pipelineBatch = v }
        if let v = try r.int(m["presence_ttl_seconds"], "redis.presence_ttl_seconds") { x.presenceTTLSeconds = v }
        if let v = try r.int(m["idempotency_ttl_seconds"], "redis.idempotency_ttl_seconds") {
            x.idempotencyTTLSeconds = v
        }
        return x
    }

    static func readExplain(_ r: inout Reader, _ node: Node) throws(ConfigError) -> ExplainConfig {
        var x = ExplainConfig()
        let m = try r.mapping(node, "explain")
        r.check(m, "explain", known: ["full_trail", "last_decision_shards", "log_shards", "write_interval_ms"])
        if let v = try r.int(m["log_shards"], "explain.log_shards", in: 1...16_777_216) { x.logShards = v }
        if let v = try r.int(m["write_interval_ms"], "explain.write_interval_ms", in: 0...60_000) {
            x.writeIntervalMs = v
        }
        if let v = try r.int(m["last_decision_shards"], "explain.last_decision_shards", in: 1...16_777_216) {
            x.lastDecisionShards = v
        }
        guard let f = m["full_trail"] else { return x }
        let fm = try r.mapping(f, "explain.full_trail")
        r.check(fm, "explain.full_trail", known: ["users", "apps", "sample"])
        for key in ["users", "apps"] {
            guard let list = fm[key] else { continue }
            var values: Set<String> = []
            for (i, item) in try r.sequence(list, "explain.full_trail.\(key)").enumerated() {
                guard let v = try r.string(item, "explain.full_trail.\(key)[\(i)]") else { continue }
                values.insert(v)
            }
            if key == "users" { x.fullTrail.users = values } else { x.fullTrail.apps = values }
        }
        if let s = fm["sample"] {
            guard let v = s.float, v >= 0, v <= 1 else {
                throw ConfigError(path: "explain.full_trail.sample", message: "expected a number from 0 to 1")
            }
            x.fullTrail.sample = v
        }
        return x
    }

    static func readIdempotency(_ r: inout Reader, _ node: Node) throws(ConfigError) -> IdempotencyConfig {
        var x = IdempotencyConfig()
        let m = try r.mapping(node, "idempotency")
        r.check(m, "idempotency", known: ["replay_window_seconds", "shards"])
        if let v = try r.int(m["replay_window_seconds"], "idempotency.replay_window_seconds", in: 60...30 * 86_400) {
            x.replayWindowSeconds = v
        }
        if let v = try r.int(m["shards"], "idempotency.shards", in: 1...16_777_216) { x.shards = v }
        return x
    }

    static func readStages(_ r: inout Reader, _ node: Node) throws(ConfigError) -> StagesConfig {
        var s = StagesConfig()
        let m = try r.mapping(node, "stages")
        r.check(m, "stages", known: Set(StageName.allCases.map(\.rawValue)))
        for stage in StageName.allCases {
            guard let n = m[stage.rawValue] else { continue }
            let p = "stages.\(stage.rawValue)"
            let sm = try r.mapping(n, p)
            r.check(sm, p, known: ["group_id", "batch_size", "batch_timeout_ms", "metrics_port"])
            var settings = s[stage]
            if let v = try r.string(sm["group_id"], p + ".group_id") { settings.groupID = v }
            if let v = try r.int(sm["batch_size"], p + ".batch_size") { settings.batchSize = v }
            if let v = try r.int(sm["batch_timeout_ms"], p + ".batch_timeout_ms") { settings.batchTimeoutMs = v }
            if let v = try r.int(sm["metrics_port"], p + ".metrics_port") { settings.metricsPort = v }
            s.settings[stage.rawValue] = settings
        }
        return s
    }
}

/// A YAML mapping with string keys, in document order.
struct YAMLMap {
    var pairs: [(String, Node)]
    var marks: [String: String]
    subscript(key: String) -> Node? {
        for (k, v) in pairs where k == key { return v }
        return nil
    }
}

/// Reads typed values from YAML nodes, collecting unknown-key warnings.
struct Reader {
    var warnings: [String] = []

    func where_(_ node: Node) -> String { node.mark.map { " (line \($0.line))" } ?? "" }

    func mapping(_ node: Node, _ path: String) throws(ConfigError) -> YAMLMap {
        if case .scalar = node, node.null != nil { return YAMLMap(pairs: [], marks: [:]) }
        guard let m = node.mapping else {
            throw ConfigError(path: path.isEmpty ? "(file)" : path, message: "expected a mapping\(where_(node))")
        }
        var pairs: [(String, Node)] = []
        var marks: [String: String] = [:]
        for (k, v) in m {
            guard let key = k.string else {
                throw ConfigError(path: path, message: "keys must be strings\(where_(k))")
            }
            pairs.append((key, v))
            marks[key] = where_(k)
        }
        return YAMLMap(pairs: pairs, marks: marks)
    }

    func sequence(_ node: Node, _ path: String) throws(ConfigError) -> [Node] {
        guard let s = node.sequence else {
            throw ConfigError(path: path, message: "expected a list\(where_(node))")
        }
        return Array(s)
    }

    mutating func check(_ map: YAMLMap, _ path: String, known: Set<String>) {
        for (key, _) in map.pairs where !known.contains(key) {
            let full = path.isEmpty ? key : path + "." + key
            warnings.append(
                "\(full): unknown key\(map.marks[key] ?? "") (known: \(known.sorted().joined(separator: ", ")))")
        }
    }

    func string(_ node: Node?, _ path: String) throws(ConfigError) -> String? {
        guard let node else { return nil }
        if node.null != nil, node.scalar?.style == .plain { return nil }
        guard case .scalar(let s) = node else {
            throw ConfigError(path: path, message: "expected a string\(where_(node))")
        }
        return s.string
    }

    func int(_ node: Node?, _ path: String, in range: ClosedRange<Int> = 0...Int(Int32.max)) throws(ConfigError) -> Int?
    {
        guard let node else { return nil }
        guard let v = node.int else {
            throw ConfigError(path: path, message: "expected an integer\(where_(node))")
        }
        guard range.contains(v) else {
            throw ConfigError(path: path, message: "expected \(range.lowerBound)...\(range.upperBound), got \(v)")
        }
        return v
    }

    func bool(_ node: Node?, _ path: String) throws(ConfigError) -> Bool? {
        guard let node else { return nil }
        guard let v = node.bool else {
            throw ConfigError(path: path, message: "expected true or false\(where_(node))")
        }
        return v
    }
}
