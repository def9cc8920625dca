import CRdKafka
import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

/// Against a real Tansu broker started for each test on a free loopback port.
@Suite("Kafka adapter on Tansu", .serialized)
struct KafkaTansuTests {
    @Test("round trip keeps keys, values, headers and per-key order")
    func roundTrip() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("roundtrip")
        let created = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 3)],
            configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        #expect(created == [topic])
        let again = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 3)],
            configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        #expect(again.isEmpty, "an existing topic is left alone")
        let counts = try await KafkaAdmin.partitionCounts(
            [topic], configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        #expect(counts[topic] == 3)

        let producer = try producer(broker.bootstrap)
        let records = (0..<30).map { i in
            ProducerRecord(
                topic: topic, key: "conv-\(i % 3)", value: bytes("message \(i)"),
                headers: [KafkaHeader(key: "event-id", string: "e\(i)"), KafkaHeader(key: "empty", value: nil)])
        }
        let reports = try await producer.send(records)
        #expect(reports.count == 30)
        #expect(reports.allSatisfy { $0.isDelivered && $0.offset != nil && $0.topic == topic })

        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic]),
            logger: testLogger("test.consumer"))
        let got = try await collect(consumer, count: 30)
        #expect(got.count == 30)
        for record in got {
            let i = Int(String(decoding: record.value ?? [], as: UTF8.self).dropFirst("message ".count)) ?? -1
            #expect(record.key == bytes("conv-\(i % 3)"))
            #expect(record.header("event-id") == .some(bytes("e\(i)")))
            #expect(record.header("empty") == .some(nil), "a header without value stays without value")
            #expect(record.timestamp != nil)
            guard reports.indices.contains(i) else {
                Issue.record("unexpected value in \(record.topicPartition)@\(record.offset)")
                continue
            }
            #expect(record.partition == reports[i].partition && record.offset == reports[i].offset)
        }
        // All records of one key sit in one partition, in send order.
        for k in 0..<3 {
            let ofKey = got.filter { $0.key == bytes("conv-\(k)") }
            #expect(Set(ofKey.map(\.partition)).count == 1)
            #expect(ofKey.map(\.offset) == ofKey.map(\.offset).sorted())
            let sequence = ofKey.map { String(decoding: $0.value ?? [], as: UTF8.self) }
            #expect(sequence == (0..<30).filter { $0 % 3 == k }.map { "message \($0)" })
        }
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test("tombstones, empty and non-UTF-8 records reach the caller as bytes")
    func tombstonesAndGarbage() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("garbage")
        let producer = try producer(broker.bootstrap)
        let garbage: [UInt8] = [0xFF, 0xFE, 0x00, 0xC3, 0x28]
        try await producer.sendAll([
            ProducerRecord(topic: topic, key: "user-1", value: nil, partition: 0),
            ProducerRecord(topic: topic, key: nil as String?, value: [], partition: 0),
            ProducerRecord(
                topic: topic, key: garbage, value: garbage, headers: [KafkaHeader(key: "bin", value: garbage)],
                partition: 0),
            ProducerRecord(topic: topic, key: nil as String?, value: nil, partition: 0),
            // An empty key is a key, given as text or as bytes.
            ProducerRecord(topic: topic, key: "", value: bytes("empty text key"), partition: 0),
            ProducerRecord(topic: topic, key: [UInt8](), value: bytes("empty byte key"), partition: 0),
        ])
        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic]),
            logger: testLogger("test.consumer"))
        let got = try await collect(consumer, count: 6)
        #expect(got.count == 6)
        guard got.count == 6 else { return }
        #expect(got[4].key == [] && got[4].value == bytes("empty text key"))
        #expect(got[5].key == [] && got[5].value == bytes("empty byte key"))
        #expect(got[0].isTombstone && got[0].key == bytes("user-1"))
        #expect(got[1].value == [] && !got[1].isTombstone && got[1].key == nil)
        #expect(got[2].value == garbage && got[2].key == garbage && got[2].header("bin") == .some(garbage))
        #expect(got[3].isTombstone && got[3].key == nil)
        consumer.complete(got)
        try await consumer.commit()
        let committed = try await consumer.committed([TopicPartition(topic: topic, partition: 0)])
        #expect(committed[TopicPartition(topic: topic, partition: 0)] == 6)
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test("batches never exceed N records and an idle wait returns after about T")
    func batchLimits() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("batches")
        let producer = try producer(broker.bootstrap)
        try await producer.sendAll((0..<200).map { ProducerRecord(topic: topic, key: "k", value: bytes("\($0)")) })
        var config = consumerConfig(
            broker.bootstrap, group: uniqueName("g"), topics: [topic], batchSize: 7, batchMaxWait: .milliseconds(300))
        config.prefetchBatches = 3
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("test.consumer"))
        var sizes: [Int] = []
        var total = 0
        let deadline = ContinuousClock.now + .seconds(20)
        while total < 200, ContinuousClock.now < deadline {
            guard let batch = try await consumer.nextBatch() else { break }
            if !batch.isEmpty { sizes.append(batch.count) }
            total += batch.count
        }
        #expect(total == 200)
        #expect(sizes.allSatisfy { $0 <= 7 })
        #expect(sizes.filter { $0 == 7 }.count >= 25, "a backlog is handed out in full batches: \(sizes)")

        // Nothing left: a request waits T and comes back empty.
        let start = ContinuousClock.now
        let empty = try await consumer.nextBatch()
        let waited = ContinuousClock.now - start
        #expect(empty == [])
        #expect(waited >= .milliseconds(290) && waited < .seconds(30), "waited \(waited)")

        // A few records arriving while a request waits come back before T is over... or at T.
        let producerTask = Task {
            try await producer.sendAll([ProducerRecord(topic: topic, key: "k", value: bytes("late"))])
        }
        let late = try await collect(consumer, count: 1, timeout: .seconds(60))
        try await producerTask.value
        #expect(late.map(\.value) == [bytes("late")])

        // The sequence form yields only non-empty batches.
        try await producer.sendAll((0..<10).map { ProducerRecord(topic: topic, key: "k", value: bytes("s\($0)")) })
        var seen = 0
        for try await batch in consumer.batches {
            #expect(!batch.isEmpty && batch.count <= 7)
            seen += batch.count
            if seen >= 10 { break }
        }
        #expect(seen == 10)
        await consumer.shutdown()
        #expect(try await consumer.nextBatch() == nil, "a shut-down consumer ends its batches")
        try await producer.shutdown()
    }

    @Test("out-of-order completion stores only the low-water mark; a restart resumes there")
    func lowWaterMarkAndResume() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("lowwater")
        let group = uniqueName("g")
        let tp = TopicPartition(topic: topic, partition: 0)
        let producer = try producer(broker.bootstrap)
        try await producer.sendAll(
            (0..<4).map { ProducerRecord(topic: topic, key: "k", value: bytes("r\($0)"), partition: 0) })

        let first = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("test.consumer"))
        let got = try await collect(first, count: 4)
        #expect(got.map(\.offset) == [0, 1, 2, 3])
        guard got.count == 4 else { return }
        first.complete(got[3])
        first.complete([got[0], got[1]])
        try await first.commit()
        #expect(try await first.committed([tp])[tp] == 2)
        #expect(first.outstanding == 2, "2 pending, 3 done but not committable")
        await first.shutdown()

        let second = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("test.consumer"))
        let again = try await collect(second, count: 2)
        #expect(again.map(\.offset) == [2, 3], "resumes at the stored low-water mark")
        #expect(again.map(\.value) == [bytes("r2"), bytes("r3")])
        second.complete(again.reversed())
        await second.shutdown()  // commits on the way out

        let third = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("test.consumer"))
        try await eventually("assignment") { !third.assignment.isEmpty }
        #expect(try await third.committed([tp])[tp] == 4)
        try await producer.sendAll([ProducerRecord(topic: topic, key: "k", value: bytes("r4"), partition: 0)])
        let fresh = try await collect(third, count: 1)
        #expect(fresh.map(\.offset) == [4], "nothing completed is delivered again")
        await third.shutdown()
        try await producer.shutdown()
    }

    @Test("two consumers in one group split the partitions and each record goes to one of them")
    func groupSplitsPartitions() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("split")
        let group = uniqueName("g")
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 4)],
            configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        let a = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]), logger: testLogger("a"))
        let b = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]), logger: testLogger("b"))
        // Keep both polling (the poll threads do) until the group settled on two members.
        try await eventually("both members assigned", timeout: .seconds(120)) {
            !a.assignment.isEmpty && !b.assignment.isEmpty && a.assignment.count + b.assignment.count == 4
        }
        let sa = Set(a.assignment)
        let sb = Set(b.assignment)
        #expect(sa.isDisjoint(with: sb))
        #expect(sa.union(sb) == Set((0..<4).map { TopicPartition(topic: topic, partition: $0) }))

        let producer = try producer(broker.bootstrap)
        try await producer.sendAll(
            (0..<40).map { ProducerRecord(topic: topic, key: "user-\($0)", value: bytes("\($0)")) })
        async let fromA = collect(a, count: 40, timeout: .seconds(4))
        async let fromB = collect(b, count: 40, timeout: .seconds(4))
        let (ra, rb) = try await (fromA, fromB)
        #expect(ra.count + rb.count == 40)
        #expect(ra.allSatisfy { sa.contains($0.topicPartition) })
        #expect(rb.allSatisfy { sb.contains($0.topicPartition) })
        #expect(Set((ra + rb).map { String(decoding: $0.value ?? [], as: UTF8.self) }).count == 40)
        await a.shutdown()
        await b.shutdown()
        try await producer.shutdown()
    }

    @Test("pause stops fetching, resume continues where it stopped")
    func pauseAndResume() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("pause")
        let producer = try producer(broker.bootstrap)
        try await producer.sendAll(
            (0..<5).map { ProducerRecord(topic: topic, key: "k", value: bytes("a\($0)"), partition: 0) })
        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic]),
            logger: testLogger("test.consumer"))
        #expect(try await collect(consumer, count: 5).count == 5)
        consumer.pause()
        #expect(consumer.isPaused)
        try await Task.sleep(for: .milliseconds(300))  // the poll thread applies the pause
        // One record per request: Tansu answers ListOffsets(latest) with the last batch's
        // base offset + 1, so only single-record batches give it the true high watermark.
        for i in 0..<5 {
            try await producer.sendAll([ProducerRecord(topic: topic, key: "k", value: bytes("b\(i)"), partition: 0)])
        }
        let whilePaused = try await collect(consumer, count: 1, timeout: .seconds(2))
        #expect(whilePaused.isEmpty, "nothing is fetched while paused")
        let tp = TopicPartition(topic: topic, partition: 0)
        try await eventually("lag seen while paused (watermarks queried from the broker)") { consumer.lag[tp] == 5 }
        consumer.resume()
        let afterResume = try await collect(consumer, count: 5)
        #expect(afterResume.map(\.offset) == [5, 6, 7, 8, 9])
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test(
        "idle backoff: a consumer with nothing to fetch pauses and probes; each first record after a quiet spell wakes it (one record, a batch of three, one again)"
    )
    func idleBackoffWakesOnTheFirstRecord() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("idle")
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 2)], configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap])
        )
        let producer = try producer(broker.bootstrap)
        var config = consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic])
        config.idleAfter = .milliseconds(300)
        config.idleProbeInterval = .milliseconds(100)
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("test.consumer"))
        // Tansu answers ListOffsets(latest) with the last batch's base offset + 1, not its end: a batch of three
        // after a quiet spell must wake the consumer as a single record does.
        for (round, values) in [["first"], ["a", "b", "c"], ["last"]].enumerated() {
            if round > 0 { try await eventually("the consumer is idle before round \(round)") { consumer.isIdle } }
            let reports = try await producer.send(
                values.map { ProducerRecord(topic: topic, key: "k", value: bytes($0)) })
            #expect(reports.allSatisfy { $0.isDelivered })
            let got = try await collect(consumer, count: values.count)
            #expect(got.map { String(decoding: $0.value ?? [], as: UTF8.self) } == values, "round \(round)")
            consumer.complete(got)
        }
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test("wake(): an idle consumer whose next probe is ten minutes away fetches a waiting record at once when woken")
    func wakeEndsTheIdleWait() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("wake")
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 1)], configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap])
        )
        let producer = try producer(broker.bootstrap)
        var config = consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic])
        config.idleAfter = .milliseconds(300)
        config.idleProbeInterval = .seconds(600)
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("test.consumer"))
        let first = try await producer.send([ProducerRecord(topic: topic, key: "k", value: bytes("first"))])
        #expect(first.allSatisfy { $0.isDelivered })
        consumer.complete(try await collect(consumer, count: 1))
        // A round counts when the record was still waiting a second after it was produced (the probe made when
        // the consumer went idle had not seen it); a busy machine may need another round.
        var woken = 0
        for round in 0..<5 where woken == 0 {
            try await eventually("idle before round \(round)", timeout: .seconds(60)) { consumer.isIdle }
            try await Task.sleep(for: .seconds(1))
            let reports = try await producer.send(
                [ProducerRecord(topic: topic, key: "k", value: bytes("round-\(round)"))])
            #expect(reports.allSatisfy { $0.isDelivered })
            try await Task.sleep(for: .seconds(1))
            let stillIdle = consumer.isIdle
            consumer.wake()
            let got = try await collect(consumer, count: 1)
            #expect(got.map { String(decoding: $0.value ?? [], as: UTF8.self) } == ["round-\(round)"])
            consumer.complete(got)
            if stillIdle { woken += 1 }
        }
        #expect(woken == 1, "the record reached the consumer only through wake() in one round")
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test("shutdown commits completed records without an explicit commit; lag is reported")
    func shutdownCommitsAndLag() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("shutdown")
        let group = uniqueName("g")
        let tp = TopicPartition(topic: topic, partition: 0)
        let producer = try producer(broker.bootstrap)
        try await producer.sendAll(
            (0..<30).map { ProducerRecord(topic: topic, key: "k", value: bytes("\($0)"), partition: 0) })

        var config = consumerConfig(broker.bootstrap, group: group, topics: [topic], batchSize: 5)
        config.prefetchBatches = 1
        config.autoCommitInterval = .seconds(60)  // only shutdown may commit here
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("test.consumer"))
        let some = try await collect(consumer, count: 5)
        #expect(some.count == 5)
        try await eventually("lag measured") { (consumer.lag[tp] ?? 0) > 0 }
        let lag = consumer.lag[tp] ?? -1
        #expect(lag > 0 && lag <= 25, "lag \(lag): 30 records, at least 5 fetched")
        consumer.complete(some)
        let rest = try await collect(consumer, count: 25)
        #expect(rest.count == 25)
        try await eventually("lag drained") { consumer.lag[tp] == 0 }
        consumer.complete(rest.prefix(10))
        await consumer.shutdown()

        let check = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("test.consumer"))
        let next = try await collect(check, count: 1)
        #expect(next.first?.offset == 15, "5 + 10 completed records were committed on shutdown")
        await check.shutdown()
        try await producer.shutdown()
    }

    @Test("completions from many tasks in random order commit exactly the high watermark of every partition")
    func concurrentCompletions() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("concurrent")
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 4)],
            configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        let producer = try producer(broker.bootstrap)
        let reports = try await producer.send(
            (0..<4000).map { ProducerRecord(topic: topic, key: "u\($0)", value: bytes("\($0)")) })
        #expect(reports.allSatisfy { $0.isDelivered })
        var expected: [TopicPartition: Int64] = [:]
        for r in reports { expected[TopicPartition(topic: topic, partition: r.partition), default: 0] += 1 }

        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic], batchSize: 250),
            logger: testLogger("test.consumer"))
        let got = try await collect(consumer, count: 4000)
        #expect(got.count == 4000)
        await withTaskGroup(of: Void.self) { group in
            for slice in got.shuffled().chunked(into: 97) {
                group.addTask {
                    for record in slice.shuffled() { consumer.complete(record) }
                }
            }
        }
        #expect(consumer.outstanding == 0)
        try await consumer.commit()
        let committed = try await consumer.committed(Array(expected.keys))
        #expect(committed == expected, "every partition committed up to its end")
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test("fire-and-track produce reports each record's delivery")
    func fireAndTrack() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("track")
        let producer = try producer(broker.bootstrap)
        let delivered = Counter()
        for i in 0..<100 {
            try producer.produce(ProducerRecord(topic: topic, key: "k", value: bytes("\(i)"), partition: 0)) { report in
                if report.isDelivered, let offset = report.offset { delivered.add(offset) }
            }
        }
        try await producer.flush(timeout: .seconds(10))
        #expect(delivered.offsets == Set(0..<100))
        #expect(producer.outstanding == 0)
        try await producer.shutdown()
        await #expect(throws: KafkaError.self) {
            _ = try await producer.send(ProducerRecord(topic: topic, value: []))
        }
    }
}

