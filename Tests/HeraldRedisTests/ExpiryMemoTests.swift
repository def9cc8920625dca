import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@testable import HeraldRedis

@Suite("Shard keys' TTLs set once a minute")
struct ExpiryMemoTests {
    static let t0: Int64 = 1_732_000_000_000

    @Test("a key is due until marked, then again after the refresh; a clock going back makes it due")
    func memo() {
        let memo = ExpiryMemo(refreshMilliseconds: 60_000, limit: 4)
        let a = ExpiryMemo.Key(kind: ExpiryMemo.deliveredKind, app: "app1", shard: 7, period: 10)
        let b = ExpiryMemo.Key(kind: ExpiryMemo.explainKind, app: "app1", shard: 7, period: 10)
        #expect(memo.isDue(a, now: Self.t0))
        memo.mark([a], now: Self.t0)
        #expect(!memo.isDue(a, now: Self.t0 + 59_999))
        #expect(memo.isDue(b, now: Self.t0 + 1), "another kind of key with the same shard and period")
        #expect(memo.isDue(a, now: Self.t0 + 60_000))
        #expect(memo.isDue(a, now: Self.t0 - 1))
        // Past the limit it starts over: every key is due once more.
        memo.mark(
            (0..<4).map { ExpiryMemo.Key(kind: 1, app: "app2", shard: UInt64($0), period: 1) }, now: Self.t0)
        #expect(memo.isDue(a, now: Self.t0 + 1))
    }

    @Test("send's shard keys get their TTL on the first write; one lost later is set again after the refresh")
    func deliveredKeysTTL() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let window: Int64 = 3_600_000
        let now = Self.t0 - Self.t0 % window + 1_000
        func pair(_ n: Int) -> DeliveryPair { DeliveryPair(eventID: "e1", token: String(repeating: "\(n)", count: 64)) }
        let key = RedisKeys.delivered(app: "a", shard: RedisKeys.deliveredShard(eventId: "e1"), window: now / window)
        func pttl() async throws -> Int64 { try await redis.send("PTTL", key).int ?? -10 }

        _ = try await store.claim(app: "a", pairs: [pair(1)], owner: "p1", ttlMilliseconds: 60_000, now: now)
        #expect(try await pttl() > window, "the first claim sets the shard key's TTL")
        // The TTL is lost (an operator's PERSIST stands in for a key deleted and written again): claims within the
        // minute leave it so, the first claim after it sets it again. Confirming a pair this store claimed writes
        // its claim number's block, not the shard key.
        _ = try await redis.send("PERSIST", key)
        _ = try await store.claim(app: "a", pairs: [pair(2)], owner: "p1", ttlMilliseconds: 60_000, now: now + 10)
        try await store.confirmDelivered(app: "a", pairs: [pair(1)], now: now + 20)
        #expect(try await pttl() == -1)
        _ = try await store.claim(app: "a", pairs: [pair(3)], owner: "p1", ttlMilliseconds: 60_000, now: now + 60_020)
        #expect(try await pttl() > window)
        _ = try await redis.send("PERSIST", key)
        _ = try await store.claim(app: "a", pairs: [pair(4)], owner: "p1", ttlMilliseconds: 60_000, now: now + 60_030)
        #expect(try await pttl() == -1)
        // A confirmation of a pair the store did not claim writes `1` into the shard key, and sets its TTL when due.
        try await store.confirmDelivered(app: "a", pairs: [pair(5)], now: now + 120_030)
        #expect(try await pttl() > window)
        // The answers are unchanged by a left-out PEXPIRE: pairs 1 and 5 were confirmed, pair 4 is p1's claim
        // (held until its block's lapse time: the block was taken at `now + 60_020`, for 10 s, plus the claim TTL).
        let again = try await store.claim(
            app: "a", pairs: [pair(1), pair(5), pair(4)], owner: "p2", ttlMilliseconds: 60_000, now: now + 120_040)
        #expect(again == [.delivered, .delivered, .pending(owner: "", until: now + 60_020 + 10_000 + 60_000)])
    }

    @Test("the explain trail's hourly log gets its TTL on the first write, then once a minute")
    func explainLogTTL() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let ttl: Int64 = 86_400_000
        let store = ExplainStore(connection: redis, ttlMilliseconds: ttl)
        let hour = RedisKeys.explainHourMilliseconds
        let t = Self.t0 - Self.t0 % hour + 1_000
        func entry(_ at: Int64) -> ExplainEntry {
            ExplainEntry(
                appID: "app1", eventID: "e", user: "u", stage: "suppress", decision: "suppress", reason: "dnd", at: at)
        }
        try await store.record([entry(t)])
        let key = RedisKeys.explainLog(app: "app1", shard: RedisKeys.explainShard(eventId: "e"), hour: t / hour)
        #expect(try await redis.send("PTTL", key).int ?? -10 > ttl)
        _ = try await redis.send("PERSIST", key)
        try await store.record([entry(t + 30_000)])
        #expect(try await redis.send("PTTL", key).int == -1)
        try await store.record([entry(t + 61_000)])
        #expect(try await redis.send("PTTL", key).int ?? -10 > ttl)
        #expect(try await redis.send("LLEN", key).int == 3, "every line was written")
    }

    @Test("shards and delivery fields are FNV-1a 64 of the ids' UTF-8 bytes")
    func fnvVectors() {
        #expect(RedisKeys.fnv("") == 0xcbf2_9ce4_8422_2325)
        #expect(RedisKeys.fnv("a") == 0xaf63_dc4c_8601_ec8c)
        #expect(RedisKeys.fnv("foobar") == 0x8594_4171_f739_67e8)
        let native = "événement-42"
        let sliced = String(("x" + native).dropFirst())
        let lazy = native.utf8.lazy.map { $0 }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in lazy { h = (h ^ UInt64(b)) &* 0x0000_0100_0000_01b3 }
        #expect(RedisKeys.fnv(native) == h && RedisKeys.fnv(sliced) == h)
        #expect(RedisKeys.deliveredShard(eventId: native) == h % RedisKeys.deliveredShards)
        let field = RedisKeys.deliveredField(eventId: "foo", token: "bar")
        #expect(field == withUnsafeBytes(of: RedisKeys.fnv("foo\u{0}bar").bigEndian) { Array($0) })
    }
}
