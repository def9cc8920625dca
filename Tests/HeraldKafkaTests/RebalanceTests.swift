import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

/// What a scale event does to a stage's group, on librdkafka's mock cluster (three brokers, a group coordinator
/// that recovers from churn): under the cooperative protocol only the partitions that move are revoked, what was
/// completed is committed before they go, what was in flight is redelivered to the new owner, and the partitions
/// that stay keep their position.
@Suite("Rebalancing", .serialized)
struct RebalanceTests {
    /// Four partitions of ten records each, in a fresh group's topic on a fresh mock cluster.
    struct Setup {
        let cluster: MockCluster
        let topic = uniqueName("scale")
        let group = uniqueName("g")
        let producer: KafkaProducer
        var partitions: [TopicPartition] { (0..<4).map { TopicPartition(topic: topic, partition: Int32($0)) } }

        init() async throws {
            cluster = try MockCluster(brokers: 3)
            cluster.createTopic(topic, partitions: 4)
            producer = try HeraldKafkaTests.producer(cluster.bootstrap)
            try await produce(offsetsPerPartition: 10)
        }

        func produce(offsetsPerPartition n: Int) async throws {
            for p in 0..<4 {
                try await producer.sendAll(
                    (0..<n).map {
                        ProducerRecord(topic: topic, key: "k", value: bytes("p\(p)-\($0)"), partition: Int32(p))
                    })
            }
        }

        func consumer(_ name: String, _ protocol: RebalanceProtocol, drain: Duration) throws -> KafkaConsumer {
            var config = consumerConfig(cluster.bootstrap, group: group, topics: [topic])
            // Longer than the suite's usual 3 s: a member whose heartbeats a loaded host delays past its session
            // loses its partitions without a commit, which is not what these tests are about. (The mock cluster
            // ends each join round a second before the session timeout, so each round takes about 5 s.)
            config.sessionTimeout = .seconds(6)
            config.rebalance = `protocol`
            config.revokeDrainTimeout = drain
            config.autoCommitInterval = .seconds(600)  // only revokes and shutdowns commit
            return try KafkaConsumer(configuration: config, logger: testLogger(name))
        }
    }

    @Test(
        "a member joining revokes only the partitions that move (cooperative) or all of them (eager); completed work is committed first, in-flight work is redelivered to the new owner",
        arguments: [RebalanceProtocol.cooperative, .eager])
    func scaleOut(_ protocol: RebalanceProtocol) async throws {
        let setup = try await Setup()
        let a = try setup.consumer("a", `protocol`, drain: .milliseconds(200))
        let first = try await collect(a, count: 40)
        #expect(first.count == 40)
        // Offsets 0-8 of every partition done; offset 9 of each still in flight at A when B joins.
        a.complete(first.filter { $0.offset < 9 })

        let b = try setup.consumer("b", `protocol`, drain: .milliseconds(200))
        try await eventually("two partitions each") { a.assignment.count == 2 && b.assignment.count == 2 }
        let moved = Set(b.assignment)
        let kept = Set(a.assignment)
        guard `protocol` == .cooperative else {
            // Eager stops the whole group: everything was taken from A, the partitions it got back included. (On the
            // mock cluster the commit of an eager revoke is also refused, REBALANCE_IN_PROGRESS: the group is
            // already joining, so A's finished work is redone as well.)
            #expect(Set(a.revokedPartitions) == Set(setup.partitions), "eager revokes the whole assignment")
            await a.shutdown()
            await b.shutdown()
            try await setup.producer.shutdown()
            return
        }
        #expect(Set(a.revokedPartitions) == moved, "only what moved to B was revoked from A")
        #expect(a.revokedPartitions.count == 2)
        let committed = try await a.committed(setup.partitions)
        // The broker may refuse the revoke's commit when the group has begun another round meanwhile (a loaded
        // host slows a member's join; REBALANCE_IN_PROGRESS). The consumer then says so, and the new owner does
        // the work again from the last commit (here: none): at least once, nothing lost.
        let refused = a.revokeCommitsFailed > 0
        for tp in moved {
            if refused {
                #expect(committed[tp] ?? -1 < 0, "nothing committed for \(tp) after a refused commit")
            } else {
                #expect(committed[tp] == 9, "what A finished was committed before \(tp) moved")
            }
        }

        // B starts at the committed offsets: each moved partition's record 9 (in flight at A), nothing earlier;
        // or, after a refused commit, everything from the start.
        let atB = try await collect(b, count: refused ? 20 : 2)
        let expectedOffsets: [Int64] = refused ? Array(0...9) : [9]
        for tp in moved {
            #expect(atB.filter { $0.topicPartition == tp }.map(\.offset) == expectedOffsets, "at B: \(tp)")
        }
        #expect(Set(atB.map(\.topicPartition)) == moved)
        // A completing its copy of a moved partition's record changes nothing now.
        a.complete(first.filter { $0.offset == 9 && moved.contains($0.topicPartition) })

        // The partitions A kept were never stopped: they go on from where they were (offset 10), nothing again.
        try await setup.produce(offsetsPerPartition: 1)
        let atA = try await collect(a, count: 2)
        #expect(atA.map(\.offset) == [10, 10])
        #expect(Set(atA.map(\.topicPartition)) == kept)
        await a.shutdown()
        await b.shutdown()
        try await setup.producer.shutdown()
    }

