import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

@Suite("The explain trail in a real redis-server")
struct ExplainStoreTests {
    @Test("entries of interleaved events land in their events' trails, each with a TTL; users get a last decision")
    func interleavedEvents() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = ExplainStore(connection: redis, ttlMilliseconds: 60_000)
        try await store.record([
            ExplainEntry(appID: "app1", eventID: "a", stage: "resolve", decision: "fanned_out", at: 1, count: 2),
            ExplainEntry(appID: "app1", eventID: "a", user: "u1", stage: "suppress", decision: "deliver", at: 2),
            ExplainEntry(appID: "app1", eventID: "b", user: "u1", stage: "suppress", decision: "suppress", at: 3),
            ExplainEntry(appID: "app2", eventID: "a", user: "u9", stage: "suppress", decision: "deliver", at: 4),
            ExplainEntry(
                appID: "app1", eventID: "a", user: "u2", stage: "suppress", decision: "suppress", reason: "dnd", at: 5),
            ExplainEntry(
                appID: "app1", eventID: "a", user: "u1", token: "t1", stage: "send", decision: "delivered", at: 6,
                status: 200),
        ])
        let a = try await store.trail(app: "app1", eventID: "a")
        #expect(a.map(\.at) == [1, 2, 5, 6], "event first, then users, then devices")
        #expect(try await store.trail(app: "app1", eventID: "b").map(\.at) == [3])
        #expect(try await store.trail(app: "app2", eventID: "a").map(\.at) == [4], "the same event id in another app")
        for key in [
            ExplainStore.key(app: "app1", eventID: "a"), ExplainStore.key(app: "app1", eventID: "b"),
            ExplainStore.key(app: "app2", eventID: "a"),
        ] {
            let ttl = try await redis.send(RedisCommand("PTTL", key)).int ?? -3
            #expect(ttl > 0 && ttl <= 60_000, "\(key) expires (PTTL \(ttl))")
        }
        // u1's last user-level entry was event b's (the device entry does not count).
        let last = try await store.lastDecision(app: "app1", user: "u1")
        #expect(last?.decision.eventID == "b")
        #expect(last?.decision.decision == "suppress")
        #expect(try await store.lastDecision(app: "app1", user: "u2")?.decision.reason == "dnd")
    }
}
