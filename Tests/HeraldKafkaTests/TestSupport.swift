import CRdKafka
import Foundation
import HeraldKafka
import HeraldTestSupport
import Logging
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A failure of librdkafka's mock cluster set-up.
struct MockClusterError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// Tansu, free ports and waiting on conditions come from HeraldTestSupport.

/// librdkafka's in-process mock cluster (real TCP listeners on loopback).
final class MockCluster: @unchecked Sendable {
    // Safe: the pointers are set once; librdkafka's mock API is thread-safe.
    private let rk: OpaquePointer
    let cluster: OpaquePointer
    let bootstrap: String

    init(brokers: Int32 = 3) throws {
        var errbuf = [CChar](repeating: 0, count: 256)
        guard let conf = rd_kafka_conf_new() else { throw MockClusterError("conf") }
        rd_kafka_conf_set(conf, "log_level", "3", &errbuf, errbuf.count)
        guard let rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, &errbuf, errbuf.count) else {
            throw MockClusterError("rd_kafka_new failed")
        }
        guard let cluster = rd_kafka_mock_cluster_new(rk, brokers) else {
            rd_kafka_destroy(rk)
            throw MockClusterError("rd_kafka_mock_cluster_new failed")
        }
        self.rk = rk
        self.cluster = cluster
        self.bootstrap = String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
    }

    func createTopic(_ name: String, partitions: Int32, replication: Int32 = 3) {
        rd_kafka_mock_topic_create(cluster, name, partitions, replication)
    }

    /// The next `errors.count` requests of `apiKey` fail with these errors, in order.
    func pushRequestErrors(apiKey: Int16, _ errors: [rd_kafka_resp_err_t]) {
        errors.withUnsafeBufferPointer {
            rd_kafka_mock_push_request_errors_array(cluster, apiKey, errors.count, $0.baseAddress)
        }
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster)
        rd_kafka_destroy(rk)
    }
}

enum ApiKey {
    static let produce: Int16 = 0
    static let offsetCommit: Int16 = 8
}

func testLogger(_ label: String) -> Logger {
    var logger = Logger(label: label)
    logger.logLevel = ProcessInfo.processInfo.environment["HERALD_TEST_LOG"] == "debug" ? .debug : .warning
    return logger
}

func consumerConfig(
    _ brokers: String, group: String, topics: [String], batchSize: Int = 100,
    batchMaxWait: Duration = .milliseconds(50)
) -> KafkaConsumerConfiguration {
    var c = KafkaConsumerConfiguration(brokers: [brokers], groupID: group, topics: topics, clientID: "herald-test")
    c.sessionTimeout = .milliseconds(3000)
    c.batchSize = batchSize
    c.batchMaxWait = batchMaxWait
    c.lagInterval = .milliseconds(200)
    return c
}

func producer(_ brokers: String) throws -> KafkaProducer {
    var c = KafkaProducerConfiguration(brokers: [brokers], clientID: "herald-test")
    c.linger = .milliseconds(2)
    c.deliveryTimeout = .seconds(20)
    return try KafkaProducer(configuration: c, logger: testLogger("test.producer"))
}

/// Pulls batches until `count` records arrived or `timeout` passed; never completes them.
func collect(_ consumer: KafkaConsumer, count: Int, timeout: Duration = .seconds(120)) async throws -> [ConsumerRecord]
{
    try await collectBatches(consumer, count: count, timeout: timeout).flatMap { $0 }
}

/// The batches `nextBatch()` hands out until `count` records arrived (or `timeout` passed).
func collectBatches(
    _ consumer: KafkaConsumer, count: Int, timeout: Duration = .seconds(120)
) async throws -> [[ConsumerRecord]] {
    var batches: [[ConsumerRecord]] = []
    var total = 0
    let deadline = ContinuousClock.now + timeout
    while total < count, ContinuousClock.now < deadline {
        guard let batch = try await consumer.nextBatch() else { break }
        if !batch.isEmpty { batches.append(batch) }
        total += batch.count
    }
    return batches
}

/// Waits until `condition` holds or throws after `timeout` (HeraldTestSupport's `waitUntil` under the name these
/// tests use). The bound only ends a test that has failed: a lag refresh or a group join on a loaded 2-core host
/// has been seen to take more than 20 s.
func eventually(_ what: String, timeout: Duration = .seconds(120), _ condition: () async throws -> Bool) async throws {
    try await waitUntil(what, timeout: timeout, condition)
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }
func uniqueName(_ prefix: String) -> String { "\(prefix)-\(UInt32.random(in: 0...UInt32.max))" }
