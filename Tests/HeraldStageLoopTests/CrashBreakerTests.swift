// The crash-loop breaker's decisions over a store in memory: what it notes, when it clears, and how it handles the
// records of a batch that was in flight at one crash, or two. The real trap is in EndToEndTests (CrashBreakerTests).
import Foundation
import HeraldRedis
import HeraldStage
import HeraldTestSupport
import Logging
import Synchronization
import Testing

@testable import HeraldKafka

/// Notes in memory, like Redis's hashes: partition -> field -> value.
final class MemoryCrashNotes: CrashNoteStore {
    let notes = Mutex<[TopicPartition: [String: String]]>([:])

    func take(_ partitions: [TopicPartition]) async throws -> [TopicPartition: CrashNote] {
        notes.withLock { all in
            var found: [TopicPartition: CrashNote] = [:]
            for tp in partitions {
                guard let fields = all.removeValue(forKey: tp) else { continue }
                var note = CrashNote()
                for (field, value) in fields {
                    if field == "r" {
                        let parts = value.split(separator: ":").compactMap { Int64($0) }
                        note.alone = CrashBreaker.RecordID(partition: tp, offset: parts[0], part: Int(parts[1]))
                    } else {
                        let bounds = value.split(separator: "-").compactMap { Int64($0) }
                        note.batches.append(bounds[0]...bounds[1])
                    }
                }
                if !note.batches.isEmpty || note.alone != nil { found[tp] = note }
            }
            return found
        }
    }

    func apply(_ writes: [CrashNoteWrite]) async throws {
        notes.withLock { all in
            for write in writes {
                switch write {
                case .batch(let tp, let id, let offsets):
                    all[tp, default: [:]]["b:" + id] = "\(offsets.lowerBound)-\(offsets.upperBound)"
                case .clearBatch(let tp, let id):
                    all[tp]?["b:" + id] = nil
                case .alone(let rid):
                    all[rid.partition, default: [:]]["r"] = "\(rid.offset):\(rid.part)"
                case .clearAlone(let tp):
                    all[tp]?["r"] = nil
                }
                if all.values.contains(where: \.isEmpty) { all = all.filter { !$0.value.isEmpty } }
            }
        }
    }

    var snapshot: [TopicPartition: [String: String]] { notes.withLock { $0 } }
}

@Suite("Crash-loop breaker decisions")
struct CrashBreakerDecisionTests {
    static let tp = TopicPartition(topic: "chat.events", partition: 2)

    static func records(_ offsets: ClosedRange<Int64>) -> [ConsumerRecord] {
        offsets.map { ConsumerRecord(topic: tp.topic, partition: tp.partition, offset: $0, key: nil, value: [1]) }
    }

    static func breaker(_ store: MemoryCrashNotes) -> CrashBreaker {
        var logger = Logger(label: "breaker-test")
        logger.logLevel = .critical
        return CrashBreaker(store: store, metrics: StageMetrics(stage: "ingest"), logger: logger)
    }

    @Test("a batch is noted before processing and the note is cleared once it completed")
    func notesAndClears() async {
        let store = MemoryCrashNotes()
        let breaker = Self.breaker(store)
        let plan = await breaker.begin(Self.records(10...14))
        #expect(plan.isPlain)
        let fields = store.snapshot[Self.tp] ?? [:]
        #expect(fields.count == 1)
        #expect(fields.first?.key.hasPrefix("b:") == true)
        #expect(fields.first?.value == "10-14")
        await breaker.end(plan, alone: nil)
        #expect(store.snapshot.isEmpty)
    }

    @Test("a batch in flight at a crash is processed again one record at a time, up to its last offset")
    func rerunsAlone() async {
        let store = MemoryCrashNotes()
        // A process died with 10-12 in flight.
        let crashed = await Self.breaker(store).begin(Self.records(10...12))
        #expect(crashed.isPlain)
        let breaker = Self.breaker(store)
        let plan = await breaker.begin(Self.records(10...14))
        #expect(plan.dispositions == [.alone, .alone, .alone, .batch, .batch])
        // Noted again for the next crash, and read only once.
        await breaker.noteAlone(Self.records(11...11)[0], previous: nil)
        #expect(store.snapshot[Self.tp]?["r"] == "11:0")
        let later = await breaker.begin(Self.records(15...16))
        #expect(later.isPlain)
    }

    @Test("a partition assigned again (a rebalance) has its notes taken again: another member's crash is found")
    func takesAgainOnNewAssignment() async throws {
        let store = MemoryCrashNotes()
        let breaker = Self.breaker(store)
        func records(_ offsets: ClosedRange<Int64>, assignment: UInt64) -> [ConsumerRecord] {
            offsets.map {
                ConsumerRecord(
                    topic: Self.tp.topic, partition: Self.tp.partition, offset: $0, key: nil, value: [1], headers: [],
                    timestamp: nil, epoch: assignment)
            }
        }
        await breaker.end(await breaker.begin(records(10...12, assignment: 1)), alone: nil)
        // The partition went to another member, which died with 13-15 in flight; then it comes back here.
        try await store.apply([.batch(Self.tp, id: "other.4", offsets: 13...15)])
        #expect(await breaker.begin(records(13...15, assignment: 1)).isPlain)  // same assignment: not read again
        let plan = await breaker.begin(records(13...16, assignment: 2))
        #expect(plan.dispositions == [.alone, .alone, .alone, .batch])
    }

