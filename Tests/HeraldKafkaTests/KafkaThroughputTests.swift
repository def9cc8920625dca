import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

/// Produces and consumes HERALD_KAFKA_BENCH_COUNT (default 200 000) small records on Tansu
/// and prints the rates. Asserts only correctness (every record consumed exactly once);
/// the figures are printed, not judged.
@Suite("Kafka adapter throughput on Tansu", .serialized)
struct KafkaThroughputTests {
    @Test("produce + consume 200k small records through a consumer group")
    func throughput() async throws {
        let count = Int(ProcessInfo.processInfo.environment["HERALD_KAFKA_BENCH_COUNT"] ?? "") ?? 200_000
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("bench")
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 4)],
            configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        let producer = try producer(broker.bootstrap)
        let payload = [UInt8](repeating: UInt8(ascii: "x"), count: 100)
        let clock = ContinuousClock()

        let produceStart = clock.now
        let chunk = 10_000
        var delivered = 0
        for start in stride(from: 0, to: count, by: chunk) {
            let records = (start..<min(count, start + chunk)).map { i in
                ProducerRecord(
                    topic: topic, key: "user-\(i % 1000)", value: payload,
                    headers: [KafkaHeader(key: "i", string: String(i))])
            }
            delivered += try await producer.send(records).filter(\.isDelivered).count
        }
        let produceTime = clock.now - produceStart
        #expect(delivered == count)
        try await producer.shutdown()

        var config = consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic], batchSize: 1000)
        config.prefetchBatches = 4
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("bench.consumer"))
        // Time from the first record, so the group join is not counted.
        var seen = Set<String>()
        seen.reserveCapacity(count)
        var consumed = 0
        var firstRecord: ContinuousClock.Instant?
        let deadline = clock.now + .seconds(120)
        while consumed < count, clock.now < deadline {
            guard let batch = try await consumer.nextBatch() else { break }
            if firstRecord == nil, !batch.isEmpty { firstRecord = clock.now }
            consumed += batch.count
            for r in batch { if let i = r.header("i"), let v = i { seen.insert(String(decoding: v, as: UTF8.self)) } }
            consumer.complete(batch)
        }
        let consumeTime = clock.now - (firstRecord ?? clock.now)
        try await consumer.commit()
        await consumer.shutdown()
        #expect(consumed == count && seen.count == count)

        func rate(_ d: Duration) -> Int {
            Int(Double(count) / max(0.001, Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18))
        }
        print(
            "KAFKA-BENCH records=\(count) size=100B produce=\(produceTime) (\(rate(produceTime))/s) "
                + "consume+complete(group)=\(consumeTime) (\(rate(consumeTime))/s)")
    }
}
