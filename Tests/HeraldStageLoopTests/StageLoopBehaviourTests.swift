import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldStage
import HeraldTestSupport
import Logging
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

// More of the batch loop's promises, through its public API against a real Tansu: outputs the broker does not
// acknowledge are produced again; the consumer stops pulling at the in-flight bound and goes on when work
// completes; a processor that answers with the wrong number of results loses nothing.

/// Log messages at warning and above, for the loop's "producing again" notices.
final class Warnings: Sendable {
    private let messages = Mutex<[String]>([])
    var all: [String] { messages.withLock { $0 } }

    var logger: Logger {
        Logger(label: "test") { _ in WarningHandler(sink: self) }
    }

    fileprivate func append(_ message: String) { messages.withLock { $0.append(message) } }
}

private struct WarningHandler: LogHandler {
    let sink: Warnings
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .warning
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) { sink.append("\(event.message) \(event.metadata ?? [:])") }
}

/// Echoes every input to `out` once `gate` is open, counting the inputs it was handed.
struct GatedEcho: StageProcessor {
    let stage = "echo"
    let gate: Gate
    let seen: Seen
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        seen.add(batch.map { String(decoding: $0.value ?? [], as: UTF8.self) })
        await gate.wait()
        return batch.map { input in
            let text = String(decoding: input.value ?? [], as: UTF8.self)
            return StageResult(outputs: [StageOutput(topic: "out", key: text, value: Array(text.uppercased().utf8))])
        }
    }
}

@Suite("Stage loop: retries, backpressure, broken processors", .serialized)
struct StageLoopBehaviourTests {
    @Test("outputs the broker did not acknowledge are produced again until it does; nothing is lost")
    func produceRetry() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        let values = (0..<12).map { "ok-\($0)" }
        try await produce(values, topic: "in", brokers: broker.brokers)

        let gate = Gate()
        let seen = Seen()
        let warnings = Warnings()
        // Deliveries time out after 1 s while the broker is frozen; the group's session outlives the freeze.
        // Without idempotence: after a delivery timeout librdkafka's idempotent producer bumps its epoch, and
        // Tansu answers that with PRODUCER_FENCED for good, which would test Tansu rather than the loop.
        let (loop, consumer) = try makeLoop(
            broker, group: "retry-1", processor: GatedEcho(gate: gate, seen: seen),
            sessionTimeout: .seconds(10), deliveryTimeout: .seconds(1),
            producerProperties: ["enable.idempotence": "false"], logger: warnings.logger)
        let running = Task { try await loop.run() }
        try await waitUntil("the processor got a batch", timeout: .seconds(120)) { !seen.values.isEmpty }

        // Freeze the broker (SIGSTOP: connections stay open, nothing is answered), then let the batch's outputs go.
        let pid = try #require(broker.process.pid)
        kill(pid, SIGSTOP)
        var thawed = false
        defer { if !thawed { kill(pid, SIGCONT) } }
        gate.open()
        // librdkafka reports the failed deliveries 8-10 s after the freeze on an idle machine (its timeout scans and
        // connection state), and later when the machine is busy with parallel tests: the bound is generous.
        try await waitUntil("the loop noticed the unacknowledged outputs", timeout: .seconds(60)) {
            warnings.all.contains { $0.contains("producing again") || $0.contains("produce failed") }
        }
        kill(pid, SIGCONT)
        thawed = true

        // Outputs produced again may land twice (the broker may have written the first copy before it froze):
        // read until every value is there, however many copies.
        let expected = Set(values.map { $0.uppercased() })
        let records = try await collect(topics: ["out"], brokers: broker.brokers) { records in
            Set(records.map { String(decoding: $0.value ?? [], as: UTF8.self) }).isSuperset(of: expected)
        }
        let outputs = records.map { String(decoding: $0.value ?? [], as: UTF8.self) }
        #expect(Set(outputs) == expected, "\(outputs); warnings: \(warnings.all)")
        // A freeze longer than the session makes the group move on and the loop rejoin: its inputs are then
        // processed again, as they must be. Either way the loop commits every input once its outputs are in.
        let tp = TopicPartition(topic: "in", partition: 0)
        try await waitUntil("the loop committed every input", timeout: .seconds(120)) {
            (try? await consumer.committed([tp])[tp]) == Int64(values.count)
        }
        loop.stop()
        try await running.value

