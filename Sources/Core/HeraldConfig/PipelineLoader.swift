// Reads the pipeline file's YAML into `PipelineConfig`: the top-level sections here, the apps in
// AppSectionReader.swift. Unknown keys become warnings the caller logs.

import Foundation
import HeraldCore
import Yams

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
        r.check(
            top, "",
            known: [
                "api", "apps", "defaults", "explain", "idempotency", "kafka", "redis", "stages", "tracing",
            ])
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
        if let x = top["tracing"] { config.tracing = try readTracing(&r, x) }

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

    static func readTracing(_ r: inout Reader, _ node: Node) throws(ConfigError) -> TracingConfig {
        var x = TracingConfig()
        let m = try r.mapping(node, "tracing")
        r.check(
            m, "tracing",
            known: [
                "enabled", "endpoint", "export_interval_ms", "max_batch_spans", "max_queue_spans",
                "resource_attributes", "sample_ratio", "service_name",
            ])
        if let v = try r.bool(m["enabled"], "tracing.enabled") { x.enabled = v }
        if let s = m["sample_ratio"] {
            guard let v = s.float, v >= 0, v <= 1 else {
                throw ConfigError(path: "tracing.sample_ratio", message: "expected a number from 0 to 1")
            }
            x.sampleRatio = v
        }
        if let v = try r.string(m["endpoint"], "tracing.endpoint") {
            guard v.hasPrefix("http://") || v.hasPrefix("https://") else {
                throw ConfigError(path: "tracing.endpoint", message: "expected an http:// or https:// URL")
            }
            x.endpoint = v
        }
        if let v = try r.string(m["service_name"], "tracing.service_name"), !v.isEmpty { x.serviceName = v }
        if let n = m["resource_attributes"] {
            for (key, value) in try r.mapping(n, "tracing.resource_attributes").pairs {
                guard let v = try r.string(value, "tracing.resource_attributes.\(key)") else { continue }
                x.resourceAttributes[key] = v
            }
        }
        if let v = try r.int(m["max_queue_spans"], "tracing.max_queue_spans", in: 1...1_000_000) { x.maxQueueSpans = v }
        if let v = try r.int(m["max_batch_spans"], "tracing.max_batch_spans", in: 1...1_000_000) { x.maxBatchSpans = v }
        if let v = try r.int(m["export_interval_ms"], "tracing.export_interval_ms", in: 1...600_000) {
            x.exportIntervalMs = v
        }
        guard x.maxBatchSpans <= x.maxQueueSpans else {
            throw ConfigError(path: "tracing.max_batch_spans", message: "must not exceed tracing.max_queue_spans")
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
