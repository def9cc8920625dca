import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// The burst scripts give what `Coalescing` gives, message by message and flush by flush; held records come back
/// byte for byte; ended bursts leave nothing behind (docs/redis-keys.md, "Bursts"). A held message's event is kept
/// once for every burst holding it, and gone with the last one.
@Suite("Bursts in Redis")
struct BurstsRedisTests {
    static let policy = CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 4_000)

    static func message(_ user: String, _ conversation: String, at: Int64, record: [UInt8]) -> BurstMessage {
        BurstMessage(
            appID: "a", user: user, conversation: conversation, at: at, policy: policy, lane: .bulk, record: record)
    }

    @Test("steps, claims and confirmations match Coalescing; the held record is the latest, byte for byte")
    func matchesCore() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        // Two users in the same conversation, one with a colon in the id; records with bytes Lua must keep.
        let users = ["u1", "team:7"]
        var model: [String: BurstState] = [:]
        var latest: [String: [UInt8]] = [:]
        var flushes: [String] = []
        var now: Int64 = 1_732_000_000_000
        let start = now
        for n in 0..<12 {
            now = start + Int64(n) * 700
            let batch = users.map { user in
                Self.message(user, "hike", at: now, record: [0, 255, 58, UInt8(n), 10] + Array("\(user)".utf8))
            }
            let got = try await store.stepBursts(batch)
            for (m, step) in zip(batch, got) {
                let (want, next) = Coalescing.step(model[m.user], at: now, policy: Self.policy)
                #expect(step == want, "message \(n) of \(m.user)")
                model[m.user] = next
                if case .held = want { latest[m.user] = m.record }
            }
            let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: now)
            for held in due {
                #expect(held.conversation == "hike" && held.lane == .bulk)
                #expect(held.record == latest[held.user], "the latest held record of \(held.user)")
                #expect(Coalescing.flush(model[held.user]!, now: now, policy: Self.policy) == .show(count: held.count))
                model[held.user] = Coalescing.flushed(model[held.user]!, count: held.count, now: now)
                flushes.append("\(held.user) \(held.count) at \(now - start)")
            }
            try await store.confirmBursts(app: "a", policy: Self.policy, flushed: due, now: now)
        }
        // Messages every 700 ms with a 4 s update interval: a flush at 4.2 s showing the 7 messages so far.
        #expect(flushes.sorted() == ["team:7 7 at 4200", "u1 7 at 4200"])
        // The last five are held until 4 s after that flush, then shown once, with the count of all 12.
        #expect(try await store.claimDueBursts(app: "a", policy: Self.policy, now: start + 8_199).isEmpty)
        let last = try await store.claimDueBursts(app: "a", policy: Self.policy, now: start + 8_200)
        #expect(last.map(\.count) == [12, 12] && Set(last.map(\.user)) == Set(users))
        try await store.confirmBursts(app: "a", policy: Self.policy, flushed: last, now: start + 8_200)
        #expect(try await store.claimDueBursts(app: "a", policy: Self.policy, now: start + 8_300).isEmpty)
        // Each shard is one slot: its hash and its due set share the hash tag.
        let keys = (try await redis.send("KEYS", "*").array ?? []).compactMap(\.text).sorted()
        #expect(!keys.isEmpty && keys.allSatisfy { $0.hasPrefix("herald:a:burst") && $0.contains(":{b") })
        for key in keys {
            let pttl = try await redis.send(RedisCommand("PTTL", key)).int ?? -3
            #expect(pttl > 0 && pttl <= 2 * 60_000 + 70_000, "\(key) expires (PTTL \(pttl))")
        }
        // The window passes with nothing new: the bursts end and their keys are gone.
        #expect(try await store.claimDueBursts(app: "a", policy: Self.policy, now: start + 7_700 + 10_000).isEmpty)
        #expect((try await redis.send("KEYS", "*").array ?? []).isEmpty)
    }

    @Test("a claimed flush is leased: not taken again until the lease passes without a confirmation")
    func lease() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let t: Int64 = 1_000_000
        _ = try await store.stepBursts([
            Self.message("u1", "c", at: t, record: [1]), Self.message("u1", "c", at: t + 1, record: [2]),
        ])
        #expect(try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 3_999).isEmpty)
        let first = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(first.map(\.count) == [2] && first.map(\.record) == [[2]])
        #expect(try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 5_000).isEmpty)
        let again = try await store.claimDueBursts(
            app: "a", policy: Self.policy, now: t + 4_000 + StateStore.burstLeaseMilliseconds)
        #expect(again.map(\.count) == [2])
    }

    @Test(
        "the flood guard's script matches FloodGuard; its summary is claimed a minute on and confirmed into the new minute"
    )
    func floodGuard() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let policy = FloodPolicy(perMinute: 2)
        let minute: Int64 = 28_000_000 * 60_000
        var model: BurstState?
        for n in 0..<5 {
            let at = minute + Int64(n) * 1_000
            var m = BurstMessage(
                appID: "a", user: "u1", conversation: "", at: at, policy: CoalescePolicy(), lane: .priority,
                record: [UInt8(n), 0, 58])
            m.flood = policy
            let got = try await store.stepBursts([m])
            let (want, next) = FloodGuard.step(model, at: at, policy: policy)
            #expect(got == [want], "push \(n)")
            model = next
        }
        #expect(model?.count == 3)
        #expect(try await store.claimDueBursts(app: "a", policy: CoalescePolicy(), now: minute + 59_999).isEmpty)
        let due = try await store.claimDueBursts(app: "a", policy: CoalescePolicy(), now: minute + 60_000)
        #expect(due == [HeldBurst(user: "u1", conversation: "", count: 3, lane: .priority, record: [4, 0, 58])])
        try await store.confirmBursts(app: "a", policy: CoalescePolicy(), flushed: due, now: minute + 60_000)
        // The summary is the new minute's first visible push: one more passes, the next is held.
        var m = BurstMessage(
            appID: "a", user: "u1", conversation: "", at: minute + 61_000, policy: CoalescePolicy(), lane: .priority,
            record: [9])
        m.flood = policy
        #expect(try await store.stepBursts([m, m]) == [.first, .held(count: 1)])
    }

    // MARK: Shared events

    /// A group message with `textBytes` bytes of text.
    static func event(_ id: String, textBytes: Int) throws -> ChatEvent {
        let json = """
            {"event_id":"\(id)","app_id":"a","kind":"message","created_at":1732000000000,
             "sender":{"id":"s1","name":"Cindy"},"conversation":{"id":"hike","type":"group","name":"Hiking"},
             "message":{"id":"m-\(id)","type":"text","text":"\(String(repeating: "x", count: textBytes))"}}
            """
        return try ChatEvent.decode(Array(json.utf8))
    }

    /// The deliverable record suppress holds for `user`: binary, with one target device.
    static func record(_ event: ChatEvent, to user: String) -> [UInt8] {
        let device = Device(token: String(repeating: "ab", count: 32), bundleID: "com.example.chat")
        return DeliverableRecord(event: event, recipient: user, state: UserState(), targets: [device]).wireBytes()
    }

    static func keys(_ redis: RedisConnection, _ pattern: String) async throws -> [String] {
        (try await redis.send("KEYS", pattern).array ?? []).compactMap(\.text).sorted()
    }

    static func copies(_ redis: RedisConnection) async throws -> [String] {
        try await keys(redis, "herald:a:burst_event:*")
    }

    @Test(
        "a 1,000-member group's burst of 60 KiB messages: the event is kept once, each burst under 1 KiB; the flushes are the held records byte for byte; the copy goes with the last burst holding it"
    )
    func sharedEvents() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let users = (0..<1_000).map { "member-\($0)" }
        let t: Int64 = 1_732_000_000_000
        var records: [String: [UInt8]] = [:]
        // Suppress's batches hold a few hundred records each: four batches per message.
        func step(_ event: ChatEvent, at: Int64) async throws -> [BurstStep] {
            var steps: [BurstStep] = []
            for start in stride(from: 0, to: users.count, by: 250) {
                let batch = users[start..<(start + 250)].map { user in
                    let record = Self.record(event, to: user)
                    records[user] = record
                    return Self.message(user, "hike", at: at, record: record)
                }
                steps += try await store.stepBursts(batch)
            }
            return steps
        }
        #expect(try await step(try Self.event("e1", textBytes: 60 * 1_024), at: t).allSatisfy { $0 == .first })
        #expect(
            try await step(try Self.event("e2", textBytes: 60 * 1_024), at: t + 500)
                == users.map { _ in .held(count: 2) })

        // The first message is held by no burst: its copy went with the next round trip. The second's is the only
        // one, its bytes once, counted for the 1,000 bursts.
        let copies = try await Self.copies(redis)
        #expect(copies.count == 1)
        let eventBytes = try #require(DeliverableRecord.eventRange(inWireBytes: records["member-0"]!)).count
        #expect(eventBytes > 60 * 1_024)
        #expect(try await redis.send("HSTRLEN", copies[0], "e").int == Int64(eventBytes))
        #expect(try await redis.send("HGET", copies[0], "n").int == 1_000)
        // Each burst keeps its counts and the record without the event.
        var values = 0
        for shard in 0..<RedisKeys.burstShards {
            for value in try await redis.send("HVALS", RedisKeys.bursts(app: "a", shard: shard)).array ?? [] {
                let size = value.data?.count ?? 0
                #expect(size > 0 && size < 1_024, "a burst's value is \(size) bytes")
                values += 1
            }
        }
        #expect(values == 1_000)
        // All of it, as Redis counts it: the 1,000 bursts and their due times, and the one copy (holding the
        // records whole took more than 60 MB).
        var memory: Int64 = 0
        for key in try await Self.keys(redis, "herald:a:*") {
            memory += try await redis.send("MEMORY", "USAGE", key).int ?? 0
        }
        #expect(memory < 2 * 1_024 * 1_024, "\(memory) bytes")

        // The flush gives back every held record as it was, byte for byte.
        let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(due.count == 1_000)
        #expect(due.allSatisfy { $0.record == records[$0.user] && $0.count == 2 && !$0.eventMissing })
        try await store.confirmBursts(app: "a", policy: Self.policy, flushed: due, now: t + 4_000)
        // No burst holds the event now: its copy goes with the next round trip.
        #expect(try await Self.copies(redis) == copies)
        try await store.releaseBurstEvents()
        #expect(try await Self.copies(redis).isEmpty)
    }

    @Test("a shared event is counted once per burst holding it; a message held again gives its old reference back")
    func references() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let users = ["u1", "u2", "u3"]
        let t: Int64 = 1_732_000_000_000
        let events = try (0..<3).map { try Self.event("e\($0)", textBytes: 4_000) }
        func digest(_ event: ChatEvent) throws -> String {
            let record = Self.record(event, to: "u1")
            let range = try #require(DeliverableRecord.eventRange(inWireBytes: record))
            return RedisKeys.burstEvent(app: "a", digest: String(SHA256.hex(Array(record[range])).prefix(32)))
        }
        func references(_ event: ChatEvent) async throws -> Int64? {
            try await redis.send("HGET", try digest(event), "n").int
        }
        _ = try await store.stepBursts(
            users.map { Self.message($0, "hike", at: t, record: Self.record(events[0], to: $0)) })
        let held = try await store.stepBursts(
            users.map { Self.message($0, "hike", at: t + 100, record: Self.record(events[1], to: $0)) })
        #expect(held == [.held(count: 2), .held(count: 2), .held(count: 2)])
        #expect(try await references(events[0]) == nil)
        #expect(try await references(events[1]) == 3)
        // Its TTL, the shard keys' own, covers the longest a held message waits for its flush, and more.
        let pttl = try await redis.send("PTTL", try digest(events[1])).int ?? -3
        #expect(pttl > 2 * 60_000 && pttl <= 2 * 60_000 + 70_000, "PTTL \(pttl)")
        // u1's next message replaces its held one: e1 is left to u2 and u3.
        let newer = Self.record(events[2], to: "u1")
        #expect(
            try await store.stepBursts([Self.message("u1", "hike", at: t + 200, record: newer)]) == [.held(count: 3)])
        try await store.releaseBurstEvents()
        #expect(try await references(events[1]) == 2)
        #expect(try await references(events[2]) == 1)
        let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(
            Dictionary(uniqueKeysWithValues: due.map { ($0.user, $0.record) }) == [
                "u1": newer, "u2": Self.record(events[1], to: "u2"), "u3": Self.record(events[1], to: "u3"),
            ])
        try await store.confirmBursts(app: "a", policy: Self.policy, flushed: due, now: t + 4_000)
        try await store.releaseBurstEvents()
        #expect(try await Self.copies(redis).isEmpty)
    }

    @Test(
        "a small event one message of a batch holds stays in its burst's value; one several messages hold is shared"
    )
    func smallEvents() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let t: Int64 = 1_732_000_000_000
        let small = try (0..<2).map { try Self.event("s\($0)", textBytes: 20) }
        let record = Self.record(small[1], to: "u1")
        #expect(try #require(DeliverableRecord.eventRange(inWireBytes: record)).count < 512)
        _ = try await store.stepBursts([Self.message("u1", "hike", at: t, record: Self.record(small[0], to: "u1"))])
        #expect(
            try await store.stepBursts([Self.message("u1", "hike", at: t + 100, record: record)]) == [.held(count: 2)])
        #expect(try await Self.copies(redis).isEmpty)
        let shard = RedisKeys.bursts(app: "a", shard: RedisKeys.burstShard(user: "u1"))
        let value = try #require(
            try await redis.send("HGET", shard, RedisKeys.burstField(user: "u1", conversation: "hike")).data)
        #expect(Array(value).suffix(record.count) == record[...], "the whole record after the lane")
        // Three recipients of one small event in one batch: one copy, three references.
        let users = ["u2", "u3", "u4"]
        _ = try await store.stepBursts(
            users.map { Self.message($0, "hike", at: t, record: Self.record(small[0], to: $0)) })
        let held = users.map { Self.record(small[1], to: $0) }
        #expect(
            try await store.stepBursts(zip(users, held).map { Self.message($0, "hike", at: t + 100, record: $1) })
                == users.map { _ in .held(count: 2) })
        let copies = try await Self.copies(redis)
        #expect(copies.count == 1)
        #expect(try await redis.send("HGET", copies[0], "n").int == 3)
        let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(
            Dictionary(uniqueKeysWithValues: due.map { ($0.user, $0.record) })
                == Dictionary(uniqueKeysWithValues: zip(["u1"] + users, [record] + held).map { ($0, $1) }))
        try await store.confirmBursts(app: "a", policy: Self.policy, flushed: due, now: t + 4_000)
        try await store.releaseBurstEvents()
        #expect(try await Self.copies(redis).isEmpty)
    }

    @Test(
        "values written before events were shared (the whole record after the lane) still flush, bursts and flood guards; a new hold replaces them"
    )
    func wholeRecords() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let t: Int64 = 28_000_000 * 60_000
        let shard = RedisKeys.burstShard(user: "u1")
        let hash = RedisKeys.bursts(app: "a", shard: shard)
        let dueSet = RedisKeys.burstsDue(app: "a", shard: shard)
        let burst = RedisKeys.burstField(user: "u1", conversation: "hike")
        let flood = RedisKeys.burstField(user: "u1", conversation: "")
        let old = Self.record(try Self.event("e1", textBytes: 2_000), to: "u1")
        let oldFlood = Self.record(try Self.event("e0", textBytes: 500), to: "u1")
        // As the release before wrote them: a burst of 2 (1 shown at t, the last at t + 100) holding its latest
        // record, and a flood guard holding 3 pushes since t + 1,000.
        try await redis.send("HSET", hash, burst, Array("2:1:\(t):\(t + 100):bulk:".utf8) + old).orThrow()
        try await redis.send("HSET", hash, flood, Array("3:2:\(t):\(t + 1_000):priority:".utf8) + oldFlood).orThrow()
        try await redis.send("ZADD", dueSet, t + 4_000, burst, t + 60_000, flood).orThrow()

        let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(due == [HeldBurst(user: "u1", conversation: "hike", count: 2, lane: .bulk, record: old)])
        // Not confirmed (its produce failed, say), and a message is held meanwhile: the shared form replaces it.
        let newer = Self.record(try Self.event("e2", textBytes: 2_000), to: "u1")
        #expect(
            try await store.stepBursts([Self.message("u1", "hike", at: t + 4_100, record: newer)]) == [.held(count: 3)])
        let again = try await store.claimDueBursts(
            app: "a", policy: Self.policy, now: t + 4_000 + StateStore.burstLeaseMilliseconds)
        #expect(again == [HeldBurst(user: "u1", conversation: "hike", count: 3, lane: .bulk, record: newer)])
        try await store.confirmBursts(
            app: "a", policy: Self.policy, flushed: again, now: t + 4_000 + StateStore.burstLeaseMilliseconds)
        // The flood guard's summary, a minute on.
        let summary = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 60_000)
        #expect(summary == [HeldBurst(user: "u1", conversation: "", count: 3, lane: .priority, record: oldFlood)])
        try await store.confirmBursts(app: "a", policy: Self.policy, flushed: summary, now: t + 60_000)
        try await store.releaseBurstEvents()
        #expect(try await Self.copies(redis).isEmpty)
    }

    @Test(
        "a held message whose shared event is gone: taken again after the lease while it was held lately, then handed out as missing; confirmed, its burst goes on"
    )
    func missingEvent() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let policy = CoalescePolicy(windowMilliseconds: 60_000, updateMilliseconds: 4_000)
        func message(_ id: String, at: Int64) throws -> BurstMessage {
            BurstMessage(
                appID: "a", user: "u1", conversation: "hike", at: at, policy: policy, lane: .bulk,
                record: Self.record(try Self.event(id, textBytes: 3_000), to: "u1"))
        }
        let t: Int64 = 1_732_000_000_000
        #expect(try await store.stepBursts([try message("e1", at: t)]) == [.first])
        #expect(try await store.stepBursts([try message("e2", at: t + 3_000)]) == [.held(count: 2)])
        // Evicted, say.
        for key in try await Self.copies(redis) { try await redis.send("DEL", key).orThrow() }
        // Due at t + 4,000 and held a second before: its copy may be on its way to another node. It stays leased.
        #expect(try await store.claimDueBursts(app: "a", policy: policy, now: t + 4_000).isEmpty)
        // The lease passed and the copy is still gone: handed out without a record.
        let now = t + 4_000 + StateStore.burstLeaseMilliseconds
        let due = try await store.claimDueBursts(app: "a", policy: policy, now: now)
        #expect(
            due == [
                HeldBurst(user: "u1", conversation: "hike", count: 2, lane: .bulk, record: [], eventMissing: true)
            ])
        try await store.confirmBursts(app: "a", policy: policy, flushed: due, now: now)
        #expect(try await store.claimDueBursts(app: "a", policy: policy, now: now + 1_000).isEmpty)
        // The burst goes on: the next message an update interval later is the update with every message counted.
        #expect(try await store.stepBursts([try message("e3", at: now + 4_000)]) == [.update(count: 3)])
        try await store.releaseBurstEvents()
        #expect(try await Self.copies(redis).isEmpty)
    }
}