final class Counter: @unchecked Sendable {
    // Safe: guarded by `lock`.
    private let lock = NSLock()
    private var set: Set<Int64> = []
    func add(_ o: Int64) { lock.lock(); set.insert(o); lock.unlock() }
    var offsets: Set<Int64> { lock.lock(); defer { lock.unlock() }; return set }
}

@Suite("Kafka adapter rebalancing on Tansu", .serialized)
struct KafkaRebalanceTests {
    @Test(
        "eager: a member joining revokes the whole assignment: completed work is committed first, the rest is redelivered once"
    )
    func revokeCommitsCompletedWork() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("revoke")
        let group = uniqueName("g")
        _ = try await KafkaAdmin.createTopics(
            [TopicSpec(name: topic, partitions: 2)],
            configuration: KafkaAdminConfiguration(brokers: [broker.bootstrap]))
        let producer = try producer(broker.bootstrap)
        for p in 0..<2 {
            try await producer.sendAll(
                (0..<10).map {
                    ProducerRecord(topic: topic, key: "k", value: bytes("p\(p)-\($0)"), partition: Int32(p))
                })
        }
        var config = consumerConfig(broker.bootstrap, group: group, topics: [topic])
        config.autoCommitInterval = .seconds(600)  // only the revoke may commit
        config.rebalance = .eager  // RebalanceTests covers the cooperative protocol
        config.revokeDrainTimeout = .milliseconds(200)
        let a = try KafkaConsumer(configuration: config, logger: testLogger("a"))
        let first = try await collect(a, count: 20)
        #expect(first.count == 20)
        a.complete(first.filter { $0.offset < 5 })

