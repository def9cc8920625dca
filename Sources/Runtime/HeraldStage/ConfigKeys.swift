import Foundation

/// One `HERALD_*` environment key of a stage process: its name, its default, how it is read, and the line
/// docs/operations.md shows for it. `ConfigKey.all` is the one list; every stage reads its keys through
/// `ConfigReader`, and `HeraldStageTests` checks the docs table against this list.
public struct ConfigKey: Sendable, Hashable, CustomStringConvertible {
    /// How a value is read; a value that does not parse stops the process at startup (status 2), naming the key.
    public enum Parse: Sendable, Hashable {
        /// Any non-empty text.
        case text
        /// An integer in the range.
        case integer(ClosedRange<Int64>)
        /// One of the words (compared lowercased).
        case oneOf([String])
    }

    public let name: String
    /// The value used when the key is unset or empty; nil when the default comes from elsewhere (the pipeline
    /// file, the host name, the system trust store): then the reader answers nil and the caller falls back.
    public let defaultValue: String?
    /// The default as the docs table shows it.
    public let documentedDefault: String
    public let parse: Parse
    /// The docs table's "meaning" column.
    public let meaning: String

    public var description: String { name }

    init(_ name: String, default defaultValue: String?, documented: String? = nil, _ meaning: String) {
        self.init(name, default: defaultValue, documented: documented, .text, meaning)
    }

    init(_ name: String, default defaultValue: String?, documented: String? = nil, _ parse: Parse, _ meaning: String) {
        self.name = name
        self.defaultValue = defaultValue
        self.documentedDefault = documented ?? defaultValue.map { "`\($0)`" } ?? "(unset)"
        self.parse = parse
        self.meaning = meaning
    }
}

extension ConfigKey {
    static let positive: Parse = .integer(1...Int64.max)

    // MARK: Every stage

