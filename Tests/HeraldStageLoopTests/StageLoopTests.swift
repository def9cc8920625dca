import Foundation
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldStage
import HeraldTestSupport
import Logging
import Metrics
import Synchronization
import Testing

// The batch loop against a real Tansu broker on a free loopback port (HeraldTestSupport starts it).
// The tests use StageLoop's public API only and describe behaviour, not how the loop is built.

/// Upper-cases `ok-*` records to `out`; dead-letters `bad-*`; hands back `hold-*` (as a shutdown would).
struct EchoProcessor: StageProcessor {
    let stage = "echo"
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        batch.map { input in
            let text = String(decoding: input.value ?? [], as: UTF8.self)
            if text.hasPrefix("bad") { return .dlq("invalid", "not an ok record") }
            if text.hasPrefix("hold") { return .handedBack }
            return StageResult(
                outputs: [StageOutput(topic: "out", key: text, value: Array(text.uppercased().utf8))],
                notes: [.suppressed(reason: "none")])
        }
    }
}

func produce(_ values: [String], topic: String, brokers: [String]) async throws {
    let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: brokers))
    try await producer.sendAll(values.map { ProducerRecord(topic: topic, key: "k", value: Array($0.utf8)) })
    try await producer.shutdown()
}

func collect(
    topics: [String], count: Int, brokers: [String], timeout: Duration = .seconds(120)
) async throws -> [ConsumerRecord] {
    try await collect(topics: topics, brokers: brokers, timeout: timeout) { $0.count >= count }
}

/// Reads `topics` from the start until `done` holds for what was read (or `timeout` passes), then half a second more.
func collect(
    topics: [String], brokers: [String], timeout: Duration = .seconds(120),
    until done: ([ConsumerRecord]) -> Bool
) async throws -> [ConsumerRecord] {
    var configuration = KafkaConsumerConfiguration(brokers: brokers, groupID: "reader-\(UUID())", topics: topics)
    configuration.sessionTimeout = .seconds(3)
    let consumer = try KafkaConsumer(configuration: configuration)
    var out: [ConsumerRecord] = []
    let deadline = ContinuousClock.now + timeout
    while !done(out), ContinuousClock.now < deadline {
        if let batch = try await consumer.nextBatch() { out += batch }
    }
    // A little longer, to see anything beyond `count`.
    let extra = ContinuousClock.now + .milliseconds(500)
    while ContinuousClock.now < extra {
        if let batch = try await consumer.nextBatch() { out += batch }
    }
    await consumer.shutdown()
    return out
}

func makeLoop(
    _ broker: TansuBroker, group: String, processor: any StageProcessor, maxInFlight: Int = 10,
    maxConcurrentBatches: Int = 1, sessionTimeout: Duration = .seconds(3),
    deliveryTimeout: Duration = .seconds(30), producerProperties: [String: String] = [:],
    explain: (any ExplainSink)? = nil, explainInterval: Duration = ExplainWriter.defaultInterval,
    logger: Logger = Logger(label: "test")
) throws -> (StageLoop, KafkaConsumer) {
    var configuration = KafkaConsumerConfiguration(brokers: broker.brokers, groupID: group, topics: ["in"])
    configuration.sessionTimeout = sessionTimeout
    configuration.batchSize = 7
    let consumer = try KafkaConsumer(configuration: configuration)
    // A short delivery timeout also needs a short request timeout: requests already sent wait for it.
    var properties = producerProperties
    if deliveryTimeout < .seconds(30) {
        properties["request.timeout.ms"] = String(max(100, deliveryTimeout.milliseconds / 2))
    }
    var producerConfiguration = KafkaProducerConfiguration(brokers: broker.brokers, extraProperties: properties)
    producerConfiguration.deliveryTimeout = deliveryTimeout
    let producer = try KafkaProducer(configuration: producerConfiguration)
    let loop = StageLoop(
        consumer: consumer, producer: producer, processor: processor,
        configuration: StageLoopConfiguration(
            dlqTopic: "dlq", maxInFlight: maxInFlight,
            maxConcurrentBatches: maxConcurrentBatches, explainInterval: explainInterval),
        metrics: StageMetrics(stage: "echo"), logger: logger, explain: explain)
    return (loop, consumer)
}

