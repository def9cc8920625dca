import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// The burst scripts give what `Coalescing` gives, message by message and flush by flush; held records come back
/// byte for byte; ended bursts leave nothing behind (docs/redis-keys.md, "Bursts").
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
}