    @Test("a revoke waits for the records the caller holds: completed in time, they are committed and not redelivered")
    func revokeDrainsInFlight() async throws {
        let setup = try await Setup()
        let a = try setup.consumer("a", .cooperative, drain: .seconds(120))
        let first = try await collect(a, count: 40)
        #expect(first.count == 40)
        a.complete(first.filter { $0.offset < 9 })

        let b = try setup.consumer("b", .cooperative, drain: .seconds(120))
        try await eventually("A hands two partitions over") { a.isHandingOver }
        #expect(b.assignment.isEmpty, "B gets nothing while A still finishes its work")
        a.complete(first.filter { $0.offset == 9 })
        try await eventually("two partitions each") { a.assignment.count == 2 && b.assignment.count == 2 }
        let moved = b.assignment
        let committed = try await b.committed(moved)
        // As above: a broker that refused the revoke's commit (another round begun meanwhile, on a loaded host) makes
        // B start from the last commit (none), and the consumer says so; at least once, nothing lost.
        let refused = a.revokeCommitsFailed > 0
        if refused {
            #expect(moved.allSatisfy { (committed[$0] ?? -1) < 0 }, "nothing committed after a refused commit")
        } else {
            #expect(moved.map { committed[$0] } == [10, 10])
        }

        try await setup.produce(offsetsPerPartition: 1)
        let atB = try await collect(b, count: refused ? 22 : 2)
        let expectedOffsets: [Int64] = refused ? Array(0...10) : [10]
        for tp in moved {
            #expect(
                atB.filter { $0.topicPartition == tp }.map(\.offset) == expectedOffsets,
                "nothing A finished is processed again unless its commit was refused: \(tp)")
        }
        await a.shutdown()
        await b.shutdown()
        try await setup.producer.shutdown()
    }

    @Test(
        "more members than partitions: every member joins (an empty assignment counts), and a leaving member's partitions move"
    )
    func moreMembersThanPartitions() async throws {
        let setup = try await Setup()
        var members: [KafkaConsumer] = []
        for index in 0..<5 {
            members.append(try setup.consumer("m\(index)", .cooperative, drain: .milliseconds(200)))
        }
        try await eventually("all five joined, four partitions owned once") {
            members.allSatisfy(\.hasJoinedGroup)
                && members.flatMap(\.assignment).sorted { $0.partition < $1.partition } == setup.partitions
        }
        // The member holding partition 0 leaves; another member takes it over.
        let leaving = try #require(members.firstIndex { $0.assignment.contains(setup.partitions[0]) })
        await members[leaving].shutdown()
        let rest = members.indices.filter { $0 != leaving }.map { members[$0] }
        try await eventually("partition 0 taken over") {
            rest.flatMap(\.assignment).sorted { $0.partition < $1.partition } == setup.partitions
        }
        for member in rest { await member.shutdown() }
        try await setup.producer.shutdown()
    }
}