@Suite(.serialized) struct StageLoopTests {
    @Test func outputsAndDeadLettersAreProducedAndInputsCommitted() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 2), ("out", 2), ("dlq", 1)])
        let values = (0..<40).map { "ok-\($0)" } + (0..<10).map { "bad-\($0)" }
        try await produce(values.shuffled(), topic: "in", brokers: broker.brokers)

        let (loop, _) = try makeLoop(broker, group: "echo-1", processor: EchoProcessor())
        let running = Task { try await loop.run() }
        let records = try await collect(topics: ["out", "dlq"], count: 50, brokers: broker.brokers)
        loop.stop()
        try await running.value

        let outputs = records.filter { $0.topic == "out" }.map { String(decoding: $0.value ?? [], as: UTF8.self) }
        #expect(Set(outputs) == Set((0..<40).map { "OK-\($0)" }))
        #expect(outputs.count == 40)
        let letters = try records.filter { $0.topic == "dlq" }.map {
            try StageCodec.decode(DLQRecord.self, from: $0.value ?? [])
        }
        #expect(letters.count == 10)
        #expect(
            Set(letters.compactMap { $0.originalBytes.map { String(decoding: $0, as: UTF8.self) } })
                == Set((0..<10).map { "bad-\($0)" }))
        #expect(
            letters.allSatisfy { $0.sourceTopic == "in" && $0.stage == "echo" && $0.reason == "invalid" && $0.time > 0 }
        )

        // Everything was committed: a new member of the group gets nothing.
        let (again, _) = try makeLoop(broker, group: "echo-1", processor: EchoProcessor())
        let second = Task { try await again.run() }
        let more = try await collect(topics: ["out"], count: 41, brokers: broker.brokers, timeout: .seconds(8))
        again.stop()
        try await second.value
        #expect(more.count == 40)
    }

    @Test func thePartsOfAPackedInputAreProcessedAloneAndThePackIsCommittedOnceAllComplete() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 2), ("out", 2), ("dlq", 1), ("warm", 1)])
        var configuration = KafkaProducerConfiguration(brokers: broker.brokers)
        configuration.packTopics = ["in", "warm"]
        let packing = try KafkaProducer(configuration: configuration)
        // The producer packs once it has read the partition counts (in the background, at start).
        var packed = false
        let values = (0..<40).map { "ok-\($0)" } + (0..<10).map { "bad-\($0)" }
        let deadline = ContinuousClock.now + .seconds(15)
        while !packed, ContinuousClock.now < deadline {
            let probe = try await packing.send([
                ProducerRecord(topic: "warm", key: "probe", value: Array("x".utf8)),
                ProducerRecord(topic: "warm", key: "probe", value: Array("y".utf8)),
            ])
            packed = probe.count == 2 && probe[0].offset != nil && probe[0].offset == probe[1].offset
            if !packed { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(packed, "the producer read the partition counts")
        let reports = try await packing.send(
            values.shuffled().map { ProducerRecord(topic: "in", key: "k", value: Array($0.utf8)) })
        #expect(Set(reports.map { "\($0.partition)/\($0.offset ?? -1)" }).count == 1, "one key, one pack")
        try await packing.shutdown()

        let (loop, _) = try makeLoop(broker, group: "echo-packed", processor: EchoProcessor())
        let running = Task { try await loop.run() }
        let records = try await collect(topics: ["out", "dlq"], count: 50, brokers: broker.brokers)
        loop.stop()
        try await running.value
        let outputs = records.filter { $0.topic == "out" }
        #expect(
            Set(outputs.map { String(decoding: $0.value ?? [], as: UTF8.self) }) == Set((0..<40).map { "OK-\($0)" }))
        #expect(outputs.count == 40)
        let letters = try records.filter { $0.topic == "dlq" }.map {
            try StageCodec.decode(DLQRecord.self, from: $0.value ?? [])
        }
        #expect(letters.count == 10, "each bad part is dead-lettered on its own")
        #expect(
            Set(letters.compactMap { $0.originalBytes.map { String(decoding: $0, as: UTF8.self) } })
                == Set((0..<10).map { "bad-\($0)" }))
        #expect(letters.allSatisfy { $0.sourceOffset == reports.first?.offset }, "the source offset is the pack's")

        // The pack was committed: a new member of the group gets nothing.
        let (again, _) = try makeLoop(broker, group: "echo-packed", processor: EchoProcessor())
        let second = Task { try await again.run() }
        let more = try await collect(topics: ["out"], count: 41, brokers: broker.brokers, timeout: .seconds(8))
        again.stop()
        try await second.value
        #expect(more.count == 40)
    }

    @Test func handedBackInputsAreNotCommittedAndComeBack() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        try await produce(["ok-0", "ok-1", "hold-2", "ok-3"], topic: "in", brokers: broker.brokers)
        let (loop, _) = try makeLoop(broker, group: "echo-2", processor: EchoProcessor())
        let running = Task { try await loop.run() }
        _ = try await collect(topics: ["out"], count: 3, brokers: broker.brokers, timeout: .seconds(120))
        loop.stop()
        try await running.value

        // The group resumes at the handed-back record: it and everything after it are redelivered.
        struct Recorder: StageProcessor {
            let stage = "echo"
            let seen: Seen
            func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
                seen.add(batch.map { String(decoding: $0.value ?? [], as: UTF8.self) })
                return batch.map { _ in StageResult() }
            }
        }
        let seen = Seen()
        let (again, _) = try makeLoop(broker, group: "echo-2", processor: Recorder(seen: seen))
        let second = Task { try await again.run() }
        try await waitUntil("the handed-back records came back", timeout: .seconds(120)) { seen.values.count >= 2 }
        again.stop()
        try await second.value
        #expect(seen.values == ["hold-2", "ok-3"])
    }
}

