// The crash-loop breaker (docs/pipeline.md, "Crash-loop breaker") against a real trap: a debug build of herald-ingest
// with HERALD_TEST_CRASH_MARKER traps on a record carrying the marker. The test restarts the stage each time it dies,
// as a supervisor would, on herald-dev-broker and redis-server.
import Foundation
import HeraldCore
import HeraldKafka
import HeraldTestSupport
import Logging
import Testing

@Suite("Crash-loop breaker", .serialized)
struct CrashBreakerTests {
    static let marker = "TRAP-ON-THIS-7f3a"

    static func event(_ id: String, text: String, createdAt: Int64) -> String {
        Scenarios.message(id, conversation: "breaker-conv", text: text, createdAt: createdAt)
    }

    #if DEBUG
    @Test("a record that traps the stage twice is dead-lettered `crashed`; the records around it are processed")
    func deadLettersTheRecordThatTraps() async throws {
        let broker = try await DevBroker.start(
            brokers: 1,
            topics: [
                ("chat.events", 1), ("herald.ingested", 1), ("herald.ingested.priority", 1), ("herald.dlq", 1),
            ],
            extraArguments: ["--group", "breaker-ingest"])
        defer { broker.stop() }
        let redis = try await RedisServer.start()
        defer { redis.kill() }
        let dir = try temporaryDirectory("herald-breaker")
        let pipeline = dir + "/pipeline.yaml"
        try """
        apps:
          app1:
            payload: {profile: compact}
        kafka:
          brokers: \(broker.bootstrap)
          client_id: herald-breaker-test
          session_timeout_ms: 4000
          profile: local
          pack: {max_records: 1}
        redis:
          host: 127.0.0.1
          port: \(redis.port)
        stages:
          ingest: {group_id: breaker-ingest, batch_size: 200, batch_timeout_ms: 20}

        """.write(toFile: pipeline, atomically: true, encoding: .utf8)

        // Three events in one partition, the middle one marked; all there before the stage starts, so the first
        // batch holds the three.
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let ids = ["before-1", "marked-2", "after-3"]
        let events = [
            Self.event(ids[0], text: "hello", createdAt: now),
            Self.event(ids[1], text: "boom \(Self.marker)", createdAt: now),
            Self.event(ids[2], text: "bye", createdAt: now),
        ]
        var logger = Logger(label: "breaker-test")
        logger.logLevel = .critical
        let client = KafkaClientConfiguration(brokers: [broker.bootstrap], clientID: "breaker-test")
        var producerConfiguration = KafkaProducerConfiguration(brokers: [broker.bootstrap], clientID: "breaker-test")
        producerConfiguration.linger = .milliseconds(1)
        let producer = try KafkaProducer(configuration: producerConfiguration, logger: logger)
        try await producer.sendAll(
            events.map { ProducerRecord(topic: "chat.events", key: Array("breaker-conv".utf8), value: Array($0.utf8)) })
        try await producer.shutdown(timeout: .seconds(5))
        let sent = try await KafkaTopicReader.readAll(topic: "chat.events", configuration: client, logger: logger)
        let markedRecord = try #require(sent.first { String(decoding: $0.value ?? [], as: UTF8.self).contains(ids[1]) })

        let metricsPort = try freePort()
        let stage = ChildProcess(
            name: "herald-ingest", executable: Paths.binDirectory + "/herald-ingest", arguments: [],
            environment: [
                "HERALD_PIPELINE": pipeline, "HERALD_KAFKA_SESSION_TIMEOUT_MS": "4000",
                "HERALD_METRICS_HOST": "127.0.0.1", "HERALD_METRICS_PORT": "\(metricsPort)",
                "HERALD_PRIORITY_LANES": "off", "HERALD_LOG_LEVEL": "info", "HERALD_INSTANCE": "breaker-ingest",
                "HERALD_TEST_CRASH_MARKER": Self.marker,
            ], logPath: dir + "/ingest.log")
        try stage.start()
        defer { stage.killNow() }

        // Supervise: restart the stage each time it dies, until the marked record is in the DLQ. The breaker must
        // have it there after the second crash; a third crash means it did not.
        var crashes = 0
        func crashedLetters() async throws -> [(record: ConsumerRecord, dlq: DLQRecord)] {
            try await KafkaTopicReader.readAll(
                topic: "herald.dlq", configuration: client, timeout: .seconds(2), logger: logger
            )
            .compactMap { r in
                guard let v = r.value, let d = try? StageCodec.decode(DLQRecord.self, from: v), d.reason == "crashed"
                else { return nil }
                return (r, d)
            }
        }
        var letters: [(record: ConsumerRecord, dlq: DLQRecord)] = []
        while letters.isEmpty {
            try await waitUntil("herald-ingest exits or dead-letters the marked record", timeout: .seconds(120)) {
                if !stage.isRunning { return true }
                letters = try await crashedLetters()
                return !letters.isEmpty
            }
            if letters.isEmpty {
                crashes += 1
                #expect(crashes <= 2, "the stage crashed a third time on the same record: \(stage.logTail(8))")
                if crashes > 2 { return }
                try stage.start()
            }
        }
        #expect(crashes == 2)
        #expect(letters.count == 1)
        let letter = try #require(letters.first?.dlq)
        #expect(letter.stage == "ingest")
        #expect(letter.sourceTopic == "chat.events")
        #expect(letter.sourcePartition == markedRecord.partition)
        #expect(letter.sourceOffset == markedRecord.offset)
        // The original bytes (base64 in the DLQ record) are the marked event's.
        let original = Data(base64Encoded: letter.original).map { String(decoding: $0, as: UTF8.self) } ?? ""
        #expect(original.contains(ids[1]))

        // The records before and after it were processed (ingest's outputs carry the event ids).
        try await waitUntil("the events around the marked one reach herald.ingested") {
            let outputs = try await KafkaTopicReader.readAll(
                topic: "herald.ingested", configuration: client, timeout: .seconds(2), logger: logger
            ).map { String(decoding: $0.value ?? [], as: UTF8.self) }
            return outputs.contains { $0.contains(ids[0]) } && outputs.contains { $0.contains(ids[2]) }
        }
        #expect(stage.isRunning)
        try await waitUntil("the breaker's counters on /metrics") {
            guard let body = httpBody(port: metricsPort, path: "/metrics") else { return false }
            return body.contains("herald_crash_breaker_total{stage=\"ingest\",action=\"dead_letter\"} 1")
                && body.range(
                    of: #"herald_crash_breaker_total\{stage="ingest",action="rerun_batch"\} [1-9]"#,
                    options: .regularExpression) != nil
        }
        #expect(await stage.stop(grace: .seconds(10)) == 0)
    }
    #endif
}
