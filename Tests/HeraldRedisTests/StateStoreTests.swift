import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@testable import HeraldRedis

@Suite("StateStore against a real redis-server")
struct StateStoreTests {
    static let t0: Int64 = 1_732_000_000_000

    static func token(_ n: Int) -> String {
        String(repeating: String(format: "%02x", n % 256), count: 32)
    }

    @Test("registering a 21st device evicts the oldest by registered_at; re-registering updates in place")
    func twentyDeviceEviction() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)

        // Registered out of order: device n has registered_at t0 + n, so device 0 is the oldest.
        for n in (0..<20).reversed() {
            let evicted = try await store.registerDevice(
                app: "a", user: "u", device: Device(token: Self.token(n), registeredAt: Self.t0 + Int64(n)))
            #expect(evicted.isEmpty)
        }
        try await store.setPresence(
            app: "a", user: "u", online: [Self.token(0), Self.token(5)], ttlMilliseconds: 60_000, now: Self.t0)

        // Re-registering an existing token: no eviction, entry updated.
        let updated = Device(
            token: Self.token(3), kind: .apns, environment: .sandbox, bundleID: "com.x", registeredAt: Self.t0 + 3)
        #expect(try await store.registerDevice(app: "a", user: "u", device: updated).isEmpty)
        var state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
        #expect(state.devices.count == 20)
        #expect(state.devices.first { $0.token == Self.token(3) } == updated)

        let evicted = try await store.registerDevice(
            app: "a", user: "u", device: Device(token: Self.token(20), registeredAt: Self.t0 + 100))
        #expect(evicted == [Self.token(0)])
        state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
        #expect(state.devices.count == 20)
        #expect(state.devices.map(\.token) == (1...20).map { Self.token($0) })
        // The evicted device's presence went with it.
        #expect(state.online == [Self.token(5)])

        // The same sequence through the core's in-memory rule gives the same devices.
        var model = UserState()
        for n in (0..<20).reversed() { model.register(Device(token: Self.token(n), registeredAt: Self.t0 + Int64(n))) }
        model.register(updated)
        model.register(Device(token: Self.token(20), registeredAt: Self.t0 + 100))
        #expect(Set(model.devices) == Set(state.devices))
    }

    @Test("unregister one device, then all devices")
    func unregister() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        for n in 0..<3 {
            try await store.registerDevice(
                app: "a", user: "u", device: Device(token: Self.token(n), registeredAt: Self.t0 + Int64(n)))
        }
        try await store.setPresence(app: "a", user: "u", online: [Self.token(1)], ttlMilliseconds: 60_000, now: Self.t0)

        #expect(try await store.unregisterDevice(app: "a", user: "u", token: Self.token(1)))
        #expect(try await !store.unregisterDevice(app: "a", user: "u", token: Self.token(1)))
        var state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
        #expect(state.devices.map(\.token) == [Self.token(0), Self.token(2)])
        #expect(state.online.isEmpty)

        #expect(try await store.unregisterAll(app: "a", user: "u") == 2)
        state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
        #expect(state == UserState())
    }

    @Test("a presence TTL at Int64.max saturates: the device is online with the latest expiry, no trap")
    func presenceTTLAtTheLimit() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        try await store.registerDevice(app: "a", user: "u", device: Device(token: Self.token(1), registeredAt: Self.t0))
        try await store.registerDevice(app: "a", user: "u", device: Device(token: Self.token(2), registeredAt: Self.t0))
        try await store.setPresence(
            app: "a", user: "u", online: [Self.token(1)], ttlMilliseconds: .max, now: Self.t0)
        try await store.setDevicePresence(
            app: "a", user: "u", token: Self.token(2), online: true, ttlMilliseconds: .max, now: Self.t0)
        #expect(
            try await store.loadUser(app: "a", user: "u", now: InputRanges.timestampMillis.upperBound).online == [
                Self.token(1), Self.token(2),
            ])
    }

    @Test("presence entries count as online only until their expiry (injected now)")
    func presenceExpiry() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let now = Self.t0
        try await store.registerDevice(app: "a", user: "u", device: Device(token: Self.token(1), registeredAt: now))
        try await store.registerDevice(app: "a", user: "u", device: Device(token: Self.token(2), registeredAt: now))
        try await store.setPresence(
            app: "a", user: "u", online: [Self.token(1), Self.token(2)], ttlMilliseconds: 30_000, now: now)
        try await store.setDevicePresence(
            app: "a", user: "u", token: Self.token(2), online: true, ttlMilliseconds: 90_000, now: now)

        #expect(try await store.loadUser(app: "a", user: "u", now: now).online == [Self.token(1), Self.token(2)])
        #expect(
            try await store.loadUser(app: "a", user: "u", now: now + 29_999).online == [Self.token(1), Self.token(2)])
        #expect(try await store.loadUser(app: "a", user: "u", now: now + 30_000).online == [Self.token(2)])
        #expect(try await store.loadUser(app: "a", user: "u", now: now + 90_000).online == [])

        try await store.setDevicePresence(
            app: "a", user: "u", token: Self.token(2), online: false, ttlMilliseconds: 0, now: now)
        #expect(try await store.loadUser(app: "a", user: "u", now: now).online == [Self.token(1)])
        // Expired lines stay in the state hash until the user's next presence write, which drops them.
        try await store.setDevicePresence(
            app: "a", user: "u", token: Self.token(2), online: true, ttlMilliseconds: 90_000, now: now)
        let key = RedisKeys.userState(app: "a", user: "u")
        #expect(
            try await redis.send("HGET", key, "o").text
                == "\(now + 30_000) \(Self.token(1))\n\(now + 90_000) \(Self.token(2))")
        try await store.setDevicePresence(
            app: "a", user: "u", token: Self.token(2), online: true, ttlMilliseconds: 90_000, now: now + 30_000)
        #expect(try await redis.send("HGET", key, "o").text == "\(now + 120_000) \(Self.token(2))")
        try await store.setDevicePresence(
            app: "a", user: "u", token: Self.token(2), online: false, ttlMilliseconds: 0, now: now + 30_000)
        #expect(try await redis.send("HEXISTS", key, "o").int == 0)
    }

    @Test("a dead token is removed unless it was registered again after the dead-since time")
    func deadTokenRule() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let token = Self.token(7)
        try await store.registerDevice(app: "a", user: "u", device: Device(token: token, registeredAt: Self.t0))
        try await store.setPresence(app: "a", user: "u", online: [token], ttlMilliseconds: 60_000, now: Self.t0)

        // Re-registered after APNs said it was dead: kept.
        try await store.registerDevice(app: "a", user: "u", device: Device(token: token, registeredAt: Self.t0 + 5_000))
        #expect(
            try await store.removeDeadToken(app: "a", user: "u", token: token, deadSince: Self.t0 + 1_000)
                == .keptReregistered)
        #expect(try await store.loadUser(app: "a", user: "u", now: Self.t0).devices.map(\.token) == [token])

        // Registered at or before the dead-since time: removed, presence too.
        #expect(
            try await store.removeDeadToken(app: "a", user: "u", token: token, deadSince: Self.t0 + 5_000) == .removed)
        let state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
        #expect(state.devices.isEmpty)
        #expect(state.online.isEmpty)
        #expect(
            try await store.removeDeadToken(app: "a", user: "u", token: token, deadSince: Self.t0 + 5_000)
                == .notRegistered)
    }

    @Test("a store set to more shards keeps each event's records in the hash of its shard of that count")
    func shardCount() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let window: Int64 = 3_600_000
        let now: Int64 = 1_732_000_000_000
        let wide = StateStore(connection: redis, deliveredShards: 65_536)
        #expect(wide.deliveredShards == 65_536)
        let pairs = (0..<40).map { DeliveryPair(eventID: "event-\($0)", token: Self.token($0)) }
        let claimed = try await wide.claim(
            app: "a", pairs: pairs, owner: "p1", ttlMilliseconds: 60_000, now: now, window: window)
        #expect(claimed == Array(repeating: DeliveryClaim.claimed, count: pairs.count))
        try await wide.confirmDelivered(app: "a", pairs: pairs, now: now, window: window)
        #expect(try await wide.wasDelivered(app: "a", pairs: pairs, now: now, window: window).allSatisfy { $0 })
        var shards = Set<UInt64>()
        for pair in pairs {
            let shard = RedisKeys.deliveredShard(eventId: pair.eventID, of: 65_536)
            shards.insert(shard)
            let key = RedisKeys.delivered(app: "a", shard: shard, window: now / window)
            let field = RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token)
            let stored = try await redis.send("HGET", key, field)
            #expect(ClaimNumbers.parse(stored) != nil, "\(pair.eventID) in \(key): \(stored)")
        }
        #expect(shards.count > 30, "40 events over 65,536 shards land in nearly as many hashes: \(shards.count)")
        // A store with the default count looks elsewhere: every process must use the same count.
        let narrow = StateStore(connection: redis)
        let seen = try await narrow.wasDelivered(app: "a", pairs: pairs, now: now, window: window)
        #expect(seen.filter { $0 }.count < pairs.count)
    }

    @Test("claims: one owner claims, another sees it pending until confirmed, released or expired")
    func claims() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let window: Int64 = 3_600_000
        // Just before a window ends, so the later steps run in the next window and read the claims across it.
        let now: Int64 = 1_732_006_800_000 - 20
        #expect((now + 20) % window == 0)
        let a = DeliveryPair(eventID: "e1", token: Self.token(1)), b = DeliveryPair(eventID: "e1", token: Self.token(2))

        // p1's claims are numbers of the block it took at `now`: they lapse 10 s (the block's lifetime) plus the
        // claim TTL after that.
        let pendingP1 = DeliveryClaim.pending(owner: "", until: now + 70_000)
        var got: [DeliveryClaim] = try await store.claim(
            app: "a", pairs: [a, b], owner: "p1", ttlMilliseconds: 60_000, now: now, window: window)
        #expect(got == [DeliveryClaim.claimed, .claimed])
        // Another process: both pending until p1's claim lapses; p1 itself may claim again (a later attempt).
        got = try await store.claim(
            app: "a", pairs: [a, b], owner: "p2", ttlMilliseconds: 60_000, now: now + 10, window: window)
        #expect(got == [pendingP1, pendingP1])
        got = try await store.claim(
            app: "a", pairs: [a], owner: "p1", ttlMilliseconds: 60_000, now: now + 20, window: window)
        #expect(got == [DeliveryClaim.claimed])
        // p1 confirms a and releases b (in the next window): a is delivered for everyone, b is free again.
        try await store.confirmDelivered(app: "a", pairs: [a], now: now + 25, window: window)
        try await store.releaseClaims(app: "a", pairs: [b], owner: "p1", now: now + 25, window: window)
        #expect(try await store.wasDelivered(app: "a", pairs: [a, b], now: now + 25, window: window) == [true, false])
        got = try await store.claim(
            app: "a", pairs: [a, b], owner: "p2", ttlMilliseconds: 60_000, now: now + 30, window: window)
        #expect(got == [DeliveryClaim.delivered, .claimed])
        // Releasing someone else's claim or a delivery record does nothing.
        try await store.releaseClaims(app: "a", pairs: [a, b], owner: "p1", now: now + 35, window: window)
        got = try await store.claim(
            app: "a", pairs: [a, b], owner: "p3", ttlMilliseconds: 60_000, now: now + 40, window: window)
        // p2's claim holds a number of the block p2 took at `now + 10`.
        #expect(got == [DeliveryClaim.delivered, .pending(owner: "", until: now + 10 + 70_000)])
        // The records are fields of one hash per shard and window, kept two windows; the token is not stored. A
        // record is the claim's number; the delivery is the number's bit in its block's key.
        let key = RedisKeys.delivered(
            app: "a", shard: RedisKeys.deliveredShard(eventId: "e1"), window: (now + 25) / window)
        let pttl = try await redis.send("PTTL", key).int ?? -10
        #expect(pttl > window && pttl <= 2 * window, "PTTL \(pttl)")
        let field = RedisKeys.deliveredField(eventId: "e1", token: Self.token(1))
        #expect(field.count == 8)
        let number = try #require(ClaimNumbers.parse(try await redis.send("HGET", key, field)))
        let block = RedisKeys.claimBlock(app: "a", block: ClaimNumbers.block(of: number))
        let bits = try await redis.send(
            "BITFIELD", block, "GET", "i64", "0", "GET", "u1", String(ClaimNumbers.bit(of: number)))
        // p1's second attempt (at `now + 20`, in the next window) took a number of the same block.
        #expect(bits.array?.compactMap(\.int) == [now + 70_000, 1])
        let blockTTL = try await redis.send("PTTL", block).int ?? -10
        #expect(blockTTL > 2 * window && blockTTL <= 2 * window + 2 * 60_000 + 600_000, "PTTL \(blockTTL)")
        let dump = try await redis.send("HGETALL", key).array?.compactMap(\.text) ?? []
        #expect(!dump.contains { $0.contains(Self.token(1)) })
        // Across a window's end: the first step writes a claim into the new window before it learns that the
        // previous one holds a record (d) or another owner's live claim (e); the claim it wrote is taken back.
        let d = DeliveryPair(eventID: "e4", token: Self.token(4)), e = DeliveryPair(eventID: "e4", token: Self.token(5))
        got = try await store.claim(
            app: "a", pairs: [d, e], owner: "p1", ttlMilliseconds: 60_000, now: now, window: window)
        #expect(got == [DeliveryClaim.claimed, .claimed])
        try await store.confirmDelivered(app: "a", pairs: [d], now: now, window: window)
        got = try await store.claim(
            app: "a", pairs: [d, e], owner: "p2", ttlMilliseconds: 60_000, now: now + 30, window: window)
        #expect(got == [DeliveryClaim.delivered, pendingP1])
        let nextWindow = RedisKeys.delivered(
            app: "a", shard: RedisKeys.deliveredShard(eventId: "e4"), window: (now + 30) / window)
        for pair in [d, e] {
            let f = RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token)
            let left = try await redis.send("HGET", nextWindow, f)
            #expect(left == .null, "\(left)")
        }
        // A claim lapses with its block: then another owner takes it. With a claim TTL of 50 ms the block is
        // handed out for 50 ms, so the claim lapses 100 ms after the block was taken.
        let c = DeliveryPair(eventID: "e3", token: Self.token(3))
        got = try await store.claim(app: "a", pairs: [c], owner: "p1", ttlMilliseconds: 50, now: now, window: window)
        #expect(got == [DeliveryClaim.claimed])
        got = try await store.claim(
            app: "a", pairs: [c], owner: "p2", ttlMilliseconds: 60_000, now: now + 99, window: window)
        #expect(got == [DeliveryClaim.pending(owner: "", until: now + 100)])
        got = try await store.claim(
            app: "a", pairs: [c], owner: "p2", ttlMilliseconds: 60_000, now: now + 100, window: window)
        #expect(got == [DeliveryClaim.claimed])
        // A claim whose block key is gone has lapsed too.
        let f = DeliveryPair(eventID: "e5", token: Self.token(6))
        got = try await store.claim(
            app: "a", pairs: [f], owner: "p1", ttlMilliseconds: 60_000, now: now, window: window)
        let fKey = RedisKeys.delivered(app: "a", shard: RedisKeys.deliveredShard(eventId: "e5"), window: now / window)
        let fNumber = try #require(
            ClaimNumbers.parse(
                try await redis.send("HGET", fKey, RedisKeys.deliveredField(eventId: "e5", token: Self.token(6)))))
        _ = try await redis.send("DEL", RedisKeys.claimBlock(app: "a", block: ClaimNumbers.block(of: fNumber)))
        got = try await store.claim(
            app: "a", pairs: [f], owner: "p2", ttlMilliseconds: 60_000, now: now + 1, window: window)
        #expect(got == [DeliveryClaim.claimed])
        // After SCRIPT FLUSH (a restarted server) the scripts are loaded again.
        _ = try await redis.send("SCRIPT", "FLUSH").orThrow()
        got = try await store.claim(
            app: "a", pairs: [a, c], owner: "p4", ttlMilliseconds: 60_000, now: now + 150, window: window)
        #expect(got == [DeliveryClaim.delivered, .pending(owner: "", until: now + 10 + 70_000)])
    }

    @Test("claim numbers: a block per 4,096 claims or 10 s, each block's key with its TTL; another process reads them")
    func claimNumberBlocks() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let window: Int64 = 3_600_000
        let now: Int64 = 1_732_000_000_000
        let sender = StateStore(connection: redis),
            other = StateStore(connection: RedisConnection(configuration: server.configuration))
        defer { other.connection.close() }
        let pairs = (0..<5_000).map { DeliveryPair(eventID: "e\($0)", token: Self.token($0 % 7)) }
        let got = try await sender.claim(
            app: "a", pairs: pairs, owner: "p1", ttlMilliseconds: 90_000, now: now, window: window)
        #expect(got.allSatisfy { $0 == .claimed })
        func numbers(_ of: [DeliveryPair]) async throws -> [Int64] {
            var out: [Int64] = []
            for pair in of {
                let key = RedisKeys.delivered(
                    app: "a", shard: RedisKeys.deliveredShard(eventId: pair.eventID), window: now / window)
                let value = try await redis.send(
                    "HGET", key, RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token))
                out.append(try #require(ClaimNumbers.parse(value), "\(value)"))
            }
            return out
        }
        let first = try await numbers(pairs)
        #expect(Set(first).count == pairs.count, "every claim has a number of its own")
        let blocks = Set(first.map(ClaimNumbers.block(of:)))
        #expect(blocks.count == 2, "5,000 claims take two blocks of 4,096: \(blocks)")
        for block in blocks {
            let ttl = try await redis.send("PTTL", RedisKeys.claimBlock(app: "a", block: block)).int ?? -10
            #expect(ttl > 2 * window && ttl <= 2 * window + 180_000 + 600_000, "\(ttl)")
        }
        // 10 s later the same process takes a new block for new claims.
        let later = DeliveryPair(eventID: "later", token: Self.token(1))
        _ = try await sender.claim(
            app: "a", pairs: [later], owner: "p1", ttlMilliseconds: 90_000, now: now + 10_000, window: window)
        let laterBlock = ClaimNumbers.block(of: try await numbers([later])[0])
        #expect(!blocks.contains(laterBlock))
        // Half are delivered (one BITFIELD per block), half released; another process (another store) sees both.
        try await sender.confirmDelivered(app: "a", pairs: Array(pairs[..<2_500]), now: now + 1, window: window)
        try await sender.releaseClaims(
            app: "a", pairs: Array(pairs[2_500...]), owner: "p1", now: now + 1, window: window)
        let seen = try await other.claim(
            app: "a", pairs: [pairs[0], pairs[2_499], pairs[2_500], pairs[4_999], later], owner: "p2",
            ttlMilliseconds: 90_000, now: now + 20_000, window: window)
        #expect(
            seen == [.delivered, .delivered, .claimed, .claimed, .pending(owner: "", until: now + 10_000 + 100_000)])
        #expect(
            try await other.wasDelivered(app: "a", pairs: [pairs[1], pairs[2_501]], now: now + 20_000, window: window)
                == [true, false])
    }

    @Test("the numbers a store holds per pair: two owners in turn, let go by owner or all at once, restored")
    func heldClaimNumbers() {
        let source = ClaimNumberSource()
        let pair = DeliveryPair(eventID: "e1", token: Self.token(1))
        let other = DeliveryPair(eventID: "e2", token: Self.token(1))
        source.hold(app: "a", owner: "x", [(pair, 4_100), (other, 4_101)], now: Self.t0)
        source.hold(app: "a", owner: "y", [(pair, 9_000)], now: Self.t0)
        source.hold(app: "a", owner: "x", [(pair, 4_102)], now: Self.t0 + 1)  // x's later claim replaces its first
        #expect(source.letGo(app: "b", [pair]).map { $0 == nil } == [true], "held per app")

        let taken = source.letGo(app: "a", [pair, other])
        #expect(taken.map { $0?.all.map(\.number) ?? [] } == [[4_102, 9_000], [4_101]])
        #expect(source.letGo(app: "a", owner: "x", [pair, other]) == [nil, nil], "all let go")
        source.restore(app: "a", [pair, other], taken)
        #expect(source.letGo(app: "a", owner: "x", [pair]) == [4_102])
        #expect(source.letGo(app: "a", owner: "x", [pair]) == [nil])
        #expect(source.letGo(app: "a", owner: "y", [pair, other]) == [9_000, nil])
        #expect(source.letGo(app: "a", [pair, other]).map { $0?.all.map(\.number) ?? [] } == [[], [4_101]])
    }

    @Test("records of the release before claim numbers read alike: `1` is delivered, a live `p:` claim is pending")
    func earlierRecords() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let window: Int64 = 3_600_000
        let now: Int64 = 1_732_000_000_000
        let pairs = (0..<3).map { DeliveryPair(eventID: "old", token: Self.token($0)) }
        let key = RedisKeys.delivered(app: "a", shard: RedisKeys.deliveredShard(eventId: "old"), window: now / window)
        func field(_ i: Int) -> [UInt8] { RedisKeys.deliveredField(eventId: "old", token: Self.token(i)) }
        _ = try await redis.send(
            "HSET", key, field(0), "1", field(1), "p:gone:\(now + 5_000)", field(2), "p:gone:\(now - 1)")
        let got = try await store.claim(
            app: "a", pairs: pairs, owner: "p1", ttlMilliseconds: 60_000, now: now, window: window)
        #expect(got == [.delivered, .pending(owner: "gone", until: now + 5_000), .claimed])
        #expect(try await store.wasDelivered(app: "a", pairs: pairs, now: now, window: window) == [true, false, false])
        // The lapsed claim was taken over with a claim number, which a confirmation marks delivered.
        #expect(ClaimNumbers.parse(try await redis.send("HGET", key, field(2))) != nil)
        try await store.confirmDelivered(app: "a", pairs: [pairs[2]], now: now + 1, window: window)
        #expect(
            try await store.wasDelivered(app: "a", pairs: pairs, now: now + 2, window: window) == [true, false, true])
    }

    @Test("a pair with its event's time is filed under that time's window: one hash, read by every later copy")
    func filedByEventTime() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let window: Int64 = 60_000
        let created: Int64 = 1_732_000_000_000 - 5
        let filed = created / window
        let a = DeliveryPair(eventID: "e1", token: Self.token(1), eventTime: created)
        let b = DeliveryPair(eventID: "e1", token: Self.token(2), eventTime: created)
        let untimed = DeliveryPair(eventID: "e2", token: Self.token(3))
        // Sent two windows after the event was created (a backlog): the claim still goes to the event's window,
        // and the previous window's hash is not read for it.
        let sentAt = created + 2 * window
        _ = try await redis.send("CONFIG", "RESETSTAT").orThrow()
        var got = try await store.claim(
            app: "a", pairs: [a, untimed, b], owner: "p1", ttlMilliseconds: 60_000, now: sentAt, window: window)
        #expect(got == [DeliveryClaim.claimed, .claimed, .claimed])
        let stats = try await redis.send("INFO", "commandstats").text ?? ""
        #expect(stats.contains("cmdstat_hsetnx:calls=3,"), "\(stats)")
        #expect(stats.contains("cmdstat_hmget:calls=1,"), "one HMGET, for the pair without a time: \(stats)")
        let key = RedisKeys.delivered(app: "a", shard: RedisKeys.deliveredShard(eventId: "e1"), window: filed)
        let field = RedisKeys.deliveredField(eventId: "e1", token: Self.token(1))
        let number = try #require(ClaimNumbers.parse(try await redis.send("HGET", key, field)))
        let sendWindow = RedisKeys.delivered(
            app: "a", shard: RedisKeys.deliveredShard(eventId: "e1"), window: sentAt / window)
        #expect(try await redis.send("HGET", sendWindow, field) == .null)
        // Another owner sees p1's claims; p1 confirms a and releases b; both land in the event's window.
        got = try await store.claim(
            app: "a", pairs: [a, b], owner: "p2", ttlMilliseconds: 60_000, now: sentAt + 1, window: window)
        #expect(
            got == [
                DeliveryClaim.pending(owner: "", until: sentAt + 70_000),
                .pending(owner: "", until: sentAt + 70_000),
            ])
        try await store.confirmDelivered(app: "a", pairs: [a, untimed], now: sentAt + 2, window: window)
        try await store.releaseClaims(app: "a", pairs: [b], owner: "p1", now: sentAt + 2, window: window)
        #expect(try await redis.send("HGET", key, field) == .string(Data(String(number).utf8)))
        #expect(
            try await redis.send("HGET", key, RedisKeys.deliveredField(eventId: "e1", token: Self.token(2))) == .null)
        let pttl = try await redis.send("PTTL", key).int ?? -10
        #expect(pttl > window && pttl <= 2 * window, "kept two windows from the send, not from the event: \(pttl)")
        // A copy replayed a window and a half after the send, when the send's window is no longer read for pairs
        // without a time, is still found: every copy of a timed pair reads the event's window.
        let replay = sentAt + window + window / 2
        got = try await store.claim(
            app: "a", pairs: [a, b], owner: "p3", ttlMilliseconds: 60_000, now: replay, window: window)
        #expect(got == [DeliveryClaim.delivered, .claimed])
        // The pair without a time was filed under the send's window, which a read this late no longer looks at.
        #expect(
            try await store.wasDelivered(app: "a", pairs: [a, b, untimed], now: replay, window: window) == [
                true, false, false,
            ])
        // A record written by markDelivered for a timed pair is found by a claim of it.
        let c = DeliveryPair(eventID: "e3", token: Self.token(4), eventTime: created)
        #expect(try await store.markDelivered(app: "a", pairs: [c], now: replay, window: window) == [true])
        got = try await store.claim(
            app: "a", pairs: [c], owner: "p3", ttlMilliseconds: 60_000, now: replay + 1, window: window)
        #expect(got == [DeliveryClaim.delivered])

        // One shard: a pair filed under the current window by its event time and a pair without one share a hash
        // (two groups of one batch); the claim answers both, and the hash gets its TTL.
        let one = StateStore(connection: redis, deliveredShards: 1)
        let now = replay + 7
        let current = DeliveryPair(eventID: "e5", token: Self.token(5), eventTime: now - 1)
        let plain = DeliveryPair(eventID: "e6", token: Self.token(6))
        got = try await one.claim(
            app: "b", pairs: [current, plain], owner: "p1", ttlMilliseconds: 60_000, now: now, window: window)
        #expect(got == [DeliveryClaim.claimed, .claimed])
        let shared = RedisKeys.delivered(app: "b", shard: 0, window: now / window)
        #expect(try await redis.send("HLEN", shared).int == 2)
        let sharedTTL = try await redis.send("PTTL", shared).int ?? -10
        #expect(sharedTTL > window && sharedTTL <= 2 * window, "\(sharedTTL)")
    }

    @Test("delivery records: the first mark wins, replays within the window see it, two windows later it is gone")
    func idempotency() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let window: Int64 = 60_000
        let now: Int64 = 1_732_000_000_000

        #expect(try await store.markDelivered(app: "a", eventId: "e1", token: Self.token(1), now: now, window: window))
        #expect(try await !store.markDelivered(app: "a", eventId: "e1", token: Self.token(1), now: now, window: window))
        // Another app, event or token is a different record.
        #expect(try await store.markDelivered(app: "b", eventId: "e1", token: Self.token(1), now: now, window: window))

        let pairs = [
            DeliveryPair(eventID: "e1", token: Self.token(1)), DeliveryPair(eventID: "e1", token: Self.token(2)),
            DeliveryPair(eventID: "e2", token: Self.token(1)),
        ]
        #expect(try await store.wasDelivered(app: "a", pairs: pairs, now: now, window: window) == [true, false, false])
        #expect(try await store.markDelivered(app: "a", pairs: pairs, now: now, window: window) == [false, true, true])
        #expect(try await store.wasDelivered(app: "a", pairs: pairs, now: now, window: window) == [true, true, true])
        // Replays up to the end of the next window still see the records.
        #expect(
            try await store.wasDelivered(app: "a", pairs: pairs, now: now + window, window: window) == [
                true, true, true,
            ])
        #expect(try await !store.markDelivered(app: "a", pairs: pairs, now: now + window, window: window)[0])
        // Two windows on, they are no longer read, and the keys expire by then.
        #expect(
            try await store.wasDelivered(app: "a", pairs: pairs, now: now + 2 * window + window, window: window) == [
                false, false, false,
            ])
        let key = RedisKeys.delivered(app: "a", shard: RedisKeys.deliveredShard(eventId: "e2"), window: now / window)
        let pttl = try await redis.send("PTTL", key).int ?? -10
        #expect(pttl > 0 && pttl <= 2 * window)
    }

    @Test("a loaded fixture reads back equal through loadUsers in one round trip")
    func fixtureRoundTrip() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)

        let json = """
            {
              "users": {
                "u2": {
                  "devices": [{"token": "\(Self.token(2))", "kind": "apns", "environment": "production",
                               "bundle_id": "com.example.chat", "registered_at": 1732000000000},
                              {"token": "\(Self.token(3))", "kind": "voip", "environment": "sandbox",
                               "bundle_id": "com.example.chat", "registered_at": 1732000000001}],
                  "online": ["\(Self.token(3))"],
                  "preferences": {
                    "trigger": "mention_only",
                    "conversations": {"c1": {"trigger": "off", "muted": true}},
                    "dnd": {"start": "22:00", "end": "08:00", "timezone": "Asia/Seoul"},
                    "snooze": {"start": 1732000000000, "end": 1732003600000},
                    "template": "alternative", "display_style": "simple_banner",
                    "display_name": "Cindy", "languages": ["fr", "de"], "badge": false
                  },
                  "unread": {"total": 5, "conversations": {"c1": 2, "c9": 3}}
                },
                "u3": {"devices": [{"token": "\(Self.token(4))", "registered_at": 1732000000002}]},
                "u4": {"devices": []}
              },
              "conversations": {"c1": {"members": ["u1", "u2", "u3"]}, "c2": {"members": []}}
            }
            """
        let fixture = try StageCodec.decode(StateFixture.self, from: Array(json.utf8))
        try await store.loadFixture(app: "app1", fixture: fixture, presenceTTLMilliseconds: 3_600_000, now: Self.t0)

        let commandsBefore = try await totalCommands(redis)
        let loaded = try await store.loadUsers(
            app: "app1", users: ["u2", "u3", "u4", "u2"], now: Self.t0)
        let commandsAfter = try await totalCommands(redis)
        // 3 distinct users, one read each (+1 for the INFO itself): one pipeline, no per-user trips hidden elsewhere.
        #expect(commandsAfter - commandsBefore == 3 + 1)

        #expect(loaded.count == 3)
        for user in ["u2", "u3", "u4"] {
            #expect(loaded[user] == fixture.users[user], "user \(user)")
        }
        #expect(try await store.members(app: "app1", conversation: "c1") == ["u1", "u2", "u3"])
        #expect(try await store.members(app: "app1", conversation: "c2") == [])
        // Users and apps never written read as empty.
        #expect(
            try await store.loadUsers(app: "app1", users: ["nobody"], now: Self.t0)["nobody"]
                == UserState())
        #expect(
            try await store.loadUsers(app: "other", users: ["u2"], now: Self.t0)["u2"] == UserState()
        )

        // Senders who are not recipients: one HGET each, preferences only and no conversation's settings; a user
        // in both lists is read whole.
        let before = try await totalCommands(redis)
        let mixed = try await store.loadUsers(
            app: "app1", users: ["u3"], now: Self.t0, preferencesOnly: ["u2", "u3", "nobody"])
        #expect(try await totalCommands(redis) - before == 1 + 2 + 1)
        #expect(mixed["u3"] == fixture.users["u3"])
        var senderPreferences = try #require(fixture.users["u2"]).preferences
        senderPreferences.conversations = [:]
        #expect(mixed["u2"] == UserState(preferences: senderPreferences))
        #expect(mixed["u2"]?.preferences.displayName == "Cindy")
        #expect(mixed["nobody"] == UserState())

        // With a conversation: total plus that conversation only.
        let scoped = try await store.loadUsers(app: "app1", users: ["u2"], now: Self.t0, conversationsOf: [["c1"]])
        #expect(scoped["u2"]?.unread == Unread(total: 5, conversations: ["c1": 2]))
        // Resolve's read: per user, the conversations it is a recipient in (a user listed twice gets both lists;
        // a conversation without a count reads as none), one command per read as without them.
        let beforeScoped = try await totalCommands(redis)
        let perUser = try await store.loadUsers(
            app: "app1", users: ["u2", "u3", "u2"], now: Self.t0, preferencesOnly: ["u3"],
            conversationsOf: [["c9"], ["c1"], ["c1", "c9", "c7"]])
        #expect(try await totalCommands(redis) - beforeScoped == 2 + 1)
        #expect(perUser["u2"]?.unread == Unread(total: 5, conversations: ["c1": 2, "c9": 3]))
        #expect(perUser["u2"]?.devices == fixture.users["u2"]?.devices)
        #expect(perUser["u2"]?.preferences == fixture.users["u2"]?.preferences)
        // The conversations' settings are read for the listed conversations only.
        let elsewhere = try await store.loadUsers(
            app: "app1", users: ["u2"], now: Self.t0, conversationsOf: [["c9"]])
        #expect(elsewhere["u2"]?.preferences.conversations == [:])
        #expect(elsewhere["u2"]?.preferences.displayName == "Cindy")
        #expect(elsewhere["u2"]?.preferences.dnd == fixture.users["u2"]?.preferences.dnd)
        #expect(perUser["u3"] == fixture.users["u3"])
        // A user whose total nothing set reads with the total unknown (no badge), in both reads, until set_unread.
        #expect(loaded["u3"]?.unread.totalKnown == false && loaded["u2"]?.unread.totalKnown == true)
        #expect(perUser["u3"]?.unread.totalKnown == false)
        // Presence expires with the fixture's TTL.
        #expect(try await store.loadUser(app: "app1", user: "u2", now: Self.t0 + 3_600_000).online.isEmpty)

        // Single writers round-trip too.
        try await store.setUnread(app: "app1", user: "u3", unread: Unread(total: 1, conversations: ["c1": 1]))
        try await store.setPreferences(
            app: "app1", user: "u3", preferences: Preferences(trigger: .off, languages: ["ko"]))
        try await store.setMembers(app: "app1", conversation: "c1", members: ["u9"])
        let u3 = try await store.loadUser(app: "app1", user: "u3", now: Self.t0)
        #expect(u3.unread == Unread(total: 1, conversations: ["c1": 1]) && u3.unread.totalKnown)
        #expect(u3.preferences == Preferences(trigger: .off, languages: ["ko"]))
        #expect(try await store.members(app: "app1", conversation: "c1") == ["u9"])
    }

    @Test("corrupt stored entries never crash a read")
    func corruptEntries() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        try await store.registerDevice(app: "a", user: "u", device: Device(token: Self.token(1), registeredAt: Self.t0))
        let key = RedisKeys.userState(app: "a", user: "u")
        let stored = try #require(try await redis.send("HGET", key, "d").data)
        _ = try await redis.send("HSET", key, "d", Data("{not json\n".utf8) + stored + Data("\n\n[1]".utf8))
        _ = try await redis.send("HSET", key, "p", Data([0xff, 0x00]))
        _ = try await redis.send("HSET", key, "total", "many")
        _ = try await redis.send("HSET", key, "o", "soon \(Self.token(1))\n\(Self.t0 + 1000)")
        for conversations in [nil, ["c1"]] as [[String]?] {
            let state = try #require(
                try await store.loadUsers(
                    app: "a", users: ["u"], now: Self.t0, conversationsOf: conversations.map { [$0] })["u"])
            #expect(state.devices.map(\.token) == [Self.token(1)])
            #expect(state.online == [])
            #expect(state.preferences == Preferences())
            #expect(state.unread.total == 0)
        }
        // The next registration rewrites the devices without the lines that do not decode.
        try await store.registerDevice(app: "a", user: "u", device: Device(token: Self.token(2), registeredAt: Self.t0))
        #expect(try await redis.send("HGET", key, "d").text?.split(separator: "\n").count == 2)

        // A key of the wrong type is an error with a reason, not a crash.
        _ = try await redis.send("SET", RedisKeys.userState(app: "a", user: "w"), "x")
        await #expect(throws: RedisError.self) { try await store.loadUser(app: "a", user: "w", now: Self.t0) }
        await #expect(throws: RedisError.self) {
            try await store.loadUsers(app: "a", users: ["w"], now: Self.t0, conversationsOf: [["c1"]])
        }
    }

    private func totalCommands(_ redis: RedisConnection) async throws -> Int {
        let info = try await redis.send("INFO", "stats").text ?? ""
        for line in info.split(whereSeparator: \.isNewline) where line.hasPrefix("total_commands_processed:") {
            return Int(line.dropFirst("total_commands_processed:".count)) ?? -1
        }
        return -1
    }

    @Test("devices and preferences read again after a change are the changed ones")
    func parsedValuesFollowChanges() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let first = Device(token: Self.token(1), registeredAt: Self.t0)
        _ = try await store.registerDevice(app: "a", user: "u", device: first)
        let other = Device(token: Self.token(2), registeredAt: Self.t0)
        _ = try await store.registerDevice(app: "a", user: "v", device: other)
        try await store.setPreferences(app: "a", user: "u", preferences: Preferences(languages: ["de"]))
        for _ in 0..<3 {
            let states = try await store.loadUsers(app: "a", users: ["u", "v"], now: Self.t0)
            #expect(states["u"]?.devices == [first] && states["v"]?.devices == [other])
            #expect(states["u"]?.preferences.languages == ["de"])
            #expect(states["v"]?.preferences.languages == [], "v has no stored preferences")
        }
        let changed = Device(token: Self.token(1), environment: .sandbox, bundleID: "com.x", registeredAt: Self.t0 + 1)
        _ = try await store.registerDevice(app: "a", user: "u", device: changed)
        try await store.setPreferences(app: "a", user: "u", preferences: Preferences(languages: ["fr", "de"]))
        let states = try await store.loadUsers(app: "a", users: ["u", "v"], now: Self.t0)
        #expect(states["u"]?.devices == [changed])
        #expect(states["v"]?.devices == [other], "the other user's device is unchanged")
        #expect(states["u"]?.preferences.languages == ["fr", "de"])
    }
}

