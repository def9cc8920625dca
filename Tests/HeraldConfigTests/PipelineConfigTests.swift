// The pipeline file (HeraldConfig): loading, defaults, environment overrides and unknown-key warnings.

import Foundation
import HeraldConfig
import HeraldCore
import Testing

/// The repository root (tests run from anywhere).
let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

@Suite("Pipeline configuration")
struct PipelineConfigTests {
    @Test("pipelines/example.yaml loads without warnings")
    func example() throws {
        let loaded = try PipelineLoader.load(path: repoRoot.appendingPathComponent("pipelines/example.yaml").path)
        #expect(loaded.warnings == [])
        let c = loaded.config
        #expect(c.apps.app("app1").payloadProfile == .compact)
        #expect(c.apps.app("app2").payloadProfile == .sendbird(key: "sendbird"))
        #expect(c.apps.app("app2").multiDevice == .anyOffline)
        #expect(c.apps.app("app3").payloadProfile == .cometchat)
        #expect(c.apps.app("app3").webhooks.map(\.everyRecipient) == [true])
        #expect(c.apps.app("app1").webhooks.map(\.everyRecipient) == [false])
        #expect(
            c.apps.app("app1").credentials.first?.auth
                == .token(
                    teamID: "ABCDE12345", keyID: "KEY1234567",
                    keyFile: "/etc/herald/AuthKey_KEY1234567.p8"))
        #expect(c.apps.app("app1").credentials[1].environment == .sandbox)
        #expect(
            c.apps.app("app2").credentials.first?.auth
                == .certificate(
                    certificateFile: "/etc/herald/messenger.pem",
                    privateKeyFile: "/etc/herald/messenger.key"))
        #expect(c.kafka.brokers == "127.0.0.1:19092" && c.kafka.topics.tokenFeedback == "herald.token-feedback")
        #expect(c.redis.port == 16379)
        #expect(c.stages[.send].groupID == "herald-send" && c.stages[.send].metricsPort == 9105)
    }

    @Test("the variables named by *_env keys are the file's environment keys (a stage does not call them unknown)")
    func environmentKeys() throws {
        let example = try PipelineLoader.load(path: repoRoot.appendingPathComponent("pipelines/example.yaml").path)
        #expect(example.config.environmentKeys.contains("HERALD_WEBHOOK_PASSWORD"))
        let yaml = """
            apps:
              a:
                credentials:
                  - {bundle_id: com.example.a, p12_file: /k.p12, p12_password_env: HERALD_P12_PASSWORD}
            api:
              port: 9107
              clients:
                backend: {token_env: HERALD_API_TOKEN_BACKEND}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.config.environmentKeys == ["HERALD_P12_PASSWORD", "HERALD_API_TOKEN_BACKEND"])
    }

    @Test("an app id with a brace is refused: it would become the Redis Cluster hash tag of every key of the app")
    func bracesInAppIds() throws {
        for id in ["\"a{b\"", "\"a}\"", "\"{}\"", "\"\""] {
            #expect {
                try PipelineLoader.load(yaml: "apps:\n  \(id):\n    counts: true\n")
            } throws: { error in
                (error as? ConfigError).map { $0.message.contains("{ or }") } ?? false
            }
        }
        #expect(
            try PipelineLoader.load(yaml: "apps:\n  \"a:b-c.d\":\n    counts: true\n").config.apps.isKnown("a:b-c.d"))
    }

    @Test("unknown keys are reported with their path, not ignored")
    func unknownKeys() throws {
        let yaml = """
            apps:
              a:
                payload: {profile: sendbird, key: sb, colour: red}
                multi_devices: any_offline
                templates:
                  default: {text: "{message}", fil: "{filename}"}
                catalogs:
                  fr: {simple_banner: "Nouveau", simple_baner: "typo"}
            kafka:
              brokerz: x
            zookeeper: true
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        let paths = loaded.warnings.map { String($0.prefix { $0 != ":" }) }
        #expect(
            Set(paths) == [
                "apps.a.payload.colour", "apps.a.multi_devices", "apps.a.templates.default.fil",
                "apps.a.catalogs.fr.simple_baner", "kafka.brokerz", "zookeeper",
            ])
        let app = loaded.config.apps.app("a")
        #expect(app.payloadProfile == .sendbird(key: "sb"))
        #expect(app.strings(for: ["fr"])[.simpleBanner].source == "Nouveau")
    }

    @Test("coalesce and flood_guard: off by default, off, or their settings")
    func restraintSettings() throws {
        let yaml = """
            apps:
              a: {coalesce: {window_seconds: 10}, flood_guard: {per_minute: 6}}
              b: {coalesce: {window_seconds: 30, update_seconds: 3}, flood_guard: off}
              c: {coalesce: off}
              d: {}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings.isEmpty, "\(loaded.warnings)")
        let apps = loaded.config.apps
        #expect(apps.app("a").coalesce == CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 5_000))
        #expect(apps.app("a").floodGuard == FloodPolicy(perMinute: 6))
        #expect(apps.app("b").coalesce == CoalescePolicy(windowMilliseconds: 30_000, updateMilliseconds: 3_000))
        #expect(!apps.app("b").floodGuard.isOn)
        #expect(!apps.app("c").coalesce.isOn && !apps.app("d").coalesce.isOn && !apps.app("d").floodGuard.isOn)
    }

    @Test("digest: off by default, on, off, or its settings")
    func digestSettings() throws {
        let yaml = """
            apps:
              a: {digest: {conversations_named: 5, sound: true, deadline_seconds: 600}}
              b: {digest: off}
              c: {digest: on}
              d: {}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings.isEmpty, "\(loaded.warnings)")
        let apps = loaded.config.apps
        #expect(
            apps.app("a").digest
                == DigestPolicy(enabled: true, conversationsNamed: 5, sound: true, deadlineMilliseconds: 600_000))
        #expect(!apps.app("b").digest.isOn && !apps.app("d").digest.isOn)
        #expect(apps.app("c").digest == DigestPolicy(enabled: true, conversationsNamed: 3, sound: false))
        #expect(DigestPolicy().deadlineMilliseconds == 3_600_000)
        for (yaml, path) in [
            ("apps: {a: {digest: sometimes}}", "apps.a.digest"),
            ("apps: {a: {digest: {conversations_named: 11}}}", "apps.a.digest.conversations_named"),
            ("apps: {a: {digest: {deadline_seconds: 10}}}", "apps.a.digest.deadline_seconds"),
            ("apps: {a: {digest: {sound: loud}}}", "apps.a.digest.sound"),
        ] {
            do {
                _ = try PipelineLoader.load(yaml: yaml)
                Issue.record("accepted \(yaml)")
            } catch {
                #expect(error.path == path, "\(error)")
            }
        }
    }

    @Test("read_sync: on by default, on, off, or its settings")
    func readSyncSettings() throws {
        let yaml = """
            apps:
              a: {read_sync: {conversation_seconds: 10, per_minute: 5}}
              b: {read_sync: off}
              c: {read_sync: {enabled: false}}
              d: {read_sync: on}
              e: {}
              f: {read_sync: {conversation_seconds: 0}}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings.isEmpty, "\(loaded.warnings)")
        let apps = loaded.config.apps
        #expect(
            apps.app("a").readSync
                == ReadSyncPolicy(enabled: true, conversationIntervalMilliseconds: 10_000, perMinute: 5))
        #expect(!apps.app("b").readSync.enabled && !apps.app("c").readSync.enabled)
        #expect(apps.app("d").readSync == ReadSyncPolicy() && apps.app("e").readSync == ReadSyncPolicy())
        #expect(ReadSyncPolicy().enabled && ReadSyncPolicy().conversationIntervalMilliseconds == 3_000)
        #expect(ReadSyncPolicy().perMinute == 20)
        #expect(apps.app("f").readSync.conversationIntervalMilliseconds == 0 && apps.app("f").readSync.perMinute == 20)
    }

    @Test("translator: off by default; per app, or for every app under defaults (an app may turn it off)")
    func translatorSettings() throws {
        let yaml = """
            defaults:
              translator: {url: "https://translate.internal", api_key_env: HERALD_TRANSLATOR_API_KEY}
            apps:
              a: {}
              b: {translator: off}
              c:
                translator: {url: "https://lt.example/", deadline_ms: 250, cache_ttl_seconds: 60, cache_max_entries: 500}
              d: {translator: {url: "https://lt.example", cache_ttl_seconds: 0}}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings.isEmpty, "\(loaded.warnings)")
        let apps = loaded.config.apps
        #expect(
            apps.app("a").translator
                == TranslatorPolicy(
                    url: "https://translate.internal", apiKeyEnv: "HERALD_TRANSLATOR_API_KEY",
                    deadlineMilliseconds: 1_000, cacheTTLMilliseconds: 3_600_000, cacheMaxEntries: 10_000))
        #expect(apps.app("b").translator == nil)
        let c = try #require(apps.app("c").translator)
        #expect(c.endpoint == "https://lt.example/translate")
        #expect(c.deadlineMilliseconds == 250 && c.cacheTTLMilliseconds == 60_000 && c.cacheMaxEntries == 500)
        // c's own mapping is merged over the defaults' key by key: it keeps the defaults' API key variable.
        #expect(c.apiKeyEnv == "HERALD_TRANSLATOR_API_KEY")
        #expect(apps.app("d").translator?.caches == false)
        #expect(loaded.config.environmentKeys.contains("HERALD_TRANSLATOR_API_KEY"))
        #expect(try PipelineLoader.load(yaml: "apps: {a: {}}").config.apps.app("a").translator == nil)
        let plain = try PipelineLoader.load(yaml: #"apps: {a: {translator: {url: "http://127.0.0.1:5000"}}}"#)
        #expect(plain.warnings.count == 1 && plain.warnings[0].hasPrefix("apps.a.translator.url: not HTTPS"))
    }

    @Test("invalid values are errors naming the key")
    func invalidValues() {
        let rows: [(String, String)] = [
            ("apps: {a: {payload: {profile: fcm}}}", "apps.a.payload.profile"),
            ("apps: {a: {multi_device: sometimes}}", "apps.a.multi_device"),
            ("apps: {a: {badge: maybe}}", "apps.a.badge"),
            (
                "apps: {a: {credentials: [{bundle_id: x, environment: staging, p12_file: f}]}}",
                "apps.a.credentials[0].environment"
            ),
            ("apps: {a: {credentials: [{environment: sandbox}]}}", "apps.a.credentials[0].bundle_id"),
            ("apps: {a: {credentials: [{bundle_id: x}]}}", "apps.a.credentials[0]"),
            ("redis: {port: high}", "redis.port"),
            ("apps: {a: {expiration_seconds: 99999999999}}", "apps.a.expiration_seconds"),
            ("apps: {a: {call_expiration_seconds: -1}}", "apps.a.call_expiration_seconds"),
            ("apps: [1, 2]", "apps"),
            ("apps: {a: {payload: [", "(file)"),
            ("apps: {a: {coalesce: sometimes}}", "apps.a.coalesce"),
            ("apps: {a: {coalesce: {update_seconds: 3}}}", "apps.a.coalesce.window_seconds"),
            ("apps: {a: {coalesce: {window_seconds: 10, update_seconds: 11}}}", "apps.a.coalesce.update_seconds"),
            ("apps: {a: {flood_guard: {per_minute: 0}}}", "apps.a.flood_guard.per_minute"),
            ("apps: {a: {flood_guard: lots}}", "apps.a.flood_guard"),
            ("apps: {a: {read_sync: sometimes}}", "apps.a.read_sync"),
            ("apps: {a: {read_sync: {per_minute: 0}}}", "apps.a.read_sync.per_minute"),
            ("apps: {a: {read_sync: {conversation_seconds: 61}}}", "apps.a.read_sync.conversation_seconds"),
            ("apps: {a: {read_sync: {enabled: perhaps}}}", "apps.a.read_sync.enabled"),
            ("apps: {a: {translator: on}}", "apps.a.translator"),
            ("apps: {a: {translator: {deadline_ms: 500}}}", "apps.a.translator.url"),
            ("apps: {a: {translator: {url: ftp://x}}}", "apps.a.translator.url"),
            ("apps: {a: {translator: {url: \"https://x\", deadline_ms: 10}}}", "apps.a.translator.deadline_ms"),
            (
                "apps: {a: {translator: {url: \"https://x\", cache_ttl_seconds: -1}}}",
                "apps.a.translator.cache_ttl_seconds"
            ),
            (
                "apps: {a: {translator: {url: \"https://x\", cache_max_entries: 20000000}}}",
                "apps.a.translator.cache_max_entries"
            ),
            ("apps: {a: {translator: {url: \"https://x\", api_key_env: \"\"}}}", "apps.a.translator.api_key_env"),
        ]
        for (yaml, path) in rows {
            do {
                _ = try PipelineLoader.load(yaml: yaml)
                Issue.record("accepted \(yaml)")
            } catch {
                #expect(error.path == path, "\(error)")
            }
        }
    }

    @Test("app catalogs and templates override built-in strings per locale")
    func catalogOverrides() throws {
        let yaml = """
            apps:
              a:
                templates:
                  alternative: {text: "Something new", file: "A file"}
                catalogs:
                  ko: {template.alternative.text: "새 소식"}
            """
        let app = try PipelineLoader.load(yaml: yaml).config.apps.app("a")
        #expect(app.strings(for: ["ko"])[.alternativeText].source == "새 소식")
        #expect(app.strings(for: ["fr"])[.alternativeText].source == "Something new")
        #expect(app.strings(for: [])[.alternativeFile].source == "A file")
        #expect(app.strings(for: ["fr"])[.simpleBanner].source == "Vous avez un nouveau message")
    }

    @Test("an empty file gives the documented defaults")
    func defaults() throws {
        for yaml in ["", "# nothing but a comment\n", "{}"] {
            let loaded = try PipelineLoader.load(yaml: yaml)
            #expect(loaded.warnings == [], "\(yaml.debugDescription)")
            let c = loaded.config
            #expect(
                c.kafka.brokers == "127.0.0.1:9092" && c.kafka.clientID == "herald"
                    && c.kafka.sessionTimeoutMs == 10_000)
            #expect(c.kafka.properties.isEmpty)
            let t = c.kafka.topics
            #expect(
                [
                    t.chatEvents, t.ingested, t.resolved, t.deliverable, t.outbound, t.retry, t.dlq, t.tokenFeedback,
                    t.registry,
                ]
                    == [
                        "chat.events", "herald.ingested", "herald.resolved", "herald.deliverable", "herald.outbound",
                        "herald.retry", "herald.dlq", "herald.token-feedback", "herald.registry",
                    ])
            #expect(c.redis.host == "127.0.0.1" && c.redis.port == 6379 && c.redis.database == 0)
            #expect(c.redis.keyPrefix == "herald" && c.redis.pipelineBatch == 64)
            #expect(c.redis.presenceTTLSeconds == 120 && c.redis.idempotencyTTLSeconds == 86_400)
            for (index, stage) in StageName.allCases.enumerated() {
                let s = c.stages[stage]
                #expect(s.groupID == "herald-\(stage.rawValue)" && s.metricsPort == 9101 + index)
                #expect(s.batchSize == 500 && s.batchTimeoutMs == 50)
            }
            // Any app gets the defaults: compact payload, send only when all devices are offline, badge on.
            let app = c.apps.app("never-configured")
            #expect(app.payloadProfile == .compact && app.multiDevice == .allOffline && app.badge)
            #expect(app.credentials.isEmpty)
        }
    }

    @Test("the defaults section is the base of every listed app; an app the file does not list is unknown")
    func defaultsSection() throws {
        let yaml = """
            defaults:
              payload: {profile: cometchat}
              badge: false
              apns: {sound: chime.caf, mutable_content: true}
              bogus: 1
            apps:
              named: {multi_device: any_offline, apns: {sound: bell.caf}}
              overrides: {payload: {profile: compact}, badge: true}
              bare:
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        let c = loaded.config
        // Keys an app leaves out come from defaults; nested mappings merge key by key.
        #expect(c.apps.app("named").payloadProfile == .cometchat)
        #expect(c.apps.app("named").multiDevice == .anyOffline)
        #expect(c.apps.app("named").badge == false)
        #expect(c.apps.app("named").payloadOptions.sound == "bell.caf")
        #expect(c.apps.app("named").payloadOptions.mutableContent)
        #expect(c.apps.app("overrides").payloadProfile == .compact && c.apps.app("overrides").badge)
        // A listed app with nothing under it is known and takes every default.
        #expect(c.apps.isKnown("bare") && c.apps.app("bare").payloadProfile == .cometchat)
        // An app id the file does not list is unknown (its records are dead-lettered `unknown_app`).
        #expect(c.apps.isKnown("named") && !c.apps.isKnown("other"))
        // A wrong key in defaults is reported once, under defaults, not again for every app.
        #expect(loaded.warnings.filter { $0.contains("bogus") }.count == 1)
        #expect(loaded.warnings.first { $0.contains("bogus") }?.hasPrefix("defaults.bogus") == true)
    }

    @Test("stage, Kafka and Redis settings are read; a stage left out keeps its defaults")
    func sections() throws {
        let yaml = """
            kafka:
              brokers: k1:9092,k2:9092
              client_id: chat-push
              session_timeout_ms: 4000
              topics: {chat_events: prod.chat, dlq: prod.dlq}
              properties: {compression.type: lz4}
            redis: {host: redis.internal, port: 6380, database: 2, key_prefix: hx, pipeline_batch: 128,
                    presence_ttl_seconds: 30, idempotency_ttl_seconds: 3600}
            stages:
              send: {group_id: push-send, batch_size: 64, batch_timeout_ms: 5, metrics_port: 9200}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings == [])
        let c = loaded.config
        #expect(
            c.kafka.brokers == "k1:9092,k2:9092" && c.kafka.clientID == "chat-push" && c.kafka.sessionTimeoutMs == 4000)
        #expect(c.kafka.topics.chatEvents == "prod.chat" && c.kafka.topics.dlq == "prod.dlq")
        #expect(c.kafka.topics.ingested == "herald.ingested")
        #expect(c.kafka.properties == ["compression.type": "lz4"])
        #expect(c.redis.host == "redis.internal" && c.redis.port == 6380 && c.redis.database == 2)
        #expect(c.redis.keyPrefix == "hx" && c.redis.pipelineBatch == 128)
        #expect(c.redis.presenceTTLSeconds == 30 && c.redis.idempotencyTTLSeconds == 3600)
        let send = c.stages[.send]
        #expect(
            send.groupID == "push-send" && send.batchSize == 64 && send.batchTimeoutMs == 5 && send.metricsPort == 9200)
        #expect(c.stages[.render].groupID == "herald-render" && c.stages[.render].batchSize == 500)
    }

    @Test(
        "explain.full_trail, the shard counts, explain.write_interval_ms and idempotency.replay_window_seconds: read, defaulted, and checked"
    )
    func footprintSections() throws {
        let defaults = try PipelineLoader.load(yaml: "apps: {app1: {}}").config
        #expect(defaults.explain.fullTrail.isEmpty)
        #expect(defaults.idempotency.replayWindowSeconds == 3600)
        #expect(defaults.idempotency.shards == 1024 && defaults.explain.lastDecisionShards == 1024)
        let yaml = """
            explain:
              full_trail: {users: [u1, u2], apps: [app3], sample: 0.25}
              last_decision_shards: 100000
              log_shards: 4096
              write_interval_ms: 250
            idempotency:
              replay_window_seconds: 7200
              shards: 65536
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings == [])
        #expect(loaded.config.explain.fullTrail == FullTrailPolicy(users: ["u1", "u2"], apps: ["app3"], sample: 0.25))
        #expect(loaded.config.idempotency.replayWindowSeconds == 7200)
        #expect(loaded.config.idempotency.shards == 65536 && loaded.config.explain.lastDecisionShards == 100_000)
        #expect(loaded.config.explain.logShards == 4096 && defaults.explain.logShards == 256)
        #expect(loaded.config.explain.writeIntervalMs == 250 && defaults.explain.writeIntervalMs == 1000)
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "explain: {write_interval_ms: -1}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "explain: {write_interval_ms: 60001}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "idempotency: {shards: 0}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "explain: {last_decision_shards: 0}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "explain: {full_trail: {sample: 2}}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "idempotency: {replay_window_seconds: 5}") }
        let typo = try PipelineLoader.load(yaml: "explain: {full_trail: {user: [u1]}}")
        #expect(typo.warnings.count == 1 && typo.warnings[0].hasPrefix("explain.full_trail.user: unknown key"))
    }

    @Test("each lane's fetch wait and linger are read; left out they keep the defaults; a bad value is an error")
    func laneFlow() throws {
        let loaded = try PipelineLoader.load(
            yaml: """
                kafka:
                  flow: {fetch_wait_ms: 100, linger_ms: 5}
                  priority_flow: {fetch_wait_ms: 2}
                """)
        #expect(loaded.warnings == [])
        #expect(loaded.config.kafka.bulkFlow == LaneFlow(fetchWaitMs: 100, lingerMs: 5))
        #expect(loaded.config.kafka.priorityFlow == LaneFlow(fetchWaitMs: 2, lingerMs: 0))
        #expect(loaded.config.kafka.profileOverrides.count == 3)
        let defaults = try PipelineLoader.load(yaml: "kafka: {brokers: k:9092}").config.kafka
        #expect(defaults.bulkFlow == LaneFlow(fetchWaitMs: 500, lingerMs: 5))
        #expect(defaults.priorityFlow == LaneFlow(fetchWaitMs: 500, lingerMs: 0))
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {flow: {fetch_wait_ms: -1}}") }
        let odd = try PipelineLoader.load(yaml: "kafka: {flow: {idle_ms: 3}}")
        #expect(odd.warnings.contains { $0.hasPrefix("kafka.flow.idle_ms") })
    }

    @Test("kafka.pack sets how records between the stages are packed; max_records 1 turns it off")
    func packSettings() throws {
        let loaded = try PipelineLoader.load(yaml: "kafka: {pack: {max_records: 1, max_bytes: 2048}}")
        #expect(loaded.warnings == [])
        #expect(loaded.config.kafka.packMaxRecords == 1)
        #expect(loaded.config.kafka.packMaxBytes == 2048)
        let defaults = try PipelineLoader.load(yaml: "kafka: {brokers: k:9092}").config.kafka
        #expect(defaults.packMaxRecords == 256 && defaults.packMaxBytes == 65_536)
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {pack: {max_records: 0}}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {pack: {max_bytes: 100}}") }
        let odd = try PipelineLoader.load(yaml: "kafka: {pack: {records: 3}}")
        #expect(odd.warnings.contains { $0.hasPrefix("kafka.pack.records") })
        // The packed topics are the ten between the stages, never the ones other systems read or write.
        let topics = TopicNames()
        #expect(topics.interStage.count == 10)
        #expect(
            Set(topics.interStage).isDisjoint(with: [
                topics.chatEvents, topics.dlq, topics.tokenFeedback, topics.registry,
            ]))
    }

    @Test("kafka.bulk_nice sets the bulk lane threads' nice value, 0 to 19, default 10")
    func bulkNice() throws {
        #expect(try PipelineLoader.load(yaml: "kafka: {brokers: k:9092}").config.kafka.bulkNice == 10)
        #expect(try PipelineLoader.load(yaml: "kafka: {bulk_nice: 0}").config.kafka.bulkNice == 0)
        #expect(try PipelineLoader.load(yaml: "kafka: {bulk_nice: 19}").config.kafka.bulkNice == 19)
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {bulk_nice: 20}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {bulk_nice: -1}") }
    }

    @Test("unknown keys in every section are warned about with their path and the known keys")
    func unknownKeysEverywhere() throws {
        let yaml = """
            kafka: {topics: {chat_event: x}}
            redis: {hots: h}
            stages: {sender: {group_id: g}, send: {batchsize: 3}}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        let paths = Set(loaded.warnings.map { String($0.prefix { $0 != ":" }) })
        #expect(paths == ["kafka.topics.chat_event", "redis.hots", "stages.sender", "stages.send.batchsize"])
        // A warning names the keys that would have been understood.
        let redis = try #require(loaded.warnings.first { $0.hasPrefix("redis.hots") })
        #expect(redis.contains("unknown key") && redis.contains("host"))
        // The rest of the file still applies.
        #expect(loaded.config.stages[.send].batchSize == 500)
    }

    @Test("a file that cannot be read is an error naming the file")
    func unreadableFile() {
        let path = NSTemporaryDirectory() + "herald-no-such-pipeline-\(UUID().uuidString).yaml"
        do {
            _ = try PipelineLoader.load(path: path)
            Issue.record("loaded a missing file")
        } catch {
            #expect(error.path == path)
        }
    }
}

