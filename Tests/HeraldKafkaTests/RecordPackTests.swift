import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

@Suite("Packed records: the format and the offset of a pack")
struct RecordPackFormatTests {
    @Test("parts keep their keys, values, missing keys and tombstones, in order")
    func roundTrip() {
        let parts = [
            RecordPack.Part(key: bytes("user-1"), value: bytes("first")),
            RecordPack.Part(key: nil, value: []),
            RecordPack.Part(key: bytes("user-2"), value: nil),
            RecordPack.Part(key: [], value: Array(repeating: 0xAB, count: 300)),
        ]
        let packed = RecordPack.encode(parts)
        #expect(RecordPack.decode(packed) == parts)
    }

    @Test("bytes that are not a whole pack are an ordinary record")
    func notAPack() {
        let packed = RecordPack.encode([
            RecordPack.Part(key: bytes("k"), value: bytes("v")), RecordPack.Part(key: bytes("k"), value: bytes("w")),
        ])
        #expect(RecordPack.decode(Array(packed.dropLast())) == nil, "cut short")
        #expect(RecordPack.decode(packed + [0]) == nil, "trailing bytes")
        #expect(RecordPack.decode(bytes("{\"event_id\":\"e1\"}")) == nil, "JSON")
        #expect(RecordPack.decode([0x00, 0x48, 0x01, 0x02]) == nil, "a binary stage record")
        #expect(RecordPack.decode([0x00, 0x50, 0x01, 0x00]) == nil, "no parts")
        #expect(RecordPack.decode([0x00, 0x50, 0x01, 0x05, 0x00, 0x00]) == nil, "fewer parts than announced")
        // Every shorter prefix of a pack, and a pack with a length past its end, is refused whole.
        let longer = RecordPack.encode([
            RecordPack.Part(key: bytes("user-1"), value: Array(repeating: 7, count: 200)),
            RecordPack.Part(key: nil, value: bytes("v")), RecordPack.Part(key: bytes("u"), value: nil),
        ])
        for length in 0..<longer.count { #expect(RecordPack.decode(Array(longer.prefix(length))) == nil) }
        var overlong = longer
        overlong[4] = 0xFF  // the first key's length + 1, as a varint of 16,383: past the pack's end
        overlong[5] = 0x7F
        #expect(RecordPack.decode(overlong) == nil)
    }

    @Test("a pack's offset is committable only once every part completed")
    func trackerCountsParts() {
        var t = PartitionOffsetTracker()
        t.delivered(5, parts: 3)
        t.delivered(6)
        #expect(t.complete(6) == nil)
        #expect(t.complete(5) == nil)
        #expect(t.complete(5) == nil)
        #expect(t.committable == nil)
        #expect(t.complete(5) == 7, "the last part retires the pack and the record after it")
        #expect(t.complete(5) == nil, "a fourth completion changes nothing")
        #expect(t.outstanding == 0)
    }

    @Test("a run of a pack's parts completes in one step, as many single completions would")
    func trackerCountsRuns() {
        var t = PartitionOffsetTracker()
        t.delivered(5, parts: 4)
        t.delivered(6, parts: 2)
        #expect(t.complete(6, parts: 2) == nil)
        #expect(t.complete(5, parts: 3) == nil)
        #expect(t.complete(5, parts: 0) == nil, "no parts: nothing")
        #expect(t.complete(5, parts: 1) == 7)
        t.delivered(7, parts: 2)
        #expect(t.complete(7, parts: 5) == 8, "more parts than are left complete the record once")
        #expect(t.complete(7) == nil)
        #expect(t.outstanding == 0)
    }
}

@Suite("Producer records")
struct ProducerRecordTests {
    @Test("a key given as text is the same key as its UTF-8 bytes")
    func textAndByteKeys() {
        let text = ProducerRecord(topic: "t", key: "user-ü1", value: bytes("v"))
        let raw = ProducerRecord(topic: "t", key: Array("user-ü1".utf8), value: bytes("v"))
        #expect(text.key == Array("user-ü1".utf8))
        #expect(text == raw)
        #expect(text.hashValue == raw.hashValue)
        #expect(text != ProducerRecord(topic: "t", key: "user-ü2", value: bytes("v")))
        #expect(ProducerRecord(topic: "t", key: "", value: nil).key == [])
        #expect(ProducerRecord(topic: "t", key: nil as String?, value: nil).key == nil)
        #expect(
            ProducerRecord(topic: "t", key: "", value: nil)
                != ProducerRecord(topic: "t", key: nil as String?, value: nil))
        var changed = text
        changed.key = bytes("other")
        #expect(changed.key == bytes("other"))
        #expect(changed == ProducerRecord(topic: "t", key: "other", value: bytes("v")))
    }
}

