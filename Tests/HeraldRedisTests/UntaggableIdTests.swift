import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@testable import HeraldRedis

/// User ids that cannot be a Redis Cluster hash tag as they are (empty, or starting with `}`): their keys are named
/// with the id in hexadecimal, so all of one user's keys share a slot, and `migrateUntaggableUserKeys` moves the keys
/// written under the old names. Against a real redis-server and a real Redis Cluster.
@Suite("User ids that cannot be a hash tag", .serialized)
struct UntaggableIdTests {
    /// Ids chosen to break a naive tag: empty, starting with `}`, braces elsewhere, ids that look like the
    /// hexadecimal form, percent signs, NUL, multi-byte characters and a combining mark after `{`.
    static let ids = [
        "", "}", "}}", "}x", "}{", "{}", "{", "{x}", "a}b", "a{b}c", "hex{7d}", "%7d", "7d", "\u{0}", "}\u{0}",
        "é", "}é", "\u{301}u", "u1", "👩‍👩‍👧", String(repeating: "}", count: 256),
    ]

    static let parts: [RedisKeys.UserPart] = [.state, .mentions, .devices, .presence, .preferences, .unread]

    @Test("every key of one user is in one slot, whatever the id; distinct ids never share a key")
    func oneSlotPerUser() {
        var seen: [String: String] = [:]
        for id in Self.ids {
            var keys = Self.parts.map { RedisKeys.user(app: "a", user: id, $0) }
            keys.append(RedisKeys.counted(app: "a", user: id, eventID: "e}1"))
            let slots = Set(keys.map { RedisSlot.of($0) })
            #expect(slots.count == 1, "id \(Array(id.utf8)): slots \(slots)")
            for key in keys {
                if let other = seen[key] { Issue.record("ids \(Array(id.utf8)) and \(Array(other.utf8)) share \(key)") }
                seen[key] = id
            }
            // The batch writer builds the same bytes.
            for part in Self.parts {
                var batch = RedisBatch()
                batch.command("GET", arguments: 1)
                batch.userKey(app: "a", user: id, part)
                #expect(batch.bytes == RedisCommand("GET", RedisKeys.user(app: "a", user: id, part)).encoded)
            }
        }
    }

    @Test("ids that make a tag keep their names; the others are written in hexadecimal")
    func names() {
        #expect(RedisKeys.userState(app: "a", user: "u1") == "herald:a:user:{u1}:state")
        #expect(RedisKeys.userState(app: "a", user: "a}b") == "herald:a:user:{a}b}:state")
        #expect(RedisKeys.userState(app: "a", user: "{x}") == "herald:a:user:{{x}}:state")
        #expect(RedisKeys.userState(app: "a", user: "") == "herald:a:user:hex{0x}:state")
        #expect(RedisKeys.userState(app: "a", user: "}x") == "herald:a:user:hex{0x7d78}:state")
        #expect(RedisKeys.mentions(app: "a", user: "}") == "herald:a:user:hex{0x7d}:mentions")
        #expect(RedisKeys.counted(app: "a", user: "}é", eventID: "e") == "herald:a:user:hex{0x7dc3a9}:counted:e")
        #expect(RedisKeys.isTaggable("u") && RedisKeys.isTaggable("{") && RedisKeys.isTaggable("a}"))
        #expect(!RedisKeys.isTaggable("") && !RedisKeys.isTaggable("}") && !RedisKeys.isTaggable("}a"))
    }

    @Test("the empty id's keys share a slot too")
    func emptyId() {
        // A bare `hex{}` would be an empty tag (no tag at all): the empty id's form must still make one.
        let keys = Self.parts.map { RedisKeys.user(app: "a", user: "", $0) }
        #expect(Set(keys.map { RedisSlot.of($0) }).count == 1)
    }

    static let t0: Int64 = 1_732_000_000_000

    static func clusterConnection(_ cluster: RedisTestCluster) throws -> RedisConnection {
        var configuration = try RedisConfiguration(url: cluster.url)
        configuration.connectTimeout = .seconds(1)
        configuration.commandTimeout = .seconds(5)
        return RedisConnection(configuration: configuration)
    }

    /// Registration, presence, unread, counting and loading for each untaggable id: the multi-key scripts run
    /// (a key in another slot would fail them with CROSSSLOT).
    static func exerciseUsers(_ store: StateStore, app: String) async throws {
        let users = ["", "}", "}x", "}{"]
        for (n, user) in users.enumerated() {
            let token = String(repeating: String(format: "%02x", 0x40 + n), count: 32)
            try await store.registerDevice(app: app, user: user, device: Device(token: token, registeredAt: t0))
            try await store.setDevicePresence(
                app: app, user: user, token: token, online: true, ttlMilliseconds: 60_000, now: t0)
            try await store.setUnread(app: app, user: user, unread: Unread(total: 2, conversations: ["c": 2]))
            let counted = try await store.countMessages(
                app: app, [CountKey(user: user, eventID: "e\(n)", conversation: "c", mentioned: true)],
                markerTTLMilliseconds: 60_000)
            #expect(counted.map(\.unreadTotal) == [3], "user \(Array(user.utf8))")
            #expect(counted.map(\.mentionTotal) == [1], "user \(Array(user.utf8))")
            let state = try await store.loadUser(app: app, user: user, now: t0)
            #expect(state.devices.map(\.token) == [token], "user \(Array(user.utf8))")
            #expect(state.online == [token], "user \(Array(user.utf8))")
            #expect(state.unread == Unread(total: 3, conversations: ["c": 3]), "user \(Array(user.utf8))")
            #expect(try await store.owner(app: app, token: token) == user)
        }
        let loaded = try await store.loadUsers(app: app, users: users + ["u1"], now: t0)
        for user in users { #expect(loaded[user]?.unread.total == 3, "user \(Array(user.utf8))") }
    }

    @Test("on a Redis Cluster, users with untaggable ids register, count and load")
    func clusterUsers() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = try Self.clusterConnection(cluster)
        defer { redis.close() }
        try await Self.exerciseUsers(StateStore(connection: redis), app: "a")
    }