/// Emits a 2 MB output for `huge-*` records (more than the producer's `message.max.bytes`), else echoes.
struct HugeOutputProcessor: StageProcessor {
    let stage = "echo"
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        batch.map { input in
            let text = String(decoding: input.value ?? [], as: UTF8.self)
            let value =
                text.hasPrefix("huge") ? [UInt8](repeating: 0x78, count: 2_000_000) : Array(text.uppercased().utf8)
            return StageResult(outputs: [StageOutput(topic: "out", key: text, value: value)])
        }
    }
}

@Suite(.serialized) struct StageLoopRejectionTests {
    @Test func anOutputTheBrokerRefusesForGoodIsDeadLetteredAndThePartitionMovesOn() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        try await produce(["ok-0", "huge-1", "ok-2", "huge-3", "ok-4"], topic: "in", brokers: broker.brokers)
        var configuration = KafkaConsumerConfiguration(brokers: broker.brokers, groupID: "reject-1", topics: ["in"])
        configuration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: configuration)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        let loop = StageLoop(
            consumer: consumer, producer: producer, processor: HugeOutputProcessor(),
            configuration: StageLoopConfiguration(dlqTopic: "dlq", maxInFlight: 10, dlqMaxOriginalBytes: 1000),
            metrics: StageMetrics(stage: "echo"), logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        let records = try await collect(topics: ["out", "dlq"], count: 5, brokers: broker.brokers)
        // The partition moved on: every input completed and its offset was committed.
        let tp = TopicPartition(topic: "in", partition: 0)
        var committed: Int64 = -1
        let deadline = ContinuousClock.now + .seconds(120)
        while committed < 5, ContinuousClock.now < deadline {
            try await consumer.commit()
            committed = try await consumer.committed([tp])[tp] ?? -1
            if committed < 5 { try await Task.sleep(for: .milliseconds(100)) }
        }
        loop.stop()
        try await running.value
        #expect(committed == 5)
        #expect(
            records.filter { $0.topic == "out" }.map { String(decoding: $0.value ?? [], as: UTF8.self) } == [
                "OK-0", "OK-2", "OK-4",
            ])
        let letters = try records.filter { $0.topic == "dlq" }.map {
            try StageCodec.decode(DLQRecord.self, from: $0.value ?? [])
        }
        #expect(letters.count == 2)
        for letter in letters {
            #expect(letter.reason == "produce_rejected")
            #expect(letter.detail.contains("MSG_SIZE_TOO_LARGE"), "\(letter.detail)")
            #expect(letter.truncated && letter.originalSize == 2_000_000 && letter.originalBytes?.count == 1000)
            #expect(letter.originalSHA256 == SHA256.hex([UInt8](repeating: 0x78, count: 2_000_000)))
            #expect(letter.sourceTopic == "in" && letter.sourcePartition == 0)
            // The original is the refused output: a replay sends it to the output's topic, not back to the input's.
            #expect(letter.targetTopic == "out" && letter.replayTopic == "out")
            let again = try StageCodec.decode(DLQRecord.self, from: StageCodec.encode(letter))
            #expect(again.targetTopic == "out")
        }
        #expect(Set(letters.compactMap(\.sourceOffset)) == [1, 3])
    }
}

