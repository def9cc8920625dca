import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

/// herald-dev-broker (librdkafka's mock cluster on fixed loopback ports, with a control API), started for each test
/// from the built executable (`swift build --product herald-dev-broker`, or `$HERALD_BIN_DIR`).
@Suite("herald-dev-broker", .serialized)
struct DevBrokerTests {
    /// `count` records keyed over 40 keys, each value unique ("<prefix>-<i>").
    private func records(_ topic: String, _ prefix: String, _ count: Int) -> [ProducerRecord] {
        (0..<count).map { ProducerRecord(topic: topic, key: "conv-\($0 % 40)", value: bytes("\(prefix)-\($0)")) }
    }

    private func values(_ got: [ConsumerRecord]) -> [String] {
        got.map { String(decoding: $0.value ?? [], as: UTF8.self) }
    }

    @Test("records go through a consumer group on the fixed ports, and a restarted broker serves the same addresses")
    func roundTripOnFixedPorts() async throws {
        let topic = uniqueName("fixed")
        let broker = try await DevBroker.start(topics: [(topic, 4)])
        defer { broker.stop() }
        let states = try await broker.brokerStates()
        #expect(states.map(\.id) == [1, 2, 3])
        #expect(states.map(\.port) == broker.ports, "broker i listens on port + i - 1")
        #expect(states.allSatisfy { $0.up })

        let sender = try producer(broker.bootstrap)
        let reports = try await sender.send(records(topic, "a", 200))
        #expect(reports.allSatisfy { $0.isDelivered })
        #expect(Set(reports.map(\.partition)) == [0, 1, 2, 3])
        let group = uniqueName("g")
        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("dev.consumer"))
        let got = try await collect(consumer, count: 200)
        #expect(Set(values(got)) == Set((0..<200).map { "a-\($0)" }) && got.count == 200)
        consumer.complete(got)
        await consumer.shutdown()

