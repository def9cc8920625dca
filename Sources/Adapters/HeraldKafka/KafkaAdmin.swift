import CRdKafka
import Foundation
import HeraldCore
import Logging

/// A topic to create.
public struct TopicSpec: Sendable, Hashable {
    public var name: String
    public var partitions: Int32
    public var replicationFactor: Int32
    public init(name: String, partitions: Int32, replicationFactor: Int32 = 1) {
        self.name = name
        self.partitions = partitions
        self.replicationFactor = replicationFactor
    }
}

/// Topic administration (used by tests, `heraldctl` and the local stack).
public enum KafkaAdmin {
    /// Creates the topics that do not exist yet (`rd_kafka_CreateTopics`); topics that
    /// already exist are left as they are. Returns the names that were created.
    /// The blocking librdkafka calls run on a thread of their own.
    public static func createTopics(
        _ topics: [TopicSpec], configuration: KafkaAdminConfiguration,
        logger: Logger = Logger(label: "herald.kafka.admin")
    ) async throws(KafkaError) -> [String] {
        if topics.isEmpty { return [] }
        let result: Result<[String], KafkaError> = await withCheckedContinuation { continuation in
            let thread = Thread {
                continuation.resume(
                    returning: Result { () throws(KafkaError) -> [String] in
                        try createTopicsBlocking(topics, configuration: configuration, logger: logger)
                    })
            }
            thread.name = "herald-kafka-admin"
            thread.start()
        }
        return try result.get()
    }

    private static func createTopicsBlocking(
        _ topics: [TopicSpec], configuration: KafkaAdminConfiguration, logger: Logger
    ) throws(KafkaError) -> [String] {
        let handle = try RdKafkaHandle(
            type: RD_KAFKA_PRODUCER, properties: LibrdkafkaProperties.admin(configuration), logger: logger)
        defer { handle.destroy() }
        let rk = handle.pointer
        var errbuf = [CChar](repeating: 0, count: 512)
        var newTopics: [OpaquePointer?] = []
        defer { newTopics.forEach { rd_kafka_NewTopic_destroy($0) } }
        for topic in topics {
            guard
                let t = rd_kafka_NewTopic_new(
                    topic.name, topic.partitions, topic.replicationFactor, &errbuf, errbuf.count)
            else {
                throw KafkaError(code: .admin, reason: cStringBuffer(errbuf), context: ["topic": topic.name])
            }
            newTopics.append(t)
        }
        guard let queue = rd_kafka_queue_new(rk) else {
            throw KafkaError(code: .admin, reason: "rd_kafka_queue_new failed")
        }
        defer { rd_kafka_queue_destroy(queue) }
        let options = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS)
        defer { rd_kafka_AdminOptions_destroy(options) }
        let timeoutMs = Int32(clamping: configuration.requestTimeout.milliseconds)
        _ = rd_kafka_AdminOptions_set_request_timeout(options, timeoutMs, &errbuf, errbuf.count)
        _ = rd_kafka_AdminOptions_set_operation_timeout(options, timeoutMs, &errbuf, errbuf.count)

        newTopics.withUnsafeMutableBufferPointer { buffer in
            rd_kafka_CreateTopics(rk, buffer.baseAddress, buffer.count, options, queue)
        }
        guard let event = rd_kafka_queue_poll(queue, timeoutMs + 1000) else {
            throw KafkaError(
                code: .admin, reason: "CreateTopics timed out", librdkafkaCode: RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue)
        }
        defer { rd_kafka_event_destroy(event) }
        let eventErr = rd_kafka_event_error(event)
        if eventErr != RD_KAFKA_RESP_ERR_NO_ERROR {
            throw KafkaError.rdkafka(.admin, eventErr, "CreateTopics failed")
        }
        guard let result = rd_kafka_event_CreateTopics_result(event) else {
            throw KafkaError(code: .admin, reason: "CreateTopics returned no result")
        }
        var count = 0
        guard let results = rd_kafka_CreateTopics_result_topics(result, &count) else { return [] }
        var created: [String] = []
        for i in 0..<count {
            guard let r = results[i] else { continue }
            let name = String(cString: rd_kafka_topic_result_name(r))
            let err = rd_kafka_topic_result_error(r)
            switch err {
            case RD_KAFKA_RESP_ERR_NO_ERROR:
                created.append(name)
            case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS:
                logger.debug("topic exists", metadata: ["topic": .string(name)])
            default:
                let text = rd_kafka_topic_result_error_string(r).map { String(cString: $0) } ?? ""
                throw KafkaError(
                    code: .admin, reason: "creating topic failed: \(text)", librdkafkaCode: err.rawValue,
                    context: ["topic": name])
            }
        }
        return created
    }

    /// Partition count per topic from the cluster's metadata (`rd_kafka_metadata`);
    /// topics that do not exist are absent.
    public static func partitionCounts(
        _ topics: [String], configuration: KafkaAdminConfiguration,
        logger: Logger = Logger(label: "herald.kafka.admin")
    ) async throws(KafkaError) -> [String: Int] {
        let result: Result<[String: Int], KafkaError> = await withCheckedContinuation { continuation in
            let thread = Thread {
                continuation.resume(
                    returning: Result { () throws(KafkaError) -> [String: Int] in
                        let handle = try RdKafkaHandle(
                            type: RD_KAFKA_PRODUCER, properties: LibrdkafkaProperties.admin(configuration),
                            logger: logger)
                        defer { handle.destroy() }
                        var metadata: UnsafePointer<rd_kafka_metadata>?
                        let err = rd_kafka_metadata(
                            handle.pointer, 1, nil, &metadata,
                            Int32(clamping: configuration.requestTimeout.milliseconds))
                        guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
                            throw KafkaError.rdkafka(.admin, err, "metadata request failed")
                        }
                        defer { rd_kafka_metadata_destroy(metadata) }
                        var counts: [String: Int] = [:]
                        let wanted = Set(topics)
                        for i in 0..<Int(metadata.pointee.topic_cnt) {
                            guard let t = metadata.pointee.topics?[i], let namePointer = t.topic else { continue }
                            let name = String(cString: namePointer)
                            if wanted.contains(name), t.err == RD_KAFKA_RESP_ERR_NO_ERROR {
                                counts[name] = Int(t.partition_cnt)
                            }
                        }
                        return counts
                    })
            }
            thread.name = "herald-kafka-admin"
            thread.start()
        }
        return try result.get()
    }
}
