import Foundation
import HeraldConfig
import Testing

@Suite("Kafka broker profiles and secrets in the pipeline file")
struct KafkaProfileTests {
    @Test(
        "without kafka.profile the production profile applies: long fetch waits, bulk producers linger, no idle backoff"
    )
    func productionIsTheDefault() throws {
        let k = try PipelineLoader.load(yaml: "kafka: {brokers: k:9092}").config.kafka
        #expect(k.profile == .production)
        #expect(k.bulkFlow == LaneFlow(fetchWaitMs: 500, lingerMs: 5))
        #expect(k.priorityFlow == LaneFlow(fetchWaitMs: 500, lingerMs: 0))
        #expect(k.idleBackoff == nil)
        #expect(k.profileOverrides == [])
        #expect(PipelineConfig().kafka.profile == .production)
    }

    @Test("kafka.profile local selects the local broker's tuning: short waits, the idle backoff with its doorbell")
    func localProfile() throws {
        let loaded = try PipelineLoader.load(yaml: "kafka: {profile: local}")
        #expect(loaded.warnings == [])
        let k = loaded.config.kafka
        #expect(k.profile == .local)
        #expect(k.bulkFlow == LaneFlow(fetchWaitMs: 50, lingerMs: 1))
        #expect(k.priorityFlow == LaneFlow(fetchWaitMs: 10, lingerMs: 0))
        #expect(k.idleBackoff == IdleBackoff(afterMs: 5_000, probeIntervalMs: 250, doorbellProbeIntervalMs: 2_000))
        #expect(k.idleBackoff?.doorbell == true)
        #expect(k.profileOverrides == [])
    }

