import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@testable import HeraldRedis

/// The cluster client against a real Redis Cluster (3 masters, 3 replicas of Debian's redis-server on loopback).
/// Serialized: each test starts six servers, and a slow machine running several clusters at once could make the
/// cluster's own failure detection fire.
@Suite("Redis Cluster against real redis-server nodes", .serialized)
struct RedisClusterTests {
    static let t0: Int64 = 1_732_000_000_000

    static func configuration(_ cluster: RedisTestCluster) throws -> RedisConfiguration {
        var configuration = try RedisConfiguration(url: cluster.url)
        configuration.connectTimeout = .seconds(1)
        configuration.commandTimeout = .seconds(5)
        configuration.initialBackoff = .milliseconds(20)
        configuration.maximumBackoff = .milliseconds(200)
        return configuration
    }

    static func token(_ n: Int) -> String {
        String(repeating: String(format: "%02x", n % 256), count: 32)
    }

    @Test("slots match CLUSTER KEYSLOT; a batch over many users is split across the masters and answered in order")
    func slotsAndSplitBatches() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = RedisConnection(configuration: try Self.configuration(cluster))
        defer { redis.close() }
        try await redis.connect()
        #expect(redis.isConnected)
        #expect(await redis.ping())

        var keys = [
            "", "foo", "123456789", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{",
            "}{", "{a}", "a{b", "ключ{é}", RedisKeys.userState(app: "app1", user: "u1"),
            RedisKeys.delivered(app: "app1", shard: 7, window: 3),
        ]
        for n in 0..<200 { keys.append("k\(n)-\(n * 7919)") }
        for key in keys {
            let reply = try await redis.send(RedisCommand("CLUSTER", "KEYSLOT", key)).orThrow("CLUSTER KEYSLOT")
            #expect(reply.int == Int64(RedisSlot.of(key)), "key \(key)")
        }

        // 600 users' keys: one batch of SETs, one batch of GETs mixed with keyless commands, answered in order.
        let users = (0..<600).map { "user-\($0)" }
        var writes = RedisBatch()
        for user in users {
            writes.command("SET", arguments: 2)
            writes.argument(RedisKeys.preferences(app: "t", user: user))
            writes.argument("value of \(user)")
        }
        try await redis.write(writes, what: "SET")
        var reads: [RedisCommand] = []
        for (index, user) in users.enumerated() {
            reads.append(RedisCommand("GET", RedisKeys.preferences(app: "t", user: user)))
            if index % 100 == 0 { reads.append(RedisCommand("PING")) }
        }
        let replies = try await redis.pipeline(reads)
        var expected: [RedisValue] = []
        for (index, user) in users.enumerated() {
            expected.append(.string(Data("value of \(user)".utf8)))
            if index % 100 == 0 { expected.append(.status("PONG")) }
        }
        #expect(replies == expected)
        // Kept flat, the replies of the three masters come back in the batch's order too.
        #expect(try await redis.pipelineFlat(RedisBatch(commands: reads)).values == expected)

        // Every master holds part of them.
        let masters = try cluster.topology(askingPort: cluster.nodes[0].port).filter { $0.isMaster }
        #expect(masters.count == 3)
        for master in masters {
            let size = Int(try await cluster.cliAsync(master.port, ["DBSIZE"])) ?? 0
            #expect(size > 100, "master \(master.port) holds \(size) keys")
        }

        // An error reply of one command stays in its place; `write` throws it.
        let mixed = try await redis.pipeline([
            RedisCommand("GET", RedisKeys.preferences(app: "t", user: "user-1")),
            RedisCommand("HGET", RedisKeys.preferences(app: "t", user: "user-2"), "f"),
            RedisCommand("GET", RedisKeys.preferences(app: "t", user: "user-3")),
        ])
        #expect(mixed[0].text == "value of user-1")
        #expect(mixed[1].isError)
        #expect(mixed[2].text == "value of user-3")
        var failing = RedisBatch()
        failing.command("HSET", arguments: 3)
        failing.argument(RedisKeys.preferences(app: "t", user: "user-4"))
        failing.argument("f")
        failing.argument("v")
        await #expect(throws: RedisError.self) { try await redis.write(failing, what: "HSET") }
    }

