import CRdKafka
import Foundation
import HeraldCore
import Logging

/// Reads a whole topic, every partition from its beginning to the end the broker reported when the read
/// reached it, without joining a consumer group and without committing anything (`rd_kafka_assign`, no
/// `group.id`). For operators' tools and tests (`heraldctl dlq list`, the end-to-end suite), not for stages.
///
/// The blocking librdkafka calls run on a thread of their own.
public enum KafkaTopicReader {
    /// Every record of `topic` present when the call started, ordered by partition, then offset.
    /// A topic that does not exist reads as empty. Throws `KafkaError` when the broker cannot be reached or a
    /// partition cannot be read to its end within `timeout`.
    public static func readAll(
        topic: String, configuration: KafkaClientConfiguration, timeout: Duration = .seconds(15),
        logger: Logger = Logger(label: "herald.kafka.reader")
    ) async throws(KafkaError) -> [ConsumerRecord] {
        let result: Result<[ConsumerRecord], KafkaError> = await withCheckedContinuation { continuation in
            let thread = Thread {
                continuation.resume(
                    returning: Result { () throws(KafkaError) -> [ConsumerRecord] in
                        try readBlocking(topic: topic, configuration: configuration, timeout: timeout, logger: logger)
                    })
            }
            thread.name = "herald-kafka-reader"
            thread.start()
        }
        return try result.get()
    }

    private static func readBlocking(
        topic: String, configuration: KafkaClientConfiguration, timeout: Duration, logger: Logger
    ) throws(KafkaError) -> [ConsumerRecord] {
        let deadline = ContinuousClock.now + timeout
        func remainingMs() -> Int32 {
            let left = ContinuousClock.now.duration(to: deadline)
            return Int32(clamping: max(0, left.milliseconds))
        }
        var properties = LibrdkafkaProperties.client(configuration)
        // rd_kafka_assign needs a group id to exist; with a manual assignment the consumer never joins the group,
        // and with auto commit off it never commits to it.
        properties["group.id"] = "herald-reader-\(UInt64.random(in: 0...UInt64.max))"
        properties["enable.auto.commit"] = "false"
        properties["enable.auto.offset.store"] = "false"
        properties["enable.partition.eof"] = "true"
        properties["allow.auto.create.topics"] = "false"
        properties = properties.merging(configuration.extraProperties) { _, extra in extra }
        let handle = try RdKafkaHandle(type: RD_KAFKA_CONSUMER, properties: properties, logger: logger)
        defer { handle.destroy() }
        let rk = handle.pointer

        // Partition count from the topic's metadata.
        let partitions = try partitionCount(rk, topic: topic, timeoutMs: remainingMs())
        if partitions == 0 { return [] }

        // Every partition from its beginning, until librdkafka reports its end (PARTITION_EOF, from the fetch
        // response's high watermark). ListOffsets is not used: Tansu answers it with the next batch's base offset,
        // not the next record's.
        let list = makePartitionList(
            (0..<partitions).map { (TopicPartition(topic: topic, partition: $0), Int64(RD_KAFKA_OFFSET_BEGINNING)) })
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let assignErr = rd_kafka_assign(rk, list)
        guard assignErr == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError.rdkafka(.consume, assignErr, "assigning \(topic)")
        }
        defer { _ = rd_kafka_assign(rk, nil) }

        var records: [ConsumerRecord] = []
        var atEnd = Set<Int32>()
        while atEnd.count < Int(partitions) {
            let wait = min(remainingMs(), 200)
            if wait <= 0 {
                let missing = (0..<partitions).filter { !atEnd.contains($0) }.map { "\($0)" }
                throw KafkaError(
                    code: .consume,
                    reason:
                        "reading \(topic) timed out; partitions not read to the end: \(missing.joined(separator: ","))")
            }
            guard let message = rd_kafka_consumer_poll(rk, Int32(wait)) else { continue }
            defer { rd_kafka_message_destroy(message) }
            let err = message.pointee.err
            if err == RD_KAFKA_RESP_ERR__PARTITION_EOF {
                atEnd.insert(message.pointee.partition)
                continue
            }
            if err != RD_KAFKA_RESP_ERR_NO_ERROR {
                logger.debug(
                    "read error",
                    metadata: ["topic": .string(topic), "error": .string(String(cString: rd_kafka_err2str(err)))])
                continue
            }
            let record = ConsumerRecord(copying: message, topic: topic, epoch: 0)
            if atEnd.contains(record.partition) { continue }
            records.append(record)
        }
        return records.sorted { ($0.partition, $0.offset) < ($1.partition, $1.offset) }
    }

    private static func partitionCount(_ rk: OpaquePointer, topic: String, timeoutMs: Int32) throws(KafkaError) -> Int32
    {
        guard let rkt = rd_kafka_topic_new(rk, topic, nil) else {
            throw KafkaError(code: .consume, reason: "cannot create a topic handle for \(topic)")
        }
        defer { rd_kafka_topic_destroy(rkt) }
        var metadata: UnsafePointer<rd_kafka_metadata>?
        let err = rd_kafka_metadata(rk, 0, rkt, &metadata, timeoutMs)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
            throw KafkaError.rdkafka(.consume, err, "reading metadata of \(topic)")
        }
        defer { rd_kafka_metadata_destroy(metadata) }
        let m = metadata.pointee
        for i in 0..<Int(m.topic_cnt) {
            let t = m.topics[i]
            guard String(cString: t.topic) == topic else { continue }
            if t.err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART { return 0 }
            return t.partition_cnt
        }
        return 0
    }
}
