// herald-kafka-bench: produce then consume N small records through HeraldKafka against a
// running broker, printing the rates.
//
//   scripts/tansu.sh start 19092
//   swift run -c release herald-kafka-bench 127.0.0.1:19092 [count] [partitions]
//   scripts/tansu.sh stop 19092
// (or scripts/dev-broker.sh start 19192: its topics are created by the first record, with 4 partitions)
import Foundation
import HeraldKafka
import Logging

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    FileHandle.standardError.write(Data("usage: herald-kafka-bench BROKER [COUNT=200000] [PARTITIONS=4]\n".utf8))
    exit(2)
}
let broker = arguments[1]
let count = arguments.count > 2 ? Int(arguments[2]) ?? 200_000 : 200_000
let partitions = arguments.count > 3 ? Int32(arguments[3]) ?? 4 : 4
var logger = Logger(label: "herald-kafka-bench")
logger.logLevel = .warning

func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }

do {
    let topic = "bench-\(UInt32.random(in: 0...UInt32.max))"
    do {
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: partitions)],
            configuration: KafkaAdminConfiguration(brokers: [broker]), logger: logger)
    } catch {
        // herald-dev-broker (librdkafka's mock cluster) answers no CreateTopics request: the first record produced
        // creates the topic with the broker's default partition count (4), which the report line states.
        FileHandle.standardError.write(
            Data("herald-kafka-bench: \(error); the first record creates the topic instead\n".utf8))
    }
    let producer = try KafkaProducer(
        configuration: KafkaProducerConfiguration(brokers: [broker], clientID: "bench"), logger: logger)
    let payload = [UInt8](repeating: UInt8(ascii: "x"), count: 100)
    let clock = ContinuousClock()
    let produceStart = clock.now
    var delivered = 0
    for start in stride(from: 0, to: count, by: 10_000) {
        let records = (start..<min(count, start + 10_000)).map { i in
            ProducerRecord(
                topic: topic, key: "user-\(i % 1000)", value: payload,
                headers: [KafkaHeader(key: "i", string: String(i))])
        }
        delivered += try await producer.send(records).filter(\.isDelivered).count
    }
    let produceTime = clock.now - produceStart
    try await producer.shutdown()
    let partitionCount = try await KafkaAdmin.partitionCounts(
        [topic], configuration: KafkaAdminConfiguration(brokers: [broker]), logger: logger)[topic].map(Int32.init)

    var config = KafkaConsumerConfiguration(
        brokers: [broker], groupID: "bench-\(topic)", topics: [topic], clientID: "bench")
    config.sessionTimeout = .seconds(3)
    config.batchSize = 1000
    config.prefetchBatches = 4
    let consumer = try KafkaConsumer(configuration: config, logger: logger)
    var consumed = 0
    var first: ContinuousClock.Instant?
    let deadline = clock.now + .seconds(120)
    while consumed < count, clock.now < deadline {
        guard let batch = try await consumer.nextBatch() else { break }
        if first == nil, !batch.isEmpty { first = clock.now }
        consumed += batch.count
        consumer.complete(batch)
    }
    let consumeTime = clock.now - (first ?? clock.now)
    try await consumer.commit()
    await consumer.shutdown()
    print(
        String(
            format:
                "records=%d size=100B partitions=%d produce: %d acked in %.2fs = %.0f/s; consume+complete (group): %d in %.2fs = %.0f/s",
            count, partitionCount ?? -1, delivered, seconds(produceTime), Double(delivered) / seconds(produceTime),
            consumed, seconds(consumeTime), Double(consumed) / max(0.001, seconds(consumeTime))))
    exit(delivered == count && consumed == count ? 0 : 1)
} catch {
    FileHandle.standardError.write(Data("herald-kafka-bench: \(error)\n".utf8))
    exit(1)
}