@Suite("How full the sharded keys are (heraldctl shards), against a real redis-server")
struct ShardFillTests {
    @Test("a sample of every shard counts the entries, finds hashes past the listpack limit, and suggests a count")
    func fill() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let window: Int64 = 3_600_000
        let t: Int64 = 1_732_006_800_000  // an hour's start
        // 1,200 delivery records over 2 shards in the window before `now`: about 600 a hash, past Redis's 512.
        let store = StateStore(connection: redis, deliveredShards: 2)
        let pairs = (0..<1200).map { DeliveryPair(eventID: "e\($0)", token: "t\($0)") }
        try await store.confirmDelivered(app: "a", pairs: pairs, now: t + 10, window: window)
        // 40 users' latest decisions over 8 shards, and 30 log lines over 2 shards in the hour before `now`.
        let explain = ExplainStore(connection: redis, lastDecisionShards: 8, logShards: 2)
        try await explain.record(
            (0..<40).map {
                ExplainEntry(
                    appID: "a", eventID: "e\($0 % 30)", user: "u\($0)", stage: "suppress",
                    decision: $0 < 30 ? "suppress" : "deliver", reason: $0 < 30 ? "dnd" : nil, at: t + 20)
            })
        let now = t + window + 5
        let fills = try await store.shardFill(
            app: "a", now: now, window: window, lastDecisionShards: 8, logShards: 2, sample: 64)
        #expect(fills.map(\.kind) == ["delivered", "last_decision", "explain_log"])
        let delivered = fills[0]
        #expect(delivered.sampled == 2 && delivered.ceiling == 512, "\(delivered)")
        #expect(delivered.estimatedEntries == 1200, "every shard read: \(delivered)")
        #expect(delivered.hashtables == 2 && !delivered.fits)
        #expect(delivered.suggestedShards == 12, "1,200 entries at 100 a hash: \(delivered.suggestedShards)")
        let decisions = fills[1]
        #expect(decisions.sampled == 8 && decisions.estimatedEntries == 40 && decisions.hashtables == 0)
        #expect(decisions.fits && decisions.suggestedShards == 8, "kept: \(decisions)")
        let logs = fills[2]
        #expect(logs.sampled == 2 && logs.estimatedEntries == 30 && logs.hashtables == nil && logs.ceiling == 5000)
        #expect(logs.fits && logs.suggestedShards == 2)
        // A sample smaller than the count reads that many shards; an app without traffic fits and keeps its counts.
        let sparse = try await StateStore(connection: redis, deliveredShards: 4096).shardFill(
            app: "quiet", now: now, window: window, sample: 16)
        #expect(sparse.map(\.sampled) == [16, 16, 16])
        #expect(sparse.allSatisfy { $0.fits && $0.meanEntries == 0 })
        #expect(sparse.map(\.suggestedShards) == [4096, RedisKeys.lastDecisionShards, RedisKeys.explainShards])
    }
}