    public static let pipeline = ConfigKey(
        "HERALD_PIPELINE", default: "pipelines/example.yaml",
        "pipeline file: topics, groups, batch sizes, concurrency, apps")
    public static let kafkaBrokers = ConfigKey(
        "HERALD_KAFKA_BROKERS", default: "127.0.0.1:9092", documented: "pipeline `kafka.brokers` (`127.0.0.1:9092`)",
        "Kafka bootstrap servers, comma separated")
    public static let kafkaSessionTimeoutMs = ConfigKey(
        "HERALD_KAFKA_SESSION_TIMEOUT_MS", default: nil, documented: "pipeline `kafka.session_timeout_ms` (10000)",
        positive, "consumer group session timeout, milliseconds")
    public static let kafkaRebalance = ConfigKey(
        "HERALD_KAFKA_REBALANCE", default: nil, documented: "pipeline `kafka.rebalance` (`cooperative`)",
        .oneOf(["cooperative", "eager"]),
        "how the stage's consumer groups move partitions: `cooperative` (only those that change owner) or `eager` (all, for the first step of a migration); [kafka.md](kafka.md#rebalancing)"
    )
    public static let kafkaGroupInstanceID = ConfigKey(
        "HERALD_KAFKA_GROUP_INSTANCE_ID", default: nil, documented: "unset (dynamic membership)",
        "static membership (`group.instance.id`, suffixed with the lane): a stable name per process, e.g. a StatefulSet pod's name; [kafka.md](kafka.md#static-membership)"
    )
    public static let kafkaProfile = ConfigKey(
        "HERALD_KAFKA_PROFILE", default: nil, documented: "pipeline `kafka.profile` (`production`)",
        .oneOf(["production", "local"]),
        "the broker the Kafka tuning is made for: `production` (Apache Kafka, managed services) or `local` (Tansu); [kafka.md](kafka.md#broker-profiles)"
    )
    public static let groupID = ConfigKey(
        "HERALD_GROUP_ID", default: nil, documented: "`stages.<stage>.group_id` (`herald-<stage>`)",
        "consumer group")
    public static let batchSize = ConfigKey(
        "HERALD_BATCH_SIZE", default: nil, documented: "`stages.<stage>.batch_size` (500)", positive,
        "records per batch")
    public static let batchTimeoutMs = ConfigKey(
        "HERALD_BATCH_TIMEOUT_MS", default: nil, documented: "`stages.<stage>.batch_timeout_ms` (50)", positive,
        "longest wait to fill a batch, milliseconds")
    public static let maxInFlight = ConfigKey(
        "HERALD_MAX_IN_FLIGHT", default: "5000", documented: "5000", positive,
        "uncompleted records before the loop stops taking more (send: `HERALD_SEND_MAX_IN_FLIGHT`)")
    public static let redisURL = ConfigKey(
        "HERALD_REDIS_URL", default: "redis://127.0.0.1:6379",
        documented: "pipeline `redis:` (`redis://127.0.0.1:6379`)",
        "`redis://[[user]:password@]host[:port][/db]`; `rediss://` for TLS ([Redis over TLS](#redis-over-tls)); a Redis Cluster: `redis+cluster://` or `rediss+cluster://` with `[user:password@]host:port[,host:port...]` (seed nodes, [Redis Cluster](#redis-cluster))"
    )
    public static let redisHost = ConfigKey(
        "HERALD_REDIS_HOST", default: nil, documented: "pipeline `redis.host`",
        "Redis host, when `HERALD_REDIS_URL` is unset")
    public static let redisPort = ConfigKey(
        "HERALD_REDIS_PORT", default: nil, documented: "pipeline `redis.port`", .integer(1...65535),
        "Redis port, when `HERALD_REDIS_URL` is unset")
    public static let redisCAFile = ConfigKey(
        "HERALD_REDIS_CA_FILE", default: nil, documented: "system trust store",
        "`rediss://`: PEM file of the CA certificates to trust for Redis, instead of the system trust store")
    public static let redisCertFile = ConfigKey(
        "HERALD_REDIS_CERT_FILE", default: nil,
        "`rediss://`: PEM client certificate for a Redis that requires one (`tls-auth-clients yes`), with `HERALD_REDIS_KEY_FILE`"
    )
    public static let redisKeyFile = ConfigKey(
        "HERALD_REDIS_KEY_FILE", default: nil, "`rediss://`: PEM private key of `HERALD_REDIS_CERT_FILE`")
    public static let redisServerName = ConfigKey(
        "HERALD_REDIS_SERVER_NAME", default: nil, documented: "the URL's host",
        "`rediss://`: the name Redis's certificate must carry (and the SNI sent), when it is not the URL's host")
    public static let metricsHost = ConfigKey(
        "HERALD_METRICS_HOST", default: "127.0.0.1",
        "address of the HTTP endpoint (set `0.0.0.0` in a container so Prometheus and the kubelet can reach it)")
    public static let metricsPort = ConfigKey(
        "HERALD_METRICS_PORT", default: "9100", documented: "`stages.<stage>.metrics_port` (9101-9106)",
        .integer(0...65535),
        "port of `/metrics`, `/healthz`, `/readyz`; `0` picks a free port (logged as `http endpoint listening`)")
    public static let shutdownDeadlineMs = ConfigKey(
        "HERALD_SHUTDOWN_DEADLINE_MS", default: "25000", documented: "25000", positive,
        "after SIGTERM/SIGINT the process exits (status 0) no later than this, milliseconds")
    public static let logLevel = ConfigKey(
        "HERALD_LOG_LEVEL", default: "info",
        .oneOf(["trace", "debug", "info", "notice", "warning", "error", "critical"]),
        "trace, debug, info, notice, warning, error, critical")
    public static let instance = ConfigKey(
        "HERALD_INSTANCE", default: nil, documented: "host name", "names this process in logs and the Kafka client id")
    public static let explainTTLSeconds = ConfigKey(
        "HERALD_EXPLAIN_TTL_SECONDS", default: "172800", documented: "172800 (2 days)", positive,
        "how long the explain trail's entries are kept, seconds (support needs at least 86400)")

    // MARK: herald-ingest

    public static let priorityLanes = ConfigKey(
        "HERALD_PRIORITY_LANES", default: "on", .oneOf(["on", "off"]),
        "herald-ingest: `off` puts every event on the bulk lane (the pipeline without lanes, for comparisons)")

    // MARK: herald-send