@Suite(.serialized) struct StageLoopProducerReplacementTests {
    @Test func afterAFatalProducerErrorANewProducerTakesOverAndNothingIsLost() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        try await produce((0..<20).map { "ok-\($0)" }, topic: "in", brokers: broker.brokers)
        var configuration = KafkaConsumerConfiguration(brokers: broker.brokers, groupID: "fatal-1", topics: ["in"])
        configuration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: configuration)
        let first = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        let made = Mutex(0)
        let loop = StageLoop(
            consumer: consumer, producer: first,
            makeProducer: {
                made.withLock { $0 += 1 }
                return try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
            }, processor: EchoProcessor(), configuration: StageLoopConfiguration(dlqTopic: "dlq", maxInFlight: 10),
            metrics: StageMetrics(stage: "echo"), logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        _ = try await collect(topics: ["out"], count: 20, brokers: broker.brokers)
        // The broker fences the producer: every later produce of it fails for good.
        first.raiseFatalErrorForTesting()
        #expect(first.fatalError != nil)
        try await produce((20..<40).map { "ok-\($0)" }, topic: "in", brokers: broker.brokers)
        let records = try await collect(topics: ["out"], count: 40, brokers: broker.brokers)
        #expect(!loop.isStopping, "the loop went on with a new producer")
        loop.stop()
        try await running.value
        #expect(made.withLock { $0 } == 1)
        let outputs = Set(records.map { String(decoding: $0.value ?? [], as: UTF8.self) })
        #expect(outputs == Set((0..<40).map { "OK-\($0)" }))
    }

    @Test func withoutAFactoryAFatalProducerErrorStopsTheLoopWithTheError() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        var configuration = KafkaConsumerConfiguration(brokers: broker.brokers, groupID: "fatal-2", topics: ["in"])
        configuration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: configuration)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        let loop = StageLoop(
            consumer: consumer, producer: producer, processor: EchoProcessor(),
            configuration: StageLoopConfiguration(dlqTopic: "dlq", maxInFlight: 10),
            metrics: StageMetrics(stage: "echo"), logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        producer.raiseFatalErrorForTesting()
        try await produce(["ok-1"], topic: "in", brokers: broker.brokers)
        await #expect(throws: KafkaError.self) { try await running.value }
        #expect(loop.isStopping)
    }
}

/// What a processor saw, in order.
final class Seen: Sendable {
    private let items = Mutex<[String]>([])
    func add(_ new: [String]) { items.withLock { $0 += new } }
    var values: [String] { items.withLock { $0 } }
}

/// For each `fan-N` input: 3 records through `context.emit` (acknowledged before it returns), then 1 in the result.
final class EmittingProcessor: StageProcessor {
    let stage = "echo"
    let emitted = Mutex<[Bool]>([])
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        var results: [StageResult] = []
        for (index, input) in batch.enumerated() {
            let text = String(decoding: input.value ?? [], as: UTF8.self)
            let ahead = (0..<3).map { StageOutput(topic: "out", key: text, value: Array("\(text)/page\($0)".utf8)) }
            let ok = await context.emit?(ahead, index) ?? false
            emitted.withLock { $0.append(ok) }
            results.append(
                StageResult(outputs: [StageOutput(topic: "out", key: text, value: Array("\(text)/last".utf8))]))
        }
        return results
    }
}