    @Test("StateStore: loadFixture (per-slot transactions) and loadUsers give back the fixture on a cluster")
    func stateStoreFixture() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = RedisConnection(configuration: try Self.configuration(cluster))
        defer { redis.close() }
        let store = StateStore(connection: redis)

        let path = Paths.packageRoot + "/pipelines/examples/state.json"
        let fixture = try StageCodec.decode(
            StateFixture.self, from: Array(try Data(contentsOf: URL(fileURLWithPath: path))))
        #expect(fixture.users.count >= 3)
        try await store.loadFixture(app: "app1", fixture: fixture, presenceTTLMilliseconds: 3_600_000, now: Self.t0)
        // Loading again (a retried load) converges to the same state.
        try await store.loadFixture(app: "app1", fixture: fixture, presenceTTLMilliseconds: 3_600_000, now: Self.t0)

        let users = fixture.users.keys.sorted()
        let loaded = try await store.loadUsers(app: "app1", users: users, now: Self.t0)
        for user in users {
            var expected = UserState(
                online: fixture.users[user]!.online, preferences: fixture.users[user]!.preferences,
                unread: fixture.users[user]!.unread)
            for device in fixture.users[user]!.devices { expected.register(device) }
            let got = try #require(loaded[user])
            #expect(got.devices == expected.devices, "user \(user)")
            #expect(Set(got.online) == Set(expected.online), "user \(user)")
            #expect(got.preferences == expected.preferences, "user \(user)")
            #expect(got.unread == expected.unread, "user \(user)")
            for device in expected.devices {
                #expect(try await store.owner(app: "app1", token: device.token) == user)
            }
        }
        for (conversation, state) in fixture.conversations {
            #expect(try await store.members(app: "app1", conversation: conversation) == state.members.sorted())
        }
        // The users are spread over more than one master, so the load crossed nodes.
        let slots = Set(users.map { RedisSlot.of(RedisKeys.userState(app: "app1", user: $0)) })
        var owners = Set<RedisNodeAddress>()
        for slot in slots { if let node = try await redis.clusterRouter?.node(forSlot: slot) { owners.insert(node) } }
        #expect(owners.count > 1)

