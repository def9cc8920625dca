import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// Trace contexts kept with held state in Redis (docs/operations.md "Tracing", docs/redis-keys.md): a traced
/// message held by its burst or its user's flood guard leaves its context with the held part, and the flush takes it
/// back (the latest traced message's); a traced message counted for a digest leaves it in the digest's hash. An
/// untraced message stores nothing more.
@Suite("Trace contexts kept in Redis")
struct HeldTraceRedisTests {
    static let policy = BurstsRedisTests.policy
    static let first = HeldTrace(
        traceparent: Array("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".utf8),
        tracestate: Array("vendor=a:b c,other=1".utf8))
    static let second = HeldTrace(traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".utf8))

    static func message(
        _ user: String, at: Int64, record: [UInt8], trace: HeldTrace?, conversation: String = "hike"
    ) -> BurstMessage {
        var m = BurstsRedisTests.message(user, conversation, at: at, record: record)
        m.trace = trace
        m.flood = FloodPolicy(perMinute: 1)
        return m
    }

    static func value(_ redis: RedisConnection, user: String, conversation: String = "hike") async throws -> [UInt8] {
        let shard = RedisKeys.bursts(app: "a", shard: RedisKeys.burstShard(user: user))
        let field = RedisKeys.burstField(user: user, conversation: conversation)
        return Array(try #require(try await redis.send("HGET", shard, field).data))
    }

    @Test("an untraced held message's value is the held record alone; its flush has no context")
    func untraced() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let t: Int64 = 1_732_000_000_000
        let record = BurstsRedisTests.record(try BurstsRedisTests.event("s1", textBytes: 20), to: "u1")
        _ = try await store.stepBursts([Self.message("u1", at: t, record: record, trace: nil)])
        #expect(
            try await store.stepBursts([Self.message("u1", at: t + 100, record: record, trace: nil)]) == [
                .held(count: 2)
            ])
        // `<count>:<shown>:<shown at>:<last at>:<lane>:` and the record: not a byte more.
        let expected = Array("2:1:\(t):\(t + 100):bulk:".utf8) + record
        #expect(try await Self.value(redis, user: "u1") == expected)
        let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(due.count == 1 && due[0].record == record && due[0].trace == nil)
    }

    @Test(
        "a traced held message's context comes back with its flush; an untraced one held after it keeps it; a later traced one replaces it; a confirmed flush drops it"
    )
    func latestTracedWins() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let t: Int64 = 1_732_000_000_000
        // A large event, so the held parts refer to a shared copy behind the context.
        let events = try (0..<4).map { try BurstsRedisTests.event("e\($0)", textBytes: 4_000) }
        let records = events.map { BurstsRedisTests.record($0, to: "u1") }
        _ = try await store.stepBursts([Self.message("u1", at: t, record: records[0], trace: nil)])
        _ = try await store.stepBursts([Self.message("u1", at: t + 100, record: records[1], trace: Self.first)])
        let stored = try await Self.value(redis, user: "u1")
        let prefix = Array("2:1:\(t):\(t + 100):bulk:^\(Self.first.stored.count):".utf8) + Self.first.stored + [35]
        #expect(Array(stored.prefix(prefix.count)) == prefix, "the context, then the shared part")
        // An untraced message held after it: its record, the traced one's context.
        _ = try await store.stepBursts([Self.message("u1", at: t + 200, record: records[2], trace: nil)])
        var due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t + 4_000)
        #expect(due.count == 1 && due[0].record == records[2] && due[0].count == 3)
        #expect(due[0].trace == Self.first)
        #expect(due[0].trace?.tracestate == Self.first.tracestate)
        // Not confirmed: the lease passes, and a later traced message's context replaces it.
        _ = try await store.stepBursts([Self.message("u1", at: t + 300, record: records[3], trace: Self.second)])
        due = try await store.claimDueBursts(
            app: "a", policy: Self.policy, now: t + 4_000 + StateStore.burstLeaseMilliseconds)
        #expect(due.count == 1 && due[0].record == records[3] && due[0].trace == Self.second)
        try await store.confirmBursts(
            app: "a", policy: Self.policy, flushed: due, now: t + 4_000 + StateStore.burstLeaseMilliseconds)
        try await store.releaseBurstEvents()
        // The shared copies are given back through the context: none is left.
        #expect(try await BurstsRedisTests.copies(redis).isEmpty)
        // A new burst whose held message is untraced: its flush carries no context.
        let later = t + 4_000 + StateStore.burstLeaseMilliseconds + Self.policy.windowMilliseconds
        let next = try await store.stepBursts([
            Self.message("u1", at: later, record: records[0], trace: nil),
            Self.message("u1", at: later + 100, record: records[1], trace: nil),
        ])
        #expect(next == [.first, .held(count: 2)])
        due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: later + 4_000)
        #expect(due.count == 1 && due[0].record == records[1] && due[0].trace == nil)
    }

    @Test("a push the flood guard holds keeps a traced push's context for the summary")
    func floodGuard() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let minute: Int64 = 60_000
        let t: Int64 = 1_732_000_000_000 / minute * minute + 1_000
        let records = try (0..<3).map {
            BurstsRedisTests.record(try BurstsRedisTests.event("f\($0)", textBytes: 20), to: "u1")
        }
        let steps = try await store.stepBursts([
            Self.message("u1", at: t, record: records[0], trace: nil, conversation: ""),
            Self.message("u1", at: t + 10, record: records[1], trace: Self.second, conversation: ""),
            Self.message("u1", at: t + 20, record: records[2], trace: nil, conversation: ""),
        ])
        #expect(steps == [.first, .held(count: 1), .held(count: 2)])
        let due = try await store.claimDueBursts(app: "a", policy: Self.policy, now: t - 1_000 + minute)
        #expect(due.count == 1 && due[0].conversation == "" && due[0].record == records[2])
        #expect(due[0].trace == Self.second)
    }

    @Test("a digest keeps the latest traced counted message's context in `t`; untraced counts leave no field")
    func digests() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let end = DigestsRedisTests.end
        let now = end - 60_000
        func count(_ user: String, _ event: String, _ trace: HeldTrace?) -> DigestCount {
            var c = DigestsRedisTests.count(user, event, "c1", "Hiking")
            c.trace = trace
            return c
        }
        #expect(
            try await store.countDigests(
                [count("u1", "e1", nil), count("u2", "e1", Self.first), count("u2", "e2", nil)], now: now)
                == [true, true, true])
        let fields = try await redis.send("HKEYS", RedisKeys.digest(app: "a", user: "u1")).array ?? []
        #expect(!fields.isEmpty && !fields.compactMap(\.text).contains("t"), "an untraced count keeps no context")
        // A replay of a traced message counts nothing and changes nothing; a later traced one wins.
        #expect(try await store.countDigests([count("u2", "e3", Self.second)], now: now) == [true])
        #expect(try await store.countDigests([count("u2", "e1", Self.first)], now: now) == [false])
        let due = try await store.claimDueDigests(app: "a", now: end)
        let byUser = Dictionary(uniqueKeysWithValues: due.map { ($0.user, $0) })
        #expect(byUser["u1"]?.trace == nil && byUser["u1"]?.messages == 1)
        #expect(byUser["u2"]?.trace == Self.second && byUser["u2"]?.messages == 3)
    }
}