@Suite("Security settings pass through")
struct SecuritySettingsTests {
    @Test("Kafka SASL and TLS settings in the pipeline file reach librdkafka unchanged")
    func kafkaSecurity() throws {
        let yaml = """
            kafka:
              brokers: broker.internal:9093
              properties:
                security.protocol: SASL_SSL
                sasl.mechanisms: SCRAM-SHA-512
                sasl.username: herald
                sasl.password: s3cret
                ssl.ca.location: /etc/herald/kafka/ca.pem
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        // Still passed through, with a warning: the password belongs in properties_env / properties_file.
        #expect(
            loaded.warnings == [
                "kafka.properties.sasl.password: a secret in the pipeline file; prefer properties_env or properties_file"
            ])
        let properties = loaded.config.kafka.properties
        #expect(properties["security.protocol"] == "SASL_SSL" && properties["sasl.mechanisms"] == "SCRAM-SHA-512")
        #expect(properties["sasl.username"] == "herald" && properties["sasl.password"] == "s3cret")
        #expect(properties["ssl.ca.location"] == "/etc/herald/kafka/ca.pem")
    }

    @Test("collapse_id: message is read; another value is an error naming the key")
    func collapseID() throws {
        let ok = try PipelineLoader.load(yaml: "apps:\n  a1: {collapse_id: message}\n")
        #expect(ok.config.apps.app("a1").collapseID == .message)
        #expect(ok.config.apps.app("other").collapseID == CollapseIDSource.none)
        do {
            _ = try PipelineLoader.load(yaml: "apps:\n  a1: {collapse_id: event}\n")
            Issue.record("accepted collapse_id: event")
        } catch {
            #expect("\(error)".contains("apps.a1.collapse_id"), "\(error)")
        }
    }
}

@Suite("Pipeline file: vendor payload options")
struct VendorPayloadOptionsConfigTests {
    @Test("apns, sendbird, cometchat and user_defaults keys are read")
    func read() throws {
        let yaml = """
            apps:
              sb:
                payload: {profile: sendbird}
                apns: {alert_string: true, content_available: true, mutable_content: true, sound: chime.caf,
                       conversation_sounds: {c1: bell.caf}}
                sendbird: {type_codes: v3, group_channel_type: chat, channel_unread_count: false, push_title: true,
                           push_alert: true, audience_type: only, mentioned_users: true}
              cc:
                payload: {profile: cometchat}
                cometchat: {include_message: true, custom: '{"tenant":"acme"}'}
              em:
                user_defaults: {preset: easemob, template: alternative, trigger: mention_only}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings.isEmpty, "\(loaded.warnings)")
        let o = loaded.config.apps.app("sb").payloadOptions
        #expect(o.alertString && o.contentAvailable && o.mutableContent && o.sound == "chime.caf")
        #expect(o.conversationSounds == ["c1": "bell.caf"])
        #expect(o.sendbirdV3TypeCodes && o.sendbirdGroupChannelType == "chat" && !o.sendbirdChannelUnreadCount)
        #expect(
            o.sendbirdPushTitle && o.sendbirdPushAlert && o.sendbirdAudienceType == "only" && o.sendbirdMentionedUsers)
        let c = loaded.config.apps.app("cc").payloadOptions
        #expect(c.cometchatIncludeMessage && c.cometchatCustom?["tenant"] == .string("acme"))
        let d = try #require(loaded.config.apps.app("em").userDefaults)
        #expect(d.displayStyle == .simpleBanner && d.template == .alternative && d.trigger == .mentionOnly)
        #expect(loaded.config.apps.app("sb").userDefaults == nil)
    }

    @Test(
        "wrong values name their path",
        arguments: [
            ("apps: {a: {payload: {profile: sendbird}, sendbird: {type_codes: v2}}}", "apps.a.sendbird.type_codes"),
            (
                "apps: {a: {payload: {profile: sendbird}, sendbird: {group_channel_type: open}}}",
                "apps.a.sendbird.group_channel_type"
            ),
            ("apps: {a: {payload: {profile: cometchat}, cometchat: {custom: '[1]'}}}", "apps.a.cometchat.custom"),
            ("apps: {a: {user_defaults: {preset: sendbird}}}", "apps.a.user_defaults.preset"),
            ("apps: {a: {user_defaults: {trigger: sometimes}}}", "apps.a.user_defaults.trigger"),
            ("apps: {a: {apns: {content_available: maybe}}}", "apps.a.apns.content_available"),
        ])
    func errors(_ yaml: String, _ path: String) {
        do {
            _ = try PipelineLoader.load(yaml: yaml)
            Issue.record("\(yaml) loaded without an error")
        } catch { #expect(error.path == path) }
    }

    @Test("a webhook's every_recipient and a credential's content_available / mutable_content are read")
    func migrationKeys() throws {
        let yaml = """
            apps:
              cc:
                payload: {profile: cometchat}
                apns: {content_available: true}
                credentials:
                  - {bundle_id: com.a, team_id: T, key_id: K, key_file: k.p8, provider_id: a,
                     content_available: false, mutable_content: true}
                  - {bundle_id: com.b, team_id: T, key_id: K, key_file: k.p8, provider_id: b}
                webhooks:
                  - {provider_id: all, url: "https://h.example/all", every_recipient: true}
                  - {provider_id: some, url: "https://h.example/some"}
            """
        let loaded = try PipelineLoader.load(yaml: yaml)
        #expect(loaded.warnings.isEmpty, "\(loaded.warnings)")
        let app = loaded.config.apps.app("cc")
        #expect(app.credentials.map(\.contentAvailable) == [false, nil])
        #expect(app.credentials.map(\.mutableContent) == [true, nil])
        #expect(app.webhooks.map(\.everyRecipient) == [true, false])
        let a = Device(token: "aa", providerID: "a"), b = Device(token: "bb", providerID: "b")
        #expect(app.apsFlags(a) == APSFlags(contentAvailable: false, mutableContent: true))
        #expect(app.apsFlags(b) == APSFlags(contentAvailable: true, mutableContent: false))
        // Without a provider id: the credential of the device's bundle id, else of the app's first bundle id.
        #expect(app.apsFlags(Device(token: "cc")) == APSFlags(contentAvailable: false, mutableContent: true))
        #expect(
            app.apsFlags(Device(token: "dd", bundleID: "com.b"))
                == APSFlags(contentAvailable: true, mutableContent: false))
        #expect(
            app.apsFlags(Device(token: "ee", bundleID: "com.other"))
                == APSFlags(contentAvailable: true, mutableContent: false))
        #expect(throws: ConfigError.self) {
            try PipelineLoader.load(
                yaml: "apps:\n  x:\n    webhooks: [{provider_id: h, url: \"https://h/x\", every_recipient: maybe}]\n")
        }
    }

    @Test("a vendor block under another profile is warned about")
    func wrongProfile() throws {
        let loaded = try PipelineLoader.load(
            yaml: "apps: {a: {payload: {profile: compact}, sendbird: {push_title: true}}}")
        #expect(loaded.warnings.contains { $0.hasPrefix("apps.a.sendbird") })
    }

    @Test("a YAML syntax error names the position, never the file's lines (they may hold a secret)")
    func yamlErrorQuotesNothing() {
        let yaml = "apps:\n  a:\n    webhooks: [{url: https://h/x, password: \"hunter2-secret\"\n"
        do {
            _ = try PipelineLoader.load(yaml: yaml)
            Issue.record("broken YAML was accepted")
        } catch {
            let message = "\(error)"
            #expect(message.contains("not valid YAML"))
            #expect(message.contains("line"), "\(message)")
            #expect(!message.contains("hunter2-secret"), "\(message)")
        }
    }
}