        // The other multi-key writes: registration with eviction, presence, unread, members, dead tokens.
        let user = users[0]
        try await store.registerDevice(
            app: "app1", user: user, device: Device(token: Self.token(90), registeredAt: Self.t0))
        try await store.setDevicePresence(
            app: "app1", user: user, token: Self.token(90), online: true, ttlMilliseconds: 60_000, now: Self.t0)
        try await store.setUnread(app: "app1", user: user, unread: Unread(total: 3, conversations: ["c1": 3]))
        try await store.setMembers(app: "app1", conversation: "c-new", members: ["a", "b"])
        let state = try await store.loadUser(app: "app1", user: user, now: Self.t0)
        #expect(state.devices.contains { $0.token == Self.token(90) })
        #expect(state.online.contains(Self.token(90)))
        #expect(state.unread == Unread(total: 3, conversations: ["c1": 3]))
        #expect(
            try await store.removeDeadToken(app: "app1", user: user, token: Self.token(90), deadSince: Self.t0 + 1)
                == .removed)
        #expect(try await store.owner(app: "app1", token: Self.token(90)) == nil)
        #expect(try await store.members(app: "app1", conversation: "c-new") == ["a", "b"])

        // send's claims (EVALSHA; the script is loaded on every master) for events spread over the masters.
        let pairs = (0..<60).map { DeliveryPair(eventID: "event-\($0)", token: Self.token($0)) }
        let claims = try await store.claim(
            app: "app1", pairs: pairs, owner: "send-1", ttlMilliseconds: 60_000, now: Self.t0)
        #expect(claims == Array(repeating: .claimed, count: pairs.count))
        try await store.confirmDelivered(app: "app1", pairs: pairs, now: Self.t0)
        #expect(
            try await store.wasDelivered(app: "app1", pairs: pairs, now: Self.t0)
                == Array(repeating: true, count: pairs.count))
        let again = try await store.claim(
            app: "app1", pairs: pairs, owner: "send-2", ttlMilliseconds: 60_000, now: Self.t0)
        #expect(again == Array(repeating: .delivered, count: pairs.count))
    }

    /// Moves `slot` from its owner to `target`: IMPORTING / MIGRATING, then MIGRATE of `keys` (nil: every key in
    /// the slot), then, when `finish`, SETSLOT NODE on every master.
    static func migrate(
        _ cluster: RedisTestCluster, slot: Int, to target: RedisTestCluster.NodeInfo, keys: [String]?, finish: Bool
    ) async throws {
        let seed = target.port
        guard let source = try cluster.owner(ofSlot: slot, askingPort: seed) else {
            throw TestSupportError("no owner of slot \(slot)")
        }
        try await cluster.cliAsync(target.port, ["CLUSTER", "SETSLOT", "\(slot)", "IMPORTING", source.id])
        try await cluster.cliAsync(source.port, ["CLUSTER", "SETSLOT", "\(slot)", "MIGRATING", target.id])
        let moving: [String]
        if let keys {
            moving = keys
        } else {
            moving = try await cluster.cliAsync(source.port, ["CLUSTER", "GETKEYSINSLOT", "\(slot)", "1000"])
                .split(separator: "\n").map(String.init)
        }
        if !moving.isEmpty {
            let answer = try await cluster.cliAsync(
                source.port, ["MIGRATE", "127.0.0.1", "\(target.port)", "", "0", "5000", "KEYS"] + moving)
            #expect(answer == "OK", "MIGRATE answered \(answer)")
        }
        if finish {
            let masters = try cluster.topology(askingPort: seed).filter { $0.isMaster && !$0.failing }
            try await cluster.cliAsync(target.port, ["CLUSTER", "SETSLOT", "\(slot)", "NODE", target.id])
            try await cluster.cliAsync(source.port, ["CLUSTER", "SETSLOT", "\(slot)", "NODE", target.id])
            for master in masters where master.port != target.port && master.port != source.port {
                try await cluster.cliAsync(master.port, ["CLUSTER", "SETSLOT", "\(slot)", "NODE", target.id])
            }
        }
    }

    @Test(
        "bursts: steps, claims and confirmations over the masters; a held event is kept once in a slot of its own and every held record comes back byte for byte"
    )
    func bursts() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = RedisConnection(configuration: try Self.configuration(cluster))
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let policy = BurstsRedisTests.policy
        let users = (0..<200).map { "member-\($0)" }
        let events = try ["e1", "e2"].map { try BurstsRedisTests.event($0, textBytes: 8_000) }
        var records: [String: [UInt8]] = [:]
        func step(_ event: ChatEvent, at: Int64) async throws -> [BurstStep] {
            let batch = users.map { user in
                let record = BurstsRedisTests.record(event, to: user)
                records[user] = record
                return BurstsRedisTests.message(user, "hike", at: at, record: record)
            }
            return try await store.stepBursts(batch)
        }
        func copy(_ event: ChatEvent) throws -> String {
            let record = BurstsRedisTests.record(event, to: "x")
            let range = try #require(DeliverableRecord.eventRange(inWireBytes: record))
            return RedisKeys.burstEvent(app: "a", digest: String(SHA256.hex(Array(record[range])).prefix(32)))
        }
        #expect(try await step(events[0], at: Self.t0).allSatisfy { $0 == .first })
        #expect(try await step(events[1], at: Self.t0 + 500) == users.map { _ in .held(count: 2) })
        // The bursts' 64 shards spread over the three masters; the copy is in a slot of its own, counted once per
        // burst; the first message's copy went with the second's round trip.
        let shardSlots = Set((0..<RedisKeys.burstShards).map { RedisSlot.of(RedisKeys.bursts(app: "a", shard: $0)) })
        let copySlot = RedisSlot.of(try copy(events[1]))
        #expect(shardSlots.count == 64 && !shardSlots.contains(copySlot))
        #expect(try await redis.send("HGET", try copy(events[1]), "n").int == 200)
        #expect(try await redis.send("EXISTS", try copy(events[0])).int == 0)

        let due = try await store.claimDueBursts(app: "a", policy: policy, now: Self.t0 + 4_000)
        #expect(due.count == 200 && due.allSatisfy { $0.record == records[$0.user] && $0.count == 2 })
        try await store.confirmBursts(app: "a", policy: policy, flushed: due, now: Self.t0 + 4_000)
        try await store.releaseBurstEvents()
        #expect(try await redis.send("EXISTS", try copy(events[1])).int == 0)
        #expect(try await store.claimDueBursts(app: "a", policy: policy, now: Self.t0 + 5_000).isEmpty)
    }

    @Test("MOVED after a slot migration: the command is sent on and the slot map corrected, transactions included")
    func movedAfterMigration() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = RedisConnection(configuration: try Self.configuration(cluster))
        defer { redis.close() }
        let other = RedisConnection(configuration: try Self.configuration(cluster))
        defer { other.close() }
        let router = try #require(redis.clusterRouter)
        let store = StateStore(connection: redis)
        let otherStore = StateStore(connection: other)

        let user = "moving"
        let slot = RedisSlot.of(user)
        try await store.setPreferences(app: "t", user: user, preferences: Preferences(displayName: "Mo"))
        try await store.setUnread(app: "t", user: user, unread: Unread(total: 2, conversations: ["c": 2]))
        try await other.connect()
        let before = try #require(try await router.node(forSlot: slot))
        let masters = try cluster.topology(askingPort: cluster.nodes[0].port).filter { $0.isMaster }
        let target = try #require(masters.first { $0.port != before.port })

        try await Self.migrate(cluster, slot: slot, to: target, keys: nil, finish: true)
        #expect(try cluster.owner(ofSlot: slot, askingPort: before.port)?.port == target.port)

        // The first connection still maps the slot to the old owner: a read gets MOVED and is sent on.
        let refreshes = router.mapRefreshes
        let state = try await store.loadUser(app: "t", user: user, now: Self.t0)
        #expect(state.preferences.displayName == "Mo")
        #expect(state.unread == Unread(total: 2, conversations: ["c": 2]))
        #expect(try await router.node(forSlot: slot)?.port == target.port)
        try await waitUntil("the slot map is learnt again after MOVED") { router.mapRefreshes > refreshes }

        // The second connection's first command is a transaction (MULTI DEL HSET EXEC) on the moved slot.
        try await otherStore.setUnread(app: "t", user: user, unread: Unread(total: 5, conversations: ["d": 5]))
        #expect(
            try await otherStore.loadUser(app: "t", user: user, now: Self.t0).unread
                == Unread(total: 5, conversations: ["d": 5]))
        #expect(try await other.clusterRouter?.node(forSlot: slot)?.port == target.port)
        // A batch spanning every master, the moved slot among them, answers in order.
        let users = (0..<100).map { "u\($0)" } + [user]
        let loaded = try await store.loadUsers(app: "t", users: users, now: Self.t0)
        #expect(loaded[user]?.preferences.displayName == "Mo")
        #expect(loaded.count == users.count)
    }

    @Test("ASK during a slot migration: migrated keys are read and new keys written on the target, after ASKING")
    func askDuringMigration() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = RedisConnection(configuration: try Self.configuration(cluster))
        defer { redis.close() }
        let router = try #require(redis.clusterRouter)
        let store = StateStore(connection: redis)

        let user = "asked"
        let slot = RedisSlot.of(user)
        let moved = RedisKeys.userState(app: "t", user: user)
        let staying = RedisKeys.mentions(app: "t", user: user)
        try await store.setPreferences(app: "t", user: user, preferences: Preferences(displayName: "Ask"))
        try await store.registerDevice(
            app: "t", user: user, device: Device(token: Self.token(1), registeredAt: Self.t0))
        _ = try await redis.send("HSET", staying, "total", "3")
        try await redis.connect()
        let source = try #require(try await router.node(forSlot: slot))
        let masters = try cluster.topology(askingPort: cluster.nodes[0].port).filter { $0.isMaster }
        let target = try #require(masters.first { $0.port != source.port })

        // Only the state hash moves; the mention counts stay on the source for now.
        try await Self.migrate(cluster, slot: slot, to: target, keys: [moved], finish: false)
        #expect(try await cluster.cliAsync(source.port, ["EXISTS", staying]) == "1")

        // Reads: the moved key is answered by the target (ASK), the other by the source.
        let state = try await store.loadUser(app: "t", user: user, now: Self.t0)
        #expect(state.preferences.displayName == "Ask")
        #expect(state.devices.map(\.token) == [Self.token(1)])
        #expect(try await store.withMentionCounts(app: "t", user: user, unread: Unread()).mentionTotal == 3)
        // A script and a transaction (MULTI DEL HSET EXEC) on the moved key go to the target (ASK) too.
        try await store.setUnread(app: "t", user: user, unread: Unread(total: 7, conversations: ["c": 7]))
        #expect(try await store.loadUser(app: "t", user: user, now: Self.t0).unread.total == 7)
        var fixture = StateFixture()
        fixture.users[user] = UserState(
            devices: [Device(token: Self.token(1), registeredAt: Self.t0)],
            preferences: Preferences(displayName: "Ask"),
            unread: Unread(total: 7, conversations: ["c": 7]))
        try await store.loadFixture(app: "t", fixture: fixture, presenceTTLMilliseconds: 60_000, now: Self.t0)
        // ASK does not change the map: the slot is still the source's until the migration ends.
        #expect(try await router.node(forSlot: slot) == source)

        // Finish: the remaining keys move, the slot is the target's, everything reads back (MOVED).
        try await Self.migrate(cluster, slot: slot, to: target, keys: nil, finish: true)
        let after = try await store.loadUser(app: "t", user: user, now: Self.t0)
        #expect(after.preferences.displayName == "Ask")
        #expect(after.devices.map(\.token) == [Self.token(1)])
        #expect(after.unread == Unread(total: 7, conversations: ["c": 7]))
        #expect(try await store.withMentionCounts(app: "t", user: user, unread: Unread()).mentionTotal == 3)
        #expect(try await router.node(forSlot: slot)?.port == target.port)
    }

    @Test("a master is killed: its replica takes over, and batches succeed again (retryable errors meanwhile)")
    func failover() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = RedisConnection(configuration: try Self.configuration(cluster))
        defer { redis.close() }
        let router = try #require(redis.clusterRouter)

        let users = (0..<300).map { "user-\($0)" }
        var writes = RedisBatch()
        for user in users {
            writes.command("SET", arguments: 2)
            writes.argument(RedisKeys.preferences(app: "t", user: user))
            writes.argument(user)
        }
        try await redis.write(writes, what: "SET")
        // Every replica has every write before the master goes.
        let topology = try cluster.topology(askingPort: cluster.nodes[0].port)
        for master in topology where master.isMaster {
            #expect(try await cluster.cliAsync(master.port, ["WAIT", "1", "10000"]) == "1")
        }
        let slot = RedisSlot.of(users[0])
        let victim = try #require(try await router.node(forSlot: slot))
        let victimID = try #require(topology.first { $0.port == victim.port }?.id)
        let replica = try #require(topology.first { $0.masterID == victimID })
        let node = try #require(cluster.nodes.first { $0.port == victim.port })

        node.process.killNow()
        try await cluster.waitUntilHealthyAsync()
        #expect(try cluster.owner(ofSlot: slot, askingPort: replica.port)?.port == replica.port)

        let reads = users.map { RedisCommand("GET", RedisKeys.preferences(app: "t", user: $0)) }
        let expected = users.map { RedisValue.string(Data($0.utf8)) }
        var retryable = 0
        try await waitUntil("a batch over every master succeeds after the failover", timeout: .seconds(60)) {
            do {
                return try await redis.pipeline(reads) == expected
            } catch let error as RedisError where error.isRetryable {
                retryable += 1
                return false
            }
        }
        #expect(try await router.node(forSlot: slot)?.port == replica.port)
        // Writes go to the promoted replica.
        try await redis.write(writes, what: "SET")
        #expect(
            try await redis.send(RedisCommand("GET", RedisKeys.preferences(app: "t", user: users[0]))).text == users[0])
        #expect(await redis.ping())
    }
}

extension RedisValue {
    fileprivate var isError: Bool {
        if case .error = self { return true }
        return false
    }
}
