import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// The read sync's rate-limit script answers what `ReadSync.admit` answers, read after read, and its state is small
/// and expires (docs/redis-keys.md, "Read sync").
@Suite("Read sync in Redis")
struct ReadSyncRedisTests {
    struct Read {
        var user: String
        var conversation: String?
        var at: Int64
        var readAt: Int64?
    }

    /// The start of a minute of the clock.
    static let t0: Int64 = 1_700_000_040_000

    @Test("the script and ReadSync.admit agree: intervals, the user's cap, replays, minute boundaries")
    func scriptMatchesRule() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let t0 = Self.t0
        let policies = [
            ReadSyncPolicy(),
            ReadSyncPolicy(conversationIntervalMilliseconds: 10_000, perMinute: 3),
            ReadSyncPolicy(conversationIntervalMilliseconds: 0, perMinute: 2),
        ]
        let reads: [Read] = [
            Read(user: "u1", conversation: "c1", at: t0, readAt: 1),
            Read(user: "u1", conversation: "c1", at: t0 + 100, readAt: 2),  // inside the interval
            Read(user: "u1", conversation: "c1", at: t0 + 150, readAt: 1),  // a replay of the first
            Read(user: "u2", conversation: "c1", at: t0 + 200, readAt: 3),  // another user
            Read(user: "u1", conversation: "c2", at: t0 + 300, readAt: 4),
            Read(user: "u1", conversation: nil, at: t0 + 400, readAt: 5),  // everything
            Read(user: "u1", conversation: "c3", at: t0 + 500, readAt: nil),
            Read(user: "u1", conversation: "c1", at: t0 + 3_100, readAt: 6),
            Read(user: "u1", conversation: "c4", at: t0 + 55_000, readAt: 7),
            Read(user: "u1", conversation: "c4", at: t0 + 61_000, readAt: 8),  // the next minute, 6 s later
            Read(user: "u1", conversation: "c5", at: t0 + 61_500, readAt: 9),
            Read(user: "u1", conversation: "c4", at: t0 + 66_000, readAt: 10),
            Read(user: "u1", conversation: "c4", at: t0 + 66_100, readAt: 10),  // a replay across the minute
        ]
        for (p, policy) in policies.enumerated() {
            let app = "a\(p)"
            var states: [String: ReadSyncLimiter] = [:]
            var outcomes: [ReadSyncOutcome] = []
            for (n, read) in reads.enumerated() {
                let (want, next) = ReadSync.admit(
                    states[read.user], conversation: read.conversation ?? ReadSync.everything,
                    readAt: read.readAt.map { String($0) } ?? "", now: read.at, policy: policy)
                states[read.user] = next
                let got = try await store.admitReadSync(
                    app: app, user: read.user, conversation: read.conversation, readAt: read.readAt, now: read.at,
                    policy: policy)
                #expect(got == want, "policy \(p), read \(n)")
                outcomes.append(got)
            }
            // Every outcome occurs under some policy, so the comparison covers each branch of the script.
            if p == 0 { #expect(outcomes.contains(.rateLimited) && outcomes.filter { $0 == .sent }.count >= 8) }
            if p == 2 { #expect(outcomes.contains(.userLimit)) }
        }
    }

    @Test("one key per shard and minute, each with a TTL of at most three minutes")
    func footprint() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        for n in 0..<50 {
            _ = try await store.admitReadSync(
                app: "fp", user: "user-\(n)", conversation: "c\(n % 7)", readAt: Int64(n), now: Self.t0 + Int64(n),
                policy: ReadSyncPolicy())
        }
        let keys = (try await redis.send(RedisCommand("KEYS", "herald:fp:*")).array ?? []).compactMap(\.text)
        #expect(!keys.isEmpty && keys.count <= Int(RedisKeys.readSyncShards), "\(keys.count) keys")
        #expect(keys.allSatisfy { $0.hasPrefix("herald:fp:read_sync:{r") && $0.hasSuffix(":\(Self.t0 / 60_000)") })
        for key in keys {
            let ttl = try await redis.send(RedisCommand("PTTL", key)).int ?? -1
            #expect(ttl > 0 && ttl <= ReadSync.limiterTTLMilliseconds, "\(key): \(ttl)")
        }
        // A rate-limited read writes nothing.
        let before = try await redis.send(RedisCommand("DBSIZE")).int
        #expect(
            try await store.admitReadSync(
                app: "fp", user: "user-1", conversation: "c1", readAt: 99, now: Self.t0 + 10,
                policy: ReadSyncPolicy()) == .rateLimited)
        #expect(try await redis.send(RedisCommand("DBSIZE")).int == before)
    }
}
