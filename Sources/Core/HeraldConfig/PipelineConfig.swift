// The pipeline file (pipelines/*.yaml) as typed configuration: the whole file, and its Redis, explain,
// idempotency, stage and API sections, each key with its default next to it. Kafka's sections are in
// KafkaConfig.swift, an app's in HeraldCore's AppConfig; PipelineLoader reads the YAML (unknown keys become
// warnings the caller logs, never silently ignored). See docs/pipeline-config.md.

import Foundation
import HeraldCore

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

/// `tracing:` section: OpenTelemetry traces of sampled events (docs/operations.md, "Tracing"). The standard `OTEL_*`
/// environment variables override it (HeraldTracing's `TracingSettings`).
public struct TracingConfig: Sendable, Hashable {
    /// `enabled:` whether the stages propagate trace contexts and export spans. Off, the stages read no trace header
    /// and allocate nothing per record for tracing.
    public var enabled = false
    /// `sample_ratio:` the share of events without an incoming sampling decision (no `traceparent`) that get a new
    /// trace, from 0 to 1. An incoming `traceparent`'s sampled flag is always respected.
    public var sampleRatio = 0.01
    /// `endpoint:` the OTLP/HTTP collector's base URL (`/v1/traces` is appended); nil: the OpenTelemetry default,
    /// `http://localhost:4318`.
    public var endpoint: String?
    /// `service_name:` the `service.name` resource attribute; nil: the stage's name (`herald-ingest`, ...).
    public var serviceName: String?
    /// `resource_attributes:` more resource attributes (a deployment's `deployment.environment`, ...).
    public var resourceAttributes: [String: String] = [:]
    /// `max_queue_spans:` spans waiting for export at most; a span finished with the queue full is dropped and
    /// counted, so a collector that is down never holds up a stage.
    public var maxQueueSpans = 2_048
    /// `max_batch_spans:` spans sent in one export request at most.
    public var maxBatchSpans = 512
    /// `export_interval_ms:` the longest a finished span waits before its batch is exported.
    public var exportIntervalMs = 5_000
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
    public var tracing = TracingConfig()

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