@Suite(.serialized) struct StageLoopEmitTests {
    @Test func outputsEmittedAheadAreProducedBeforeTheResultsAndTheInputsComplete() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        try await produce((0..<5).map { "fan-\($0)" }, topic: "in", brokers: broker.brokers)
        let processor = EmittingProcessor()
        let (loop, _) = try makeLoop(broker, group: "emit-1", processor: processor)
        let running = Task { try await loop.run() }
        let records = try await collect(topics: ["out"], count: 20, brokers: broker.brokers)
        loop.stop()
        try await running.value
        #expect(processor.emitted.withLock { $0.allSatisfy { $0 } })
        let values = records.map { String(decoding: $0.value ?? [], as: UTF8.self) }
        #expect(values.count == 20)
        // Per input, its pages come before its result's record (one partition keeps the order).
        for n in 0..<5 {
            let mine = values.filter { $0.hasPrefix("fan-\(n)/") }
            #expect(mine == ["fan-\(n)/page0", "fan-\(n)/page1", "fan-\(n)/page2", "fan-\(n)/last"])
        }
        // Every input completed and was committed: a new member gets nothing again.
        let (again, _) = try makeLoop(broker, group: "emit-1", processor: EmittingProcessor())
        let second = Task { try await again.run() }
        let more = try await collect(topics: ["out"], count: 21, brokers: broker.brokers, timeout: .seconds(8))
        again.stop()
        try await second.value
        #expect(more.count == 20)
    }
}

/// Echoes each record to `out` with one explain entry naming it.
struct ExplainingProcessor: StageProcessor {
    let stage = "echo"
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        batch.map { input in
            let text = String(decoding: input.value ?? [], as: UTF8.self)
            return StageResult(
                outputs: [StageOutput(topic: "out", key: text, value: Array(text.utf8))],
                explain: [
                    ExplainEntry(
                        appID: "a", eventID: text, user: "u", stage: "suppress", decision: "suppress",
                        reason: "snoozed", at: 1)
                ])
        }
    }
}

/// Keeps what it is given.
final class ArrayExplainSink: ExplainSink {
    let entries = Mutex<[ExplainEntry]>([])
    func record(_ entries: [ExplainEntry]) async throws { self.entries.withLock { $0 += entries } }
}

/// Keeps the entries of events whose number is even, as a store keeps only some entries.
final class EvenExplainSink: ExplainSink {
    let entries = Mutex<[ExplainEntry]>([])
    func record(_ entries: [ExplainEntry]) async throws { self.entries.withLock { $0 += entries } }
    func keeps(_ entry: ExplainEntry) -> Bool { (Int(entry.eventID.dropFirst(3)) ?? 1) % 2 == 0 }
}

@Suite(.serialized) struct StageLoopExplainTests {
    @Test func theSinkIsHandedOnlyTheEntriesItKeeps() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        let values = (0..<12).map { "ex-\($0)" }
        try await produce(values, topic: "in", brokers: broker.brokers)
        let sink = EvenExplainSink()
        let (loop, _) = try makeLoop(
            broker, group: "explain-keeps", processor: ExplainingProcessor(), explain: sink, explainInterval: .zero)
        let running = Task { try await loop.run() }
        let records = try await collect(topics: ["out"], count: 12, brokers: broker.brokers)
        #expect(records.count == 12)
        loop.stop()
        try await running.value
        // Every input's output went out; only the entries of even events reached the sink, each once.
        let even = (0..<12).filter { $0 % 2 == 0 }.map { "ex-\($0)" }
        #expect(sink.entries.withLock { $0.map(\.eventID) }.sorted() == even.sorted())
    }

    @Test func explainEntriesStillGatheringAreWrittenWhenTheLoopStops() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        let values = (0..<12).map { "ex-\($0)" }
        try await produce(values, topic: "in", brokers: broker.brokers)
        let sink = ArrayExplainSink()
        // Gathering for an hour: nothing is written while the loop runs.
        let (loop, _) = try makeLoop(
            broker, group: "explain-1", processor: ExplainingProcessor(), explain: sink, explainInterval: .seconds(3600)
        )
        let running = Task { try await loop.run() }
        let records = try await collect(topics: ["out"], count: 12, brokers: broker.brokers)
        #expect(records.count == 12)
        #expect(sink.entries.withLock { $0.isEmpty }, "entries were written before the interval ended")
        loop.stop()
        try await running.value
        // Stopping wrote them all.
        #expect(Set(sink.entries.withLock { $0.map(\.eventID) }) == Set(values))
    }
}