        let b = try KafkaConsumer(configuration: config, logger: testLogger("b"))
        try await eventually("rebalanced to one partition each", timeout: .seconds(120)) {
            a.assignment.count == 1 && b.assignment.count == 1
        }
        let tps = (0..<2).map { TopicPartition(topic: topic, partition: Int32($0)) }
        let committed = try await a.committed(tps)
        #expect(tps.map { committed[$0] } == [5, 5], "completed offsets were committed on revoke: \(committed)")

        // Completing records of the revoked assignment now changes nothing.
        a.complete(first.filter { $0.offset >= 5 })
        try await a.commit()
        #expect(try await a.committed(tps).mapValues { $0 } == committed)

        async let fromA = collect(a, count: 10, timeout: .seconds(5))
        async let fromB = collect(b, count: 10, timeout: .seconds(5))
        let redelivered = try await fromA + fromB
        #expect(redelivered.count == 10)
        for tp in tps {
            #expect(redelivered.filter { $0.topicPartition == tp }.map(\.offset).sorted() == [5, 6, 7, 8, 9])
        }
        await a.shutdown()
        await b.shutdown()
        try await producer.shutdown()
    }
}

extension Array {
    func chunked(into size: Int) -> [[Element]] {
        stride(from: 0, to: count, by: size).map { Array(self[$0..<Swift.min($0 + size, count)]) }
    }
}