@Suite("Packed records on Tansu", .serialized)
struct RecordPackTansuTests {
    @Test("a packing producer puts each key where the partitioner would, in order; consumers hand out the parts")
    func packsKeepPartitionAndOrder() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("packed")
        let admin = KafkaAdminConfiguration(brokers: [broker.bootstrap])
        _ = try await KafkaAdmin.createTopics([TopicSpec(name: topic, partitions: 3)], configuration: admin)

        var configuration = KafkaProducerConfiguration(brokers: [broker.bootstrap], clientID: "herald-test")
        configuration.packTopics = [topic]
        configuration.packMaxRecords = 25
        let packing = try KafkaProducer(configuration: configuration, logger: testLogger("test.producer"))
        let plain = try producer(broker.bootstrap)

        // Until the producer has read the topic's partition count its records go unpacked; each round is checked.
        var sent: [(key: String, value: String)] = []
        var packedRounds = 0
        for round in 0..<40 where packedRounds < 2 {
            let records = (0..<100).map { i in
                ProducerRecord(topic: topic, key: "user-\(i % 10)", value: bytes("r\(round)-\(i)"))
            }
            let reports = try await packing.send(records)
            #expect(reports.count == 100 && reports.allSatisfy(\.isDelivered))
            sent += (0..<100).map { i in (key: "user-\(i % 10)", value: "r\(round)-\(i)") }
            var perKafkaRecord: [String: Int] = [:]
            for report in reports { perKafkaRecord["\(report.partition)/\(report.offset ?? -1)", default: 0] += 1 }
            if perKafkaRecord.count < 100 {
                packedRounds += 1
                #expect(perKafkaRecord.values.allSatisfy { $0 <= 25 }, "at most 25 records per pack: \(perKafkaRecord)")
            } else {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(packedRounds == 2, "the producer packed once it knew the partition count")
        // Then one unpacked record per key from a producer that does not pack: the same partitions, after the packs.
        let tail = (0..<10).map { ProducerRecord(topic: topic, key: "user-\($0)", value: bytes("tail-\($0)")) }
        try await plain.sendAll(tail)
        sent += (0..<10).map { (key: "user-\($0)", value: "tail-\($0)") }

        let group = uniqueName("g")
        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic], batchSize: 70),
            logger: testLogger("test.consumer"))
        let batches = try await collectBatches(consumer, count: sent.count)
        let got = batches.flatMap { $0 }
        #expect(got.count == sent.count)
        // A batch holds at most batchSize records, and a pack (25 parts at most, fewer than 70) is never split
        // between two batches.
        #expect(batches.allSatisfy { $0.count <= 70 }, "batch sizes \(batches.map(\.count))")
        for batch in batches {
            if let first = batch.first, first.part != 0 { Issue.record("a batch starts inside a pack: \(first.part)") }
            if let last = batch.last, last.part != last.parts - 1 { Issue.record("a batch ends inside a pack") }
        }
        for k in 0..<10 {
            let key = "user-\(k)"
            let ofKey = got.filter { $0.key == bytes(key) }
            #expect(Set(ofKey.map(\.partition)).count == 1, "\(key) stays in one partition, packed or not")
            #expect(
                ofKey.map { String(decoding: $0.value ?? [], as: UTF8.self) }
                    == sent.filter { $0.key == key }.map(\.value),
                "\(key)'s records arrive in the order sent")
        }
        #expect(got.contains { $0.parts > 1 }, "parts of packs are handed out as records")

        // Complete everything but one part of one pack: the committed offset stops at that pack.
        guard let held = got.first(where: { $0.parts > 1 && $0.part == 1 }) else {
            Issue.record("no pack consumed")
            return
        }
        consumer.complete(got.filter { $0 != held })
        try await consumer.commit()
        let tp = TopicPartition(topic: topic, partition: held.partition)
        #expect(try await consumer.committed([tp])[tp] == held.offset, "an incomplete pack is not committed past")
        await consumer.shutdown()

        // A new member of the group gets the whole pack again, every part of it.
        let again = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("test.consumer"))
        let redelivered = try await collect(again, count: held.parts)
        let fromPack = redelivered.filter { $0.partition == held.partition && $0.offset == held.offset }
        #expect(fromPack.count == held.parts)
        #expect(fromPack.map(\.part) == Array(0..<held.parts))
        await again.shutdown()
        try await packing.shutdown()
        try await plain.shutdown()
    }

    @Test("a record too large to pack goes alone, after the pack before it and before the next")
    func largeRecordKeepsOrder() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let topic = uniqueName("packed-large")
        let admin = KafkaAdminConfiguration(brokers: [broker.bootstrap])
        _ = try await KafkaAdmin.createTopics([TopicSpec(name: topic, partitions: 1)], configuration: admin)
        var configuration = KafkaProducerConfiguration(brokers: [broker.bootstrap], clientID: "herald-test")
        configuration.packTopics = [topic]
        configuration.packMaxBytes = 1024
        let packing = try KafkaProducer(configuration: configuration, logger: testLogger("test.producer"))
        let large = String(repeating: "L", count: 700)
        let values = ["a", "b", large, "c", "d", "e"]
        var reports: [DeliveryReport] = []
        var sent = 0
        let deadline = ContinuousClock.now + .seconds(15)
        repeat {
            reports = try await packing.send(values.map { ProducerRecord(topic: topic, key: "k", value: bytes($0)) })
            sent += values.count
            if Set(reports.map(\.offset)).count < values.count { break }
            try await Task.sleep(for: .milliseconds(100))
        } while ContinuousClock.now < deadline
        // a and b in one pack, the large record alone, c, d and e in the next pack.
        let offsets = reports.map { $0.offset ?? -1 }
        #expect(offsets[0] == offsets[1] && offsets[1] < offsets[2] && offsets[2] < offsets[3])
        #expect(offsets[3] == offsets[4] && offsets[4] == offsets[5])

        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: uniqueName("g"), topics: [topic]),
            logger: testLogger("test.consumer"))
        let got = try await collect(consumer, count: sent)
        let last = got.suffix(values.count).map { String(decoding: $0.value ?? [], as: UTF8.self) }
        #expect(last == values, "the last call's records arrive in the order sent")
        await consumer.shutdown()
        try await packing.shutdown()
    }
}

