// Headers of packed records (`PackHeaders`): the format, what is ignored, and on librdkafka's mock cluster that
// records with trace headers are packed and each part gets its own headers back.

import Foundation
import HeraldKafka
import Testing

@Suite("Headers of packed records")
struct PackHeadersTests {
    static let parent = KafkaHeader(
        key: "traceparent", string: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    static let state = KafkaHeader(key: "tracestate", string: "congo=t61rcWkgMzE")

    @Test("each part's headers, values absent or empty, survive a round trip")
    func roundTrip() throws {
        let entries: [(part: Int, headers: [KafkaHeader])] = [
            (0, [Self.parent, Self.state]),
            (3, [Self.parent, KafkaHeader(key: "empty", value: []), KafkaHeader(key: "none", value: nil)]),
            (200, [KafkaHeader(key: "", string: "x")]),
        ]
        let encoded = PackHeaders.encode(entries)
        #expect(encoded.first == 1)
        let decoded = try #require(PackHeaders.decode(encoded, parts: 201))
        #expect(decoded.count == 3)
        #expect(decoded[0] == [Self.parent, Self.state])
        #expect(decoded[3] == entries[1].headers && decoded[200] == entries[2].headers)
        #expect(decoded[1] == nil)
    }

    @Test("a value that is not whole, names a part the pack lacks, or repeats a part is ignored")
    func invalid() {
        let valid = PackHeaders.encode([(part: 1, headers: [Self.parent]), (part: 2, headers: [Self.state])])
        #expect(PackHeaders.decode(valid, parts: 3) != nil)
        #expect(PackHeaders.decode(valid, parts: 2) == nil, "part 2 of a 2-part pack")
        for cut in 0..<valid.count {
            #expect(PackHeaders.decode(Array(valid.prefix(cut)), parts: 3) == nil, "cut at \(cut)")
        }
        #expect(PackHeaders.decode(valid + [0], parts: 3) == nil, "a trailing byte")
        var version = valid
        version[0] = 2
        #expect(PackHeaders.decode(version, parts: 3) == nil, "another format version")
        let descending = PackHeaders.encode([(part: 2, headers: [Self.parent]), (part: 1, headers: [Self.state])])
        #expect(PackHeaders.decode(descending, parts: 3) == nil)
        let repeated = PackHeaders.encode([(part: 1, headers: [Self.parent]), (part: 1, headers: [Self.state])])
        #expect(PackHeaders.decode(repeated, parts: 3) == nil)
        #expect(PackHeaders.decode([1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], parts: 3) == nil)
        #expect(PackHeaders.decode([UInt8](repeating: 0xFF, count: 64), parts: 3) == nil)
    }

    /// Sends `records` (one key, one partition) until the packing producer knows the partition count and packs
    /// them; returns their delivery reports.
    static func sendPacked(_ producer: KafkaProducer, _ records: [ProducerRecord]) async throws -> [DeliveryReport] {
        var reports: [DeliveryReport] = []
        try await eventually("the producer packs") {
            reports = try await producer.send(records)
            return Set(reports.map(\.offset)).count < records.count
        }
        return reports
    }

    /// What `consumer` hands out up to the last part of the Kafka record at `offset` (the earlier rounds of
    /// `sendPacked` included).
    static func collectThrough(_ consumer: KafkaConsumer, offset: Int64) async throws -> [ConsumerRecord] {
        var got: [ConsumerRecord] = []
        try await eventually("the records up to offset \(offset) are consumed") {
            if let batch = try await consumer.nextBatch() { got += batch }
            return got.contains { $0.offset == offset && $0.part == $0.parts - 1 }
        }
        return got
    }

    @Test("traced records are packed with untraced ones; each part comes out with its own headers")
    func packedWithTheirHeaders() async throws {
        let cluster = try MockCluster(brokers: 1)
        let topic = uniqueName("herald.resolved")
        cluster.createTopic(topic, partitions: 1, replication: 1)
        var configuration = KafkaProducerConfiguration(brokers: [cluster.bootstrap], clientID: "herald-test")
        configuration.packTopics = [topic]
        let packing = try KafkaProducer(configuration: configuration, logger: testLogger("test.producer"))

        let other = KafkaHeader(key: "x-other", string: "v")
        let records = [
            ProducerRecord(topic: topic, key: "k", value: bytes("plain-1")),
            ProducerRecord(topic: topic, key: "k", value: bytes("traced-1"), headers: [Self.parent, Self.state]),
            ProducerRecord(topic: topic, key: "k", value: bytes("plain-2")),
            ProducerRecord(topic: topic, key: "k", value: bytes("traced-2"), headers: [Self.parent]),
            // Another header is not packable: alone, between two packs.
            ProducerRecord(topic: topic, key: "k", value: bytes("other"), headers: [other]),
            ProducerRecord(topic: topic, key: "k", value: bytes("plain-3")),
            ProducerRecord(topic: topic, key: "k", value: bytes("plain-4")),
        ]
        let reports = try await Self.sendPacked(packing, records)
        let offsets = reports.map { $0.offset ?? -1 }
        #expect(Set(offsets[0..<4]).count == 1, "the four first records in one pack: \(offsets)")
        #expect(offsets[3] < offsets[4] && offsets[4] < offsets[5] && offsets[5] == offsets[6], "\(offsets)")

        // Herald's consumer: each part with its own headers.
        var unpacking = consumerConfig(cluster.bootstrap, group: uniqueName("g"), topics: [topic])
        unpacking.packedTopics = [topic]
        let consumer = try KafkaConsumer(configuration: unpacking, logger: testLogger("test.consumer"))
        let got = try await Self.collectThrough(consumer, offset: offsets[6]).filter { $0.offset >= offsets[0] }
        await consumer.shutdown()
        let byValue = Dictionary(got.map { (String(decoding: $0.value ?? [], as: UTF8.self), $0) }) { a, _ in a }
        #expect(byValue["traced-1"]?.headers == [Self.parent, Self.state])
        #expect(byValue["traced-2"]?.headers == [Self.parent])
        #expect(byValue["plain-1"]?.headers == [] && byValue["plain-2"]?.headers == [])
        #expect(byValue["plain-3"]?.headers == [] && byValue["plain-4"]?.headers == [])
        #expect(byValue["other"]?.headers == [other] && byValue["other"]?.parts == 1)
        #expect(byValue["traced-1"]?.parts == 4 && byValue["traced-1"]?.part == 1)

        // The Kafka records themselves: only the pack with traced parts has the header.
        var raw = consumerConfig(cluster.bootstrap, group: uniqueName("g"), topics: [topic])
        raw.packedTopics = []
        let reader = try KafkaConsumer(configuration: raw, logger: testLogger("test.consumer"))
        let kafkaRecords = try await Self.collectThrough(reader, offset: offsets[6]).filter { $0.offset >= offsets[0] }
        await reader.shutdown()
        let packs = Dictionary(kafkaRecords.map { ($0.offset, $0.headers.map(\.key)) }) { a, _ in a }
        #expect(packs[offsets[0]] == [PackHeaders.headerKey])
        #expect(packs[offsets[4]] == ["x-other"])
        #expect(packs[offsets[5]] == [], "a pack without traced parts carries no header")
        try await packing.shutdown()
    }

    @Test("a pack whose parts' header is broken is handed out whole, its parts without headers")
    func brokenHeaderIgnored() async throws {
        let cluster = try MockCluster(brokers: 1)
        let topic = uniqueName("herald.resolved")
        cluster.createTopic(topic, partitions: 1, replication: 1)
        let pack = RecordPack.encode([
            RecordPack.Part(key: bytes("k"), value: bytes("a")), RecordPack.Part(key: bytes("k"), value: bytes("b")),
        ])
        let broken = PackHeaders.encode([(part: 5, headers: [Self.parent])])  // part 5 of a 2-part pack
        let plain = try producer(cluster.bootstrap)
        try await plain.sendAll([
            ProducerRecord(
                topic: topic, key: "k", value: pack, headers: [KafkaHeader(key: PackHeaders.headerKey, value: broken)])
        ])
        var configuration = consumerConfig(cluster.bootstrap, group: uniqueName("g"), topics: [topic])
        configuration.packedTopics = [topic]
        let consumer = try KafkaConsumer(configuration: configuration, logger: testLogger("test.consumer"))
        let got = try await collect(consumer, count: 2)
        await consumer.shutdown()
        #expect(got.map { String(decoding: $0.value ?? [], as: UTF8.self) } == ["a", "b"])
        #expect(got.allSatisfy { $0.headers.isEmpty })
        try await plain.shutdown()
    }
}