        // Stopped and started again: the same addresses take clients again, and the producer that was connected
        // carries on (the cluster itself starts empty, but for the start-up topics).
        broker.stop()
        #expect(broker.ports.allSatisfy { !portAcceptsConnections($0) })
        try await broker.restart()
        #expect(broker.ports.allSatisfy { portAcceptsConnections($0) })
        let reportsAgain = try await sender.send(records(topic, "b", 50))
        #expect(
            reportsAgain.allSatisfy { $0.isDelivered },
            "\(reportsAgain.compactMap(\.error).first.map { "\($0)" } ?? "")")
        let consumerAgain = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("dev.consumer"))
        let gotAgain = try await collect(consumerAgain, count: 50)
        #expect(Set(values(gotAgain)) == Set((0..<50).map { "b-\($0)" }) && gotAgain.count == 50)
        await consumerAgain.shutdown()
        try await sender.shutdown()
    }

    @Test("after members joined and left in turn, a last member alone is assigned every partition and reads them")
    func groupChurn() async throws {
        let topic = uniqueName("churn")
        let broker = try await DevBroker.start(topics: [(topic, 4)])
        defer { broker.stop() }
        let group = uniqueName("g")
        func member() throws -> KafkaConsumer {
            try KafkaConsumer(
                configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
                logger: testLogger("dev.churn"))
        }
        // Eight members, one joining every 700 ms, each leaving after three more joined (an autoscaler and a
        // rolling update at once). The pacing is the churn itself, not a wait for an outcome.
        var members: [KafkaConsumer] = []
        for _ in 0..<8 {
            members.append(try member())
            try await Task.sleep(for: .milliseconds(700))
            if members.count > 3 { await members.removeFirst().shutdown() }
        }
        for m in members { await m.shutdown() }

        let last = try member()
        try await eventually("the last member is assigned all 4 partitions") { last.assignment.count == 4 }
        #expect(Set(last.assignment.map(\.partition)) == [0, 1, 2, 3])
        let producer = try producer(broker.bootstrap)
        try await producer.sendAll(
            (Int32(0)..<4).map { partition in
                ProducerRecord(topic: topic, key: nil as String?, value: bytes("p\(partition)"), partition: partition)
            })
        let got = try await collect(last, count: 4)
        #expect(Set(got.map(\.partition)) == [0, 1, 2, 3])
        await last.shutdown()
        try await producer.shutdown()
    }

    @Test("a broker taken down hands its partitions and its group to the others: nothing produced is lost")
    func brokerDown() async throws {
        let topic = uniqueName("down")
        let broker = try await DevBroker.start(topics: [(topic, 6)])
        defer { broker.stop() }
        // Partition p led by broker p % 3 + 1: broker 2 leads partitions 1 and 4.
        for p: Int32 in 0..<6 { try await broker.moveLeader(topic: topic, partition: p, to: p % 3 + 1) }
        // The group is coordinated by broker 2 too, so taking it down must move the coordinator as well.
        let group = uniqueName("g")
        try await broker.pinCoordinator(group: group, to: 2)
        let consumer = try KafkaConsumer(
            configuration: consumerConfig(broker.bootstrap, group: group, topics: [topic]),
            logger: testLogger("dev.down"))
        let producer = try producer(broker.bootstrap)
        let first = try await producer.send(records(topic, "before", 300))
        #expect(first.allSatisfy { $0.isDelivered })
        var got = try await collect(consumer, count: 300)
        consumer.complete(got)

        let down = try await broker.setDown(broker: 2, groups: [group])
        #expect(Set(down.moved.map(\.partition)) == [1, 4])
        #expect(down.moved.allSatisfy { $0.from == 2 && $0.to != 2 })
        let states = try await broker.brokerStates()
        #expect(states.map(\.up) == [true, false, true])
        #expect(states[1].leads == [], "broker 2 leads nothing once down")
        #expect(!portAcceptsConnections(broker.ports[1]))
        #expect(down.groupsMoved[group].map { $0 != 2 } == true, "the group's coordinator moved: \(down.groupsMoved)")
        #expect(try await broker.coordinator(ofGroup: group) == down.groupsMoved[group])

        // The same producer and consumer carry on against brokers 1 and 3.
        let second = try await producer.send(records(topic, "after", 300))
        #expect(second.allSatisfy { $0.isDelivered }, "\(second.compactMap(\.error).first.map { "\($0)" } ?? "")")
        #expect(Set(second.map(\.partition)).isSuperset(of: [1, 4]))
        got += try await collect(consumer, count: 300)
        let expected = Set((0..<300).map { "before-\($0)" } + (0..<300).map { "after-\($0)" })
        #expect(Set(values(got)) == expected, "missing: \(expected.subtracting(values(got)).sorted().prefix(5))")

        try await broker.setUp(broker: 2)
        #expect(try await broker.brokerStates().map(\.up) == [true, true, true])
        await consumer.shutdown()
        try await producer.shutdown()
    }

    @Test("the control API answers every route and refuses bad requests with a reason")
    func controlAPI() async throws {
        let broker = try await DevBroker.start()
        defer { broker.stop() }
        let health = try await TestHTTP.request(port: broker.controlPort, method: "GET", path: "/healthz")
        #expect(health.status == 200 && health.body == "ok\n")

        let topic = uniqueName("api")
        let created = try await broker.control("POST", "/topics?name=\(topic)&partitions=5")
        #expect(created.contains("\"created\":true"))
        let again = try await broker.control("POST", "/topics?name=\(topic)&partitions=5")
        #expect(again.contains("\"created\":false"))
        #expect(try await broker.control("GET", "/topics").contains("\"\(topic)\":5"))
        let counts = try await KafkaAdmin.partitionCounts(
            [topic], configuration: KafkaAdminConfiguration(brokers: broker.brokers))
        #expect(counts[topic] == 5, "a Kafka client sees the topic")

        try await broker.moveLeader(topic: topic, partition: 3, to: 3)
        #expect(try await broker.brokerStates()[2].leads?.contains("\(topic)/3") == true)

        let group = uniqueName("g")
        #expect((1...3).contains(try await broker.coordinator(ofGroup: group)))
        try await broker.pinCoordinator(group: group, to: 2)
        #expect(try await broker.coordinator(ofGroup: group) == 2)

        try await broker.setDown(broker: 3)
        let refusals: [(String, String, Int)] = [
            ("GET", "/nowhere", 404),
            ("POST", "/brokers/9/down", 404),
            ("POST", "/brokers/3/down", 409),
            ("POST", "/topics?name=\(topic)", 400),
            ("POST", "/topics?partitions=2", 400),
            ("POST", "/partitions/leader?topic=\(topic)&partition=0", 400),
            ("POST", "/partitions/leader?topic=\(topic)&partition=0&broker=3", 409),
            ("POST", "/partitions/leader?topic=no-such-topic&partition=0&broker=1", 404),
            ("POST", "/groups/\(group)/coordinator", 400),
        ]
        for (method, path, status) in refusals {
            let answer = try await TestHTTP.request(port: broker.controlPort, method: method, path: path)
            #expect(answer.status == status, "\(method) \(path): \(answer.status) \(answer.body)")
            #expect(answer.json?["error"] is String, "\(method) \(path) says why")
        }
        try await broker.setUp(broker: 3)
        #expect(try await broker.brokerStates().allSatisfy { $0.up })
        // One log line per request: 12 above and the refusals (a line is written once its answer went out).
        try await eventually("one log line per request") {
            broker.process.logTail(200).split(separator: "\n").filter { $0.contains("\"msg\":\"request\"") }.count
                == 12 + refusals.count
        }
    }
}