    @Test("a record in flight alone at a crash (the second in a row) is dead-lettered; the others are processed alone")
    func deadLettersAfterTwoCrashes() async {
        let store = MemoryCrashNotes()
        _ = await Self.breaker(store).begin(Self.records(10...12))  // crash 1
        let second = Self.breaker(store)
        _ = await second.begin(Self.records(10...12))
        await second.noteAlone(Self.records(10...10)[0], previous: nil)
        await second.noteAlone(Self.records(11...11)[0], previous: nil)  // crash 2, on offset 11
        let third = Self.breaker(store)
        let plan = await third.begin(Self.records(10...12))
        #expect(plan.dispositions == [.alone, .crashed, .alone])
        // Completed: nothing left for a later start to act on.
        await third.end(plan, alone: Self.tp)
        #expect(store.snapshot.isEmpty)
        let fourth = await Self.breaker(store).begin(Self.records(10...12))
        #expect(fourth.isPlain)
    }
}

// The notes in a real redis-server: the key layout, the TTL, take reads and deletes, and what a batch costs.
@Suite("Crash-loop breaker notes in Redis", .serialized)
struct RedisCrashNotesTests {
    static let a = TopicPartition(topic: "herald.resolved", partition: 0)
    static let b = TopicPartition(topic: "herald.resolved", partition: 3)

    @Test("notes are written under the group's key with a TTL, taken once, and cleared")
    func roundTrip() async throws {
        let server = try await RedisServer.start()
        let connection = RedisConnection(configuration: RedisConfiguration(host: "127.0.0.1", port: server.port))
        defer { connection.close() }
        let notes = RedisCrashNotes(connection: connection, group: "herald-suppress")
        try await notes.apply([
            .batch(Self.a, id: "p1.7", offsets: 100...140), .batch(Self.b, id: "p1.7", offsets: 9...9),
            .alone(CrashBreaker.RecordID(partition: Self.a, offset: 120, part: 3)),
        ])
        let key = "herald:breaker:{herald-suppress}:herald.resolved:0"
        #expect(RedisCrashNotes.key(group: "herald-suppress", partition: Self.a) == key)
        let ttl = try #require(try await connection.send("PTTL", key).int)
        #expect(ttl > 86_000_000 && ttl <= 86_400_000)

        let taken = try await notes.take([Self.a, Self.b, TopicPartition(topic: "herald.resolved", partition: 1)])
        #expect(
            taken[Self.a]
                == CrashNote(
                    batches: [100...140], alone: CrashBreaker.RecordID(partition: Self.a, offset: 120, part: 3)))
        #expect(taken[Self.b] == CrashNote(batches: [9...9]))
        #expect(taken.count == 2)
        #expect(try await notes.take([Self.a, Self.b]).isEmpty)

        try await notes.apply([.batch(Self.a, id: "p2.1", offsets: 1...2)])
        try await notes.apply([.clearBatch(Self.a, id: "p2.1"), .clearAlone(Self.a)])
        #expect(try await connection.send("EXISTS", key).int == 0)
    }

    /// The figure in docs/pipeline.md ("Crash-loop breaker"): `swift test --filter RedisCrashNotesTests` prints it.
    @Test("a batch's note and its clearing, over four partitions: one round trip each")
    func costPerBatch() async throws {
        let server = try await RedisServer.start()
        let connection = RedisConnection(configuration: RedisConfiguration(host: "127.0.0.1", port: server.port))
        defer { connection.close() }
        var logger = Logger(label: "breaker-cost")
        logger.logLevel = .critical
        let breaker = CrashBreaker(
            store: RedisCrashNotes(connection: connection, group: "herald-render"),
            metrics: StageMetrics(stage: "render"), logger: logger)
        let batch = (0..<500).map { i in
            ConsumerRecord(
                topic: "herald.deliverable", partition: Int32(i / 125), offset: Int64(i % 125), key: nil, value: [1])
        }
        await breaker.end(await breaker.begin(batch), alone: nil)  // the first takes the partitions' notes too
        let rounds = 2000
        var begins: [Duration] = []
        var ends: [Duration] = []
        for _ in 0..<rounds {
            let t0 = ContinuousClock.now
            let plan = await breaker.begin(batch)
            let t1 = ContinuousClock.now
            await breaker.end(plan, alone: nil)
            begins.append(t1 - t0)
            ends.append(ContinuousClock.now - t1)
            #expect(plan.isPlain)
        }
        let info = try #require(try await connection.send("INFO", "commandstats").text)
        func calls(_ command: String) -> Int {
            guard let line = info.split(separator: "\r\n").first(where: { $0.hasPrefix("cmdstat_\(command):") }),
                let value = line.split(separator: "=").dropFirst().first?.split(separator: ",").first
            else { return 0 }
            return Int(value) ?? 0
        }
        // Per batch of four partitions: HSET and PEXPIRE per partition before, HDEL per partition after.
        #expect(calls("hset") == 4 * (rounds + 1))
        #expect(calls("pexpire") == 4 * (rounds + 1))
        #expect(calls("hdel") == 4 * (rounds + 1))
        #expect(calls("hgetall") == 4)
        #expect(try await connection.send("DBSIZE").int == 0)
        begins.sort()
        ends.sort()
        print(
            "crash-loop breaker, batch of 500 records over 4 partitions, loopback redis-server: note median \(begins[rounds / 2]), p99 \(begins[rounds * 99 / 100]); clear median \(ends[rounds / 2])"
        )
    }
}