@Suite("Packed records are unpacked only on Herald's own topics")
struct PackedTopicsTests {
    @Test(
        "a record that reads as a pack is handed out whole on a topic outside packedTopics, and as its parts inside")
    func externalTopicsAreNeverUnpacked() async throws {
        let cluster = try MockCluster(brokers: 1)
        let external = uniqueName("chat.events")
        let own = uniqueName("herald.ingested")
        cluster.createTopic(external, partitions: 1, replication: 1)
        cluster.createTopic(own, partitions: 1, replication: 1)
        // 1,000 empty parts in a few bytes: an external producer's record that happens to parse as a pack.
        let lookalike = RecordPack.encode(Array(repeating: RecordPack.Part(key: nil, value: []), count: 1000))
        let producer = try producer(cluster.bootstrap)
        try await producer.sendAll([
            ProducerRecord(topic: external, key: "k", value: lookalike),
            ProducerRecord(topic: own, key: "k", value: lookalike),
        ])
        var config = consumerConfig(
            cluster.bootstrap, group: uniqueName("g"), topics: [external, own], batchSize: 2000)
        config.packedTopics = [own]
        let consumer = try KafkaConsumer(configuration: config, logger: testLogger("packed-topics"))
        let records = try await collect(consumer, count: 1001)
        #expect(records.filter { $0.topic == external }.map(\.value) == [lookalike], "one record, as it was sent")
        #expect(records.filter { $0.topic == own }.count == 1000, "Herald's own topic: the pack's parts")
        await consumer.shutdown()
        try await producer.shutdown()
    }
}