    public static let apnsHost = ConfigKey(
        "HERALD_APNS_HOST", default: nil, documented: "Apple's host per environment",
        "herald-send: APNs `host:port` (tests: herald-mock-apns)")
    public static let apnsCAFile = ConfigKey(
        "HERALD_APNS_CA_FILE", default: nil, documented: "system trust store",
        "herald-send: PEM file of the CA certificates to trust for APNs, instead of the system trust store")
    public static let apnsConnections = ConfigKey(
        "HERALD_APNS_CONNECTIONS", default: "2", documented: "2", positive,
        "herald-send: HTTP/2 connections per APNs credential")
    public static let apnsPriorityConnections = ConfigKey(
        "HERALD_APNS_PRIORITY_CONNECTIONS", default: "1", documented: "1", .integer(0...8),
        "herald-send: HTTP/2 connections per APNs credential kept for the priority lane only, beside `HERALD_APNS_CONNECTIONS` (0: calls and DMs share the others)"
    )
    public static let apnsTimeoutMs = ConfigKey(
        "HERALD_APNS_TIMEOUT_MS", default: "30000", documented: "30000", positive,
        "herald-send: deadline of one request, milliseconds")
    public static let sendMaxInFlight = ConfigKey(
        "HERALD_SEND_MAX_IN_FLIGHT", default: "2000", documented: "2000", positive,
        "herald-send: notifications in flight per lane (the loop stops taking more beyond)")
    public static let sendMaxAttempts = ConfigKey(
        "HERALD_SEND_MAX_ATTEMPTS", default: "6", documented: "6", positive,
        "herald-send: attempts before DLQ `retries_exhausted`")
    public static let sendRetryInitialMs = ConfigKey(
        "HERALD_SEND_RETRY_INITIAL_MS", default: "1000", documented: "1000", positive,
        "herald-send: first `herald.retry` delay, milliseconds (doubles per attempt)")
    public static let sendRetryMaxMs = ConfigKey(
        "HERALD_SEND_RETRY_MAX_MS", default: "60000", documented: "60000", positive,
        "herald-send: longest `herald.retry` delay, milliseconds")
    public static let sendPriorityReservePercent = ConfigKey(
        "HERALD_SEND_PRIORITY_RESERVE_PERCENT", default: "20", documented: "20", .integer(0...90),
        "herald-send: share of each APNs and FCM connection's streams and of the in-flight slots only the priority lane may use"
    )
    public static let fcmHost = ConfigKey(
        "HERALD_FCM_HOST", default: nil, documented: "`fcm.googleapis.com:443`",
        "herald-send: FCM `host:port` (tests: herald-mock-fcm)")
    public static let fcmCAFile = ConfigKey(
        "HERALD_FCM_CA_FILE", default: nil, documented: "system trust store",
        "herald-send: PEM file of the CA certificates to trust for FCM and its token endpoint, instead of the system trust store"
    )
    public static let fcmConnections = ConfigKey(
        "HERALD_FCM_CONNECTIONS", default: "2", documented: "2", positive,
        "herald-send: HTTP/2 connections per FCM credential")
    public static let fcmPriorityConnections = ConfigKey(
        "HERALD_FCM_PRIORITY_CONNECTIONS", default: "1", documented: "1", .integer(0...8),
        "herald-send: HTTP/2 connections per FCM credential kept for the priority lane only, beside `HERALD_FCM_CONNECTIONS` (0: calls and DMs share the others)"
    )
    public static let webhookCAFile = ConfigKey(
        "HERALD_WEBHOOK_CA_FILE", default: nil, documented: "system trust store",
        "herald-send: PEM file of the CA certificates to trust for webhook endpoints, instead of the system trust store"
    )
    public static let webpushCAFile = ConfigKey(
        "HERALD_WEBPUSH_CA_FILE", default: nil, documented: "system trust store",
        "herald-send: PEM file of the CA certificates to trust for Web Push services, instead of the system trust store"
    )
    public static let webpushMaxOrigins = ConfigKey(
        "HERALD_WEBPUSH_MAX_ORIGINS", default: "64", documented: "64", .integer(1...4096),
        "herald-send: Web Push services (origin and app) with an open HTTP/2 connection at once; one more closes the least recently used"
    )
    public static let translatorCAFile = ConfigKey(
        "HERALD_TRANSLATOR_CA_FILE", default: nil, documented: "system trust store",
        "herald-suppress: PEM file of the CA certificates to trust for the apps' translators (`translator.url`), instead of the system trust store"
    )