    /// Writes `user`'s state hash and mention counts under the names used before (the id as it is in the tag).
    static func writeOldKeys(_ redis: RedisConnection, app: String, user: String, total: Int) async throws {
        try await redis.send(
            "HSET", RedisKeys.rawUser(app: app, user: user, .state), "total", total, "c:c", total, "p",
            #"{"trigger":"all"}"#
        ).orThrow()
        try await redis.send("HSET", RedisKeys.rawUser(app: app, user: user, .mentions), "total", 1).orThrow()
        try await redis.send("PEXPIRE", RedisKeys.rawUser(app: app, user: user, .mentions), 600_000).orThrow()
    }

    static func migrateAndCheck(_ redis: RedisConnection) async throws {
        let store = StateStore(connection: redis)
        let users = ["", "}", "}x", "}}:state"]
        for (n, user) in users.enumerated() { try await Self.writeOldKeys(redis, app: "a", user: user, total: 5 + n) }
        // Written under the new name since the upgrade: its field wins over the old one.
        try await redis.send("HSET", RedisKeys.userState(app: "a", user: "}x"), "total", 42).orThrow()
        // Left alone: a taggable user's keys, another app's, a key of another type, a replay marker.
        try await Self.writeOldKeys(redis, app: "a", user: "u1", total: 1)
        try await Self.writeOldKeys(redis, app: "b", user: "}x", total: 1)
        try await redis.send("SET", RedisKeys.rawUser(app: "a", user: "}s", .state), "x").orThrow()
        try await redis.send("SET", "herald:a:user:{}x}:counted:e1", 1).orThrow()

        let result = try await store.migrateUntaggableUserKeys(app: "a")
        #expect(result == UntaggableMigration(keysMoved: 2 * users.count, keysSkipped: 1))
        for (n, user) in users.enumerated() {
            let state = try await store.loadUser(app: "a", user: user, now: Self.t0)
            let total = user == "}x" ? 42 : 5 + n
            #expect(state.unread.total == total, "user \(Array(user.utf8))")
            #expect(state.unread.conversations == ["c": 5 + n], "user \(Array(user.utf8))")
            #expect(state.preferences.trigger == .all, "user \(Array(user.utf8))")
            let mentions = RedisKeys.mentions(app: "a", user: user)
            #expect(try await redis.send("HGET", mentions, "total").orThrow().int == 1)
            let ttl = try await redis.send("PTTL", mentions).orThrow().int ?? -2
            #expect(ttl > 0 && ttl <= 600_000, "user \(Array(user.utf8)): ttl \(ttl)")
            for part in [RedisKeys.UserPart.state, .mentions] {
                let old = RedisKeys.rawUser(app: "a", user: user, part)
                #expect(try await redis.send("EXISTS", old).orThrow().int == 0, "\(old)")
            }
        }
        for (app, user) in [("a", "u1"), ("b", "}x")] {
            #expect(try await redis.send("EXISTS", RedisKeys.rawUser(app: app, user: user, .state)).orThrow().int == 1)
        }
        #expect(try await redis.send("GET", RedisKeys.rawUser(app: "a", user: "}s", .state)).orThrow().text == "x")
        #expect(try await redis.send("EXISTS", "herald:a:user:{}x}:counted:e1").orThrow().int == 1)
        // A second run finds nothing more to move.
        #expect(try await store.migrateUntaggableUserKeys(app: "a") == UntaggableMigration(keysSkipped: 1))
    }

    @Test("the keys written under the old names move to the hexadecimal ones; fields written since win")
    func migration() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        try await Self.migrateAndCheck(redis)
    }

    @Test("the same migration on a Redis Cluster, where the old keys were in different slots")
    func clusterMigration() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        let redis = try Self.clusterConnection(cluster)
        defer { redis.close() }
        try await Self.migrateAndCheck(redis)
    }

    @Test("old key names are recognised exactly")
    func oldNames() {
        func parsed(_ key: String) -> String? {
            StateStore.untaggableUserKey(key, app: "a").map { "\($0.user)|\($0.part.rawValue)" }
        }
        #expect(parsed("herald:a:user:{}:state") == "|state")
        #expect(parsed("herald:a:user:{}x}:mentions") == "}x|mentions")
        #expect(parsed("herald:a:user:{}}:state}:state") == "}}:state|state")
        for other in [
            "herald:a:user:{u}:state", "herald:a:user:{}x}:counted:e", "herald:a:user:{}x}:devices",
            "herald:b:user:{}x}:state", "herald:a:user:hex{0x7d}:state",
        ] {
            #expect(parsed(other) == nil, "\(other)")
        }
    }
}