    @Test("kafka.rebalance: cooperative by default, eager when asked, anything else refused")
    func rebalance() throws {
        #expect(try PipelineLoader.load(yaml: "kafka: {brokers: k:9092}").config.kafka.rebalance == "cooperative")
        #expect(try PipelineLoader.load(yaml: "kafka: {rebalance: eager}").config.kafka.rebalance == "eager")
        #expect {
            try PipelineLoader.load(yaml: "kafka: {rebalance: sticky}")
        } throws: { error in
            (error as? ConfigError)?.path == "kafka.rebalance" && "\(error)".contains("cooperative or eager")
        }
    }

    @Test("an unknown profile is refused with a message naming the choices")
    func unknownProfile() throws {
        #expect {
            try PipelineLoader.load(yaml: "kafka: {profile: tansu}")
        } throws: { error in
            guard let e = error as? ConfigError else { return false }
            return e.path == "kafka.profile" && e.message.contains("tansu") && e.message.contains("production")
                && e.message.contains("local")
        }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {profile: [local]}") }
        #expect(throws: ConfigError.self) { try KafkaProfile.named("Local ") }
        #expect(try KafkaProfile.named("local") == .local)
    }

    @Test(
        "a profile key set by hand wins over the profile and is named in an override line; the rest stays the profile's"
    )
    func overridesAreAllowedAndNamed() throws {
        let loaded = try PipelineLoader.load(
            yaml: """
                kafka:
                  profile: local
                  flow: {fetch_wait_ms: 100}
                  priority_flow: {linger_ms: 2}
                  idle: {after_ms: 3000}
                  properties: {fetch.wait.max.ms: "40", compression.type: lz4}
                """)
        #expect(loaded.warnings == [])
        let k = loaded.config.kafka
        #expect(k.bulkFlow == LaneFlow(fetchWaitMs: 100, lingerMs: 1))
        #expect(k.priorityFlow == LaneFlow(fetchWaitMs: 10, lingerMs: 2))
        #expect(k.idleBackoff == IdleBackoff(afterMs: 3_000, probeIntervalMs: 250, doorbellProbeIntervalMs: 2_000))
        #expect(
            k.profileOverrides == [
                "kafka.flow.fetch_wait_ms: 100 set by hand (profile local: 50)",
                "kafka.priority_flow.linger_ms: 2 set by hand (profile local: 0)",
                "kafka.idle.after_ms: 3000 set by hand (profile local: 5000)",
                "kafka.properties.fetch.wait.max.ms set by hand: it replaces the profile's per-lane value in every "
                    + "consumer and producer",
            ])
        // The same keys over the production profile name production's values; the profile itself can change later
        // (HERALD_KAFKA_PROFILE) and the hand-set keys still win.
        var production = k
        production.profile = .production
        #expect(production.bulkFlow == LaneFlow(fetchWaitMs: 100, lingerMs: 5))
        #expect(
            production.profileOverrides.first == "kafka.flow.fetch_wait_ms: 100 set by hand (profile production: 500)")
        #expect(
            production.idleBackoff
                == IdleBackoff(afterMs: 3_000, probeIntervalMs: IdleBackoff.defaultProbeIntervalMs),
            "a hand-set idle backoff applies under any profile (without a doorbell unless set)")
        var probeOnly = try PipelineLoader.load(yaml: "kafka: {idle: {probe_interval_ms: 250}}").config.kafka
        #expect(probeOnly.idleBackoff == nil, "a probe interval alone does not start an idle backoff")
        probeOnly.profile = .local
        #expect(probeOnly.profileOverrides == ["kafka.idle.probe_interval_ms: 250 set by hand (profile local: 250)"])
    }

    @Test("idle after_ms turns the backoff on and 0 keeps it off; bad values are errors")
    func idleKeys() throws {
        let on = try PipelineLoader.load(yaml: "kafka: {idle: {after_ms: 5000}}").config.kafka
        #expect(on.idleBackoff == IdleBackoff(afterMs: 5_000, probeIntervalMs: 1_000))
        #expect(on.profileOverrides == ["kafka.idle.after_ms: 5000 set by hand (profile production: off)"])
        let local = try PipelineLoader.load(
            yaml: "kafka: {profile: local, idle: {after_ms: 2000, probe_interval_ms: 500}}")
        #expect(
            local.config.kafka.idleBackoff
                == IdleBackoff(afterMs: 2_000, probeIntervalMs: 500, doorbellProbeIntervalMs: 2_000))
        // The doorbell: on by hand under production; doorbell_probe_interval_ms 0 turns it off under local.
        let rung = try PipelineLoader.load(
            yaml: "kafka: {idle: {after_ms: 1000, doorbell_probe_interval_ms: 5000}}"
        ).config.kafka
        #expect(rung.idleBackoff?.doorbell == true)
        #expect(rung.idleBackoff?.doorbellProbeIntervalMs == 5_000)
        #expect(
            rung.profileOverrides.contains(
                "kafka.idle.doorbell_probe_interval_ms: 5000 set by hand (profile production: off)"))
        let quiet = try PipelineLoader.load(
            yaml: "kafka: {profile: local, idle: {doorbell_probe_interval_ms: 0}}"
        ).config.kafka
        #expect(quiet.idleBackoff == IdleBackoff(afterMs: 5_000, probeIntervalMs: 250))
        #expect(quiet.idleBackoff?.doorbell == false)
        #expect(throws: ConfigError.self) {
            try PipelineLoader.load(yaml: "kafka: {idle: {doorbell_probe_interval_ms: -1}}")
        }
        let off = try PipelineLoader.load(yaml: "kafka: {profile: local, idle: {after_ms: 0}}").config.kafka
        #expect(off.idleBackoff == nil)
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {idle: {probe_interval_ms: 1}}") }
        #expect(throws: ConfigError.self) { try PipelineLoader.load(yaml: "kafka: {idle: {after_ms: -5}}") }
        let odd = try PipelineLoader.load(yaml: "kafka: {idle: {after: 3}}")
        #expect(odd.warnings.contains { $0.hasPrefix("kafka.idle.after") })
    }

    @Test("properties_env and properties_file supply secret properties; errors name the key, never a value")
    func secretProperties() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-kafka-secrets-\(getpid())")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("sasl-password").path
        try "s3cret-from-file\n".write(toFile: file, atomically: true, encoding: .utf8)
        let loaded = try PipelineLoader.load(
            yaml: """
                kafka:
                  properties: {security.protocol: SASL_SSL, sasl.mechanisms: PLAIN, sasl.username: herald}
                  properties_file: {sasl.password: \(file)}
                  properties_env: {ssl.key.password: HERALD_TEST_KAFKA_KEY_PASSWORD}
                """)
        #expect(loaded.warnings == [])
        let k = loaded.config.kafka
        #expect(k.properties["sasl.password"] == nil, "nothing secret is read while loading")
        let resolved = try k.resolvedProperties(environment: ["HERALD_TEST_KAFKA_KEY_PASSWORD": "key-pass"])
        #expect(resolved["sasl.password"] == "s3cret-from-file")
        #expect(resolved["ssl.key.password"] == "key-pass")
        #expect(resolved["sasl.username"] == "herald")

        #expect {
            try k.resolvedProperties(environment: [:])
        } throws: { error in
            "\(error)"
                == "kafka.properties_env.ssl.key.password: environment variable HERALD_TEST_KAFKA_KEY_PASSWORD is not set"
        }
        try FileManager.default.removeItem(atPath: file)
        #expect {
            try k.resolvedProperties(environment: ["HERALD_TEST_KAFKA_KEY_PASSWORD": "key-pass"])
        } throws: { error in
            let text = "\(error)"
            return text.hasPrefix("kafka.properties_file.sasl.password: cannot read \(file)")
                && !text.contains("key-pass")
        }
    }

    @Test("a secret written inline draws a warning; a property set twice is refused")
    func inlineSecretsAndDuplicates() throws {
        let inline = try PipelineLoader.load(yaml: "kafka: {properties: {sasl.password: hunter2}}")
        #expect(
            inline.warnings.contains { $0.hasPrefix("kafka.properties.sasl.password: a secret in the pipeline file") })
        #expect(!inline.warnings.contains { $0.contains("hunter2") })
        #expect(throws: ConfigError.self) {
            try PipelineLoader.load(
                yaml: "kafka: {properties: {sasl.password: x}, properties_env: {sasl.password: HERALD_X}}")
        }
        #expect(throws: ConfigError.self) {
            try PipelineLoader.load(
                yaml: "kafka: {properties_env: {sasl.password: HERALD_X}, properties_file: {sasl.password: /x}}")
        }
        #expect(throws: ConfigError.self) {
            try PipelineLoader.load(yaml: "kafka: {properties_env: {sasl.password: \"\"}}")
        }
    }
}