    public static let pipelineWatchMs = ConfigKey(
        "HERALD_PIPELINE_WATCH_MS", default: "1000", documented: "1000", .integer(0...Int64.max),
        "herald-render, herald-send: how often the pipeline file's content is compared for a reload, milliseconds; `0`: reload on SIGHUP only"
    )
    public static let apiPort = ConfigKey(
        "HERALD_API_PORT", default: nil, documented: "pipeline `api.port` (unset: no API)", .integer(0...65535),
        "herald-registry: port of the registry API ([registry-api.md](registry-api.md)); `0` picks a free port (logged as `registry api listening`)"
    )
    public static let apiHost = ConfigKey(
        "HERALD_API_HOST", default: nil, documented: "pipeline `api.host` (`127.0.0.1`)",
        "herald-registry: address of the registry API")
    public static let apiTokens = ConfigKey(
        "HERALD_API_TOKENS", default: nil,
        "herald-registry: API clients as `name=token,name=token` (tokens of 32 characters or more, like those of `api.clients`), on top of the pipeline's `api.clients` (whose `token_env` variables hold their tokens); a port with no client at all stops the process at startup"
    )
    public static let apiAuthFailuresPerMinute = ConfigKey(
        "HERALD_API_AUTH_FAILURES_PER_MINUTE", default: "60", documented: "60", .integer(0...1_000_000),
        "herald-registry: failed authentications allowed per client address and minute (a bucket of this size refilled over a minute); beyond, every request from that address is answered 429 before its token is checked; `0`: no limit"
    )
    public static let preferencesMaxConversations = ConfigKey(
        "HERALD_PREFERENCES_MAX_CONVERSATIONS", default: "2000", documented: "2000", .integer(1...1_000_000),
        "herald-registry, heraldctl: most conversation entries in one user's stored preferences; a patch that would go beyond is refused (400 in the API, dead-lettered `over_limit` from herald.registry)"
    )
    public static let preferencesMaxBytes = ConfigKey(
        "HERALD_PREFERENCES_MAX_BYTES", default: "131072", documented: "131072", .integer(1024...16_777_216),
        "herald-registry, heraldctl: largest stored preferences of one user, bytes of JSON; a write that would go beyond is refused like one over `HERALD_PREFERENCES_MAX_CONVERSATIONS`"
    )
    public static let httpReadTimeoutMs = ConfigKey(
        "HERALD_HTTP_READ_TIMEOUT_MS", default: "10000", documented: "10000", positive,
        "every stage's HTTP endpoint and the registry API: time a client has to send a whole request (head and body), from the connection's opening or the request's first byte, milliseconds; a slower client is disconnected"
    )
    public static let httpIdleTimeoutMs = ConfigKey(
        "HERALD_HTTP_IDLE_TIMEOUT_MS", default: "60000", documented: "60000", positive,
        "every stage's HTTP endpoint and the registry API: how long a kept-alive connection may be idle between requests, milliseconds"
    )
    public static let httpWriteTimeoutMs = ConfigKey(
        "HERALD_HTTP_WRITE_TIMEOUT_MS", default: "10000", documented: "10000", positive,
        "every stage's HTTP endpoint and the registry API: time a client has to take an answer (from its first byte written until its last is in the socket), milliseconds; a client that stops reading is disconnected"
    )
    public static let httpMaxConnections = ConfigKey(
        "HERALD_HTTP_MAX_CONNECTIONS", default: "1024", documented: "1024", positive,
        "every stage's HTTP endpoint and the registry API, each: open connections beyond which a new one is answered 503 and closed"
    )
    public static let testCrashMarker = ConfigKey(
        "HERALD_TEST_CRASH_MARKER", default: nil, documented: "unset",
        "debug builds only (release builds ignore it): the stage loop traps on a record whose value contains this text, to test the crash-loop breaker ([pipeline.md](pipeline.md), \"Crash-loop breaker\")"
    )

    /// Every key, in the order of the docs table.
    public static let all: [ConfigKey] = [
        pipeline, kafkaBrokers, kafkaSessionTimeoutMs, kafkaRebalance, kafkaGroupInstanceID, kafkaProfile, groupID,
        batchSize, batchTimeoutMs, maxInFlight,
        redisURL, redisHost, redisPort, redisCAFile, redisCertFile, redisKeyFile, redisServerName, metricsHost,
        metricsPort, shutdownDeadlineMs, logLevel, instance, explainTTLSeconds,
        priorityLanes,
        apnsHost, apnsCAFile, apnsConnections, apnsPriorityConnections, apnsTimeoutMs, sendMaxInFlight, sendMaxAttempts,
        sendRetryInitialMs,
        sendRetryMaxMs, sendPriorityReservePercent, fcmHost, fcmCAFile, fcmConnections, fcmPriorityConnections,
        webhookCAFile, webpushCAFile, webpushMaxOrigins, translatorCAFile,
        pipelineWatchMs, apiPort, apiHost, apiTokens, apiAuthFailuresPerMinute, preferencesMaxConversations,
        preferencesMaxBytes, httpReadTimeoutMs, httpIdleTimeoutMs, httpWriteTimeoutMs, httpMaxConnections,
        testCrashMarker,
    ]