        // The inputs were completed once their outputs were acknowledged: a new member of the group gets nothing.
        let after = Seen()
        let (again, _) = try makeLoop(broker, group: "retry-1", processor: GatedEcho(gate: gate, seen: after))
        let second = Task { try await again.run() }
        try await produce(["ok-marker"], topic: "in", brokers: broker.brokers)
        try await waitUntil("the new member got the marker", timeout: .seconds(120)) {
            after.values.contains("ok-marker")
        }
        again.stop()
        try await second.value
        #expect(after.values == ["ok-marker"])
    }

    @Test("at the in-flight bound the loop stops pulling, and pulls the rest once work completes")
    func pauseAndResumeAtTheInFlightBound() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        let values = (0..<60).map { "ok-\($0)" }
        try await produce(values, topic: "in", brokers: broker.brokers)

        let gate = Gate()
        let seen = Seen()
        // Batches of 7, up to 4 at once, at most 10 records in flight: with every batch held, the loop takes a
        // second batch (7 < 10) and then stops at 14.
        let (loop, _) = try makeLoop(
            broker, group: "bound-1", processor: GatedEcho(gate: gate, seen: seen),
            maxInFlight: 10, maxConcurrentBatches: 4)
        let running = Task { try await loop.run() }
        try await waitUntil("two batches in flight", timeout: .seconds(120)) { seen.values.count >= 10 }
        // While nothing completes, nothing more is pulled, however long we look.
        for _ in 0..<10 {
            #expect(seen.values.count <= 16, "pulled \(seen.values.count) records with at most 10 in flight")
            #expect(loop.inFlight <= 16)
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(seen.values.count < values.count)

        gate.open()
        let records = try await collect(topics: ["out"], count: values.count, brokers: broker.brokers)
        loop.stop()
        try await running.value
        #expect(
            Set(records.map { String(decoding: $0.value ?? [], as: UTF8.self) }) == Set(values.map { $0.uppercased() }))
        #expect(Set(seen.values) == Set(values))
    }

    @Test("a processor that returns the wrong number of results has its batch handed back, not lost or half-done")
    func wrongNumberOfResults() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        let values = (0..<5).map { "ok-\($0)" }
        try await produce(values, topic: "in", brokers: broker.brokers)

        /// Answers one result short for every batch.
        struct ShortProcessor: StageProcessor {
            let stage = "echo"
            let seen: Seen
            func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
                seen.add(batch.map { String(decoding: $0.value ?? [], as: UTF8.self) })
                return batch.dropLast().map { input in
                    StageResult(outputs: [StageOutput(topic: "out", key: "k", value: input.value ?? [])])
                }
            }
        }
        let seen = Seen()
        let (broken, _) = try makeLoop(broker, group: "short-1", processor: ShortProcessor(seen: seen))
        let running = Task { try await broken.run() }
        try await waitUntil("the processor saw every input", timeout: .seconds(120)) {
            Set(seen.values).isSuperset(of: values)
        }
        broken.stop()
        try await running.value

        // Nothing of the broken batches was produced or dead-lettered...
        let leaked = try await collect(topics: ["out", "dlq"], count: 1, brokers: broker.brokers, timeout: .seconds(3))
        #expect(leaked.isEmpty, "\(leaked.map { String(decoding: $0.value ?? [], as: UTF8.self) })")

        // ...and nothing was committed: a working processor in the same group gets every input.
        let (fixed, _) = try makeLoop(broker, group: "short-1", processor: EchoProcessor())
        let second = Task { try await fixed.run() }
        let records = try await collect(topics: ["out"], count: values.count, brokers: broker.brokers)
        fixed.stop()
        try await second.value
        #expect(
            Set(records.map { String(decoding: $0.value ?? [], as: UTF8.self) }) == Set(values.map { $0.uppercased() }))
    }
}
