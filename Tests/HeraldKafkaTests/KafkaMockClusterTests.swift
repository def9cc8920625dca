import CRdKafka
import HeraldKafka
import Testing

/// Broker faults injected with librdkafka's mock cluster (real TCP listeners on loopback).
@Suite("Kafka adapter under injected broker errors", .serialized)
struct KafkaMockClusterTests {
    @Test("retriable Produce errors: the idempotent producer still delivers every record exactly once, in order")
    func idempotentProducerRetries() async throws {
        let mock = try MockCluster()
        let topic = uniqueName("idem")
        mock.createTopic(topic, partitions: 1)
        // The first five ProduceRequests fail with retriable errors.
        mock.pushRequestErrors(
            apiKey: ApiKey.produce,
            [
                RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            ])
        let producer = try producer(mock.bootstrap)
        let records = (0..<500).map { ProducerRecord(topic: topic, key: "k", value: bytes("seq-\($0)"), partition: 0) }
        let reports = try await producer.send(records)
        let failures = reports.compactMap(\.error)
        #expect(failures.isEmpty, "\(failures.first.map { "\($0)" } ?? "")")
        try await producer.shutdown()

        let consumer = try KafkaConsumer(
            configuration: consumerConfig(mock.bootstrap, group: uniqueName("g"), topics: [topic]),
            logger: testLogger("mock.consumer"))
        let got = try await collect(consumer, count: 500, timeout: .seconds(120))
        // Anything duplicated would show up within the extra wait below.
        let extra = try await collect(consumer, count: 1, timeout: .milliseconds(500))
        #expect(got.count == 500 && extra.isEmpty, "exactly once: \(got.count) + \(extra.count)")
        #expect(got.map { String(decoding: $0.value ?? [], as: UTF8.self) } == (0..<500).map { "seq-\($0)" })
        #expect(got.map(\.offset) == (0..<500).map(Int64.init))
        await consumer.shutdown()
    }

    @Test("a non-retriable Produce error is reported as that record's delivery failure")
    func permanentProduceErrorSurfaces() async throws {
        let mock = try MockCluster()
        let topic = uniqueName("perm")
        mock.createTopic(topic, partitions: 1)
        mock.pushRequestErrors(apiKey: ApiKey.produce, [RD_KAFKA_RESP_ERR_INVALID_RECORD])
        let producer = try producer(mock.bootstrap)
        let report = try await producer.send(ProducerRecord(topic: topic, key: "k", value: bytes("x"), partition: 0))
        #expect(!report.isDelivered)
        #expect(report.error?.code == .delivery)
        #expect(report.error?.librdkafkaCode == RD_KAFKA_RESP_ERR_INVALID_RECORD.rawValue)
        #expect(report.error?.librdkafkaName == "INVALID_RECORD")
        // sendAll turns the same failure into a thrown error.
        mock.pushRequestErrors(apiKey: ApiKey.produce, [RD_KAFKA_RESP_ERR_INVALID_RECORD])
        do {
            try await producer.sendAll([ProducerRecord(topic: topic, key: "k", value: bytes("y"), partition: 0)])
            Issue.record("sendAll should have thrown")
        } catch {
            #expect(error.code == .delivery)
        }
        // With no error queued the broker accepts records again.
        #expect(
            try await producer.send(ProducerRecord(topic: topic, key: "k", value: bytes("z"), partition: 0)).isDelivered
        )
        try await producer.shutdown()
    }

    @Test(
        "records with headers the partitioner refuses (a partition the topic does not have) fail alone; the producer and the process go on"
    )
    func refusedRecordsWithHeaders() async throws {
        let mock = try MockCluster(brokers: 1)
        let topic = uniqueName("hdr")
        mock.createTopic(topic, partitions: 1, replication: 1)
        let producer = try producer(mock.bootstrap)
        // The topic's partition count is known once a record went through: from then on librdkafka refuses a
        // record for partition 7 in the produce call itself.
        #expect(
            try await producer.send(ProducerRecord(topic: topic, key: "k", value: bytes("a"), partition: 0)).isDelivered
        )
        let headers = [
            KafkaHeader(key: "herald-reason", string: "x"), KafkaHeader(key: "empty", value: []),
            KafkaHeader(key: "none", value: nil),
        ]
        // Each refused record freed its headers twice before they were handed over as one list of Herald's own;
        // glibc's allocator stopped the process within a few hundred of them.
        for round in 0..<20 {
            let refused = (0..<50).map {
                ProducerRecord(topic: topic, key: "k", value: bytes("r\(round)-\($0)"), headers: headers, partition: 7)
            }
            let reports = try await producer.send(refused)
            #expect(reports.count == 50)
            #expect(reports.allSatisfy { !$0.isDelivered }, "round \(round)")
        }
        // Records with headers still go through, and keep their headers.
        let kept = ProducerRecord(topic: topic, key: "k", value: bytes("b"), headers: headers, partition: 0)
        #expect(try await producer.send(kept).isDelivered)
        try await producer.shutdown()
        let consumer = try KafkaConsumer(
            configuration: consumerConfig(mock.bootstrap, group: uniqueName("g"), topics: [topic]),
            logger: testLogger("mock.consumer"))
        let got = try await collect(consumer, count: 2)
        #expect(got.map { String(decoding: $0.value ?? [], as: UTF8.self) } == ["a", "b"])
        #expect(got.last?.headers == headers)
        await consumer.shutdown()
    }

    @Test("a failed commit is surfaced as KafkaError.commit and a later commit succeeds")
    func commitFailureSurfaces() async throws {
        let mock = try MockCluster()
        let topic = uniqueName("commit")
        mock.createTopic(topic, partitions: 1)
        let producer = try producer(mock.bootstrap)
        try await producer.sendAll(
            (0..<3).map { ProducerRecord(topic: topic, key: "k", value: bytes("\($0)"), partition: 0) })
        try await producer.shutdown()

        var config = consumerConfig(mock.bootstrap, group: uniqueName("g"), topics: [topic])
        config.autoCommitInterval = .seconds(600)
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("mock.consumer"))
        let got = try await collect(consumer, count: 3)
        #expect(got.count == 3)
        consumer.complete(got)
        mock.pushRequestErrors(apiKey: ApiKey.offsetCommit, [RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED])
        do {
            try await consumer.commit()
            Issue.record("commit should have failed")
        } catch {
            #expect(error.code == .commit)
            #expect(error.librdkafkaName == "GROUP_AUTHORIZATION_FAILED")
        }
        try await consumer.commit()
        let tp = TopicPartition(topic: topic, partition: 0)
        #expect(try await consumer.committed([tp])[tp] == 3)
        await consumer.shutdown()
    }
}