    /// The docs/operations.md table (header included), one row per key.
    public static var markdownTable: String {
        var lines = ["| key | default | meaning |", "| --- | --- | --- |"]
        for key in all { lines.append("| `\(key.name)` | \(key.documentedDefault) | \(key.meaning) |") }
        return lines.joined(separator: "\n")
    }
}

/// A configuration value that could not be used. Every stage treats it alike: one line on stderr naming the key,
/// exit status 2 (`StageSetup.startOrExit`, `StageSetup.valueOrExit`).
public struct ConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    public let key: String
    public let value: String
    public let reason: String

    public init(key: String, value: String, reason: String) {
        self.key = key
        self.value = value
        self.reason = reason
    }

    public var description: String { "\(key)=\(value): \(reason)" }
}

/// Reads `ConfigKey`s from an environment: the one way a stage reads a `HERALD_*` key. Empty values (after
/// trimming spaces) count as unset.
public struct ConfigReader: Sendable {
    public let environment: [String: String]

    public init(_ environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.environment = environment
    }

    /// The value as set, or nil when unset or empty (the key's default is not applied).
    public func raw(_ key: ConfigKey) -> String? {
        guard let v = environment[key.name]?.trimmingCharacters(in: .whitespaces), !v.isEmpty else { return nil }
        return v
    }

    /// The value as set, else the key's default; nil when neither. Checked against the key's `parse`.
    public func text(_ key: ConfigKey) throws(ConfigurationError) -> String? {
        guard let value = raw(key) ?? key.defaultValue else { return nil }
        switch key.parse {
        case .text:
            return value
        case .integer:
            _ = try integer(key, value)
            return value
        case .oneOf(let words):
            guard words.contains(value.lowercased()) else {
                throw ConfigurationError(
                    key: key.name, value: value, reason: "expected one of \(words.joined(separator: ", "))")
            }
            return value.lowercased()
        }
    }

    /// The integer as set, else the key's default; nil when neither.
    public func int(_ key: ConfigKey) throws(ConfigurationError) -> Int? {
        guard let value = raw(key) ?? key.defaultValue else { return nil }
        return Int(try integer(key, value))
    }

    /// `int(_:)` for a key with a default.
    public func requiredInt(_ key: ConfigKey) throws(ConfigurationError) -> Int {
        guard let value = try int(key) else {
            throw ConfigurationError(key: key.name, value: "", reason: "no value and no default")
        }
        return value
    }

    private func integer(_ key: ConfigKey, _ value: String) throws(ConfigurationError) -> Int64 {
        guard case .integer(let range) = key.parse else { return Int64(value) ?? 0 }
        guard let number = Int64(value), range.contains(number) else {
            let reason: String
            if range.upperBound == Int64.max {
                reason =
                    range.lowerBound == 1
                    ? "expected a positive integer" : "expected an integer of at least \(range.lowerBound)"
            } else {
                reason = "expected an integer \(range.lowerBound)-\(range.upperBound)"
            }
            throw ConfigurationError(key: key.name, value: value, reason: reason)
        }
        return number
    }

    /// Keys that heraldctl reads and a stage does not: an operator's shell may export them beside the stages' keys
    /// (scripts/local-stack.sh prints such an `export` line), so a stage started from it does not warn about them.
    public static let heraldctlKeys: Set<String> = ["HERALD_STAGE_ENDPOINTS"]

    /// One line per `HERALD_*` key in the environment that `ConfigKey.all`, `heraldctlKeys` and `extraKnownKeys`
    /// do not name.
    public func unknownKeyWarnings(extraKnownKeys: Set<String> = []) -> [String] {
        let known = Set(ConfigKey.all.map(\.name)).union(Self.heraldctlKeys).union(extraKnownKeys)
        return environment.keys.filter { $0.hasPrefix("HERALD_") && !known.contains($0) }.sorted().map {
            "unknown environment key \($0) (ignored); known keys: \(known.sorted().joined(separator: ", "))"
        }
    }
}
