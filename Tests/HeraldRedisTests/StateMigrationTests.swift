import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@testable import HeraldRedis

/// `StateStore.migrateLegacyUserKeys`: the 0.9 layout (four keys per user, written here by hand with raw commands)
/// moved into the state hash, against a real redis-server and a real Redis Cluster.
@Suite("State migration from the 0.9 layout against a real redis-server", .serialized)
struct StateMigrationTests {
    static let t0: Int64 = 1_732_000_000_000
    /// A presence expiry Lua would print as `1.79e+12`.
    static let live: Int64 = 1_790_000_000_000

    static func token(_ n: Int) -> String {
        String(repeating: String(format: "%02x", n % 256), count: 32)
    }

    static func key(_ app: String, _ user: String, _ part: RedisKeys.UserPart) -> String {
        RedisKeys.rawUser(app: app, user: user, part)
    }

    /// The old keys of one user: two devices (the first online until `live`, the second's presence expired at
    /// t0 - 1), preferences, an unread total and one conversation's count.
    struct Legacy {
        var devices: [Device]
        var preferences: Preferences
        var unread: Unread

        init(_ n: Int) {
            devices = [
                Device(
                    token: StateMigrationTests.token(n), kind: .apns, environment: .sandbox, bundleID: "com.x",
                    registeredAt: StateMigrationTests.t0 + 2),
                Device(token: "fcm-\(n):x", kind: .fcm, registeredAt: StateMigrationTests.t0 + 1, providerID: "p1"),
            ]
            preferences = Preferences(trigger: .mentionOnly, displayName: "User \(n)", languages: ["de"], badge: false)
            unread = Unread(total: 5 + n, conversations: ["x": 3, "y:z": n])
        }

        /// The state `loadUser` should give back at t0: devices oldest first, only the first one online.
        var state: UserState {
            UserState(
                devices: devices.sorted { $0.registeredAt < $1.registeredAt }, online: [devices[0].token],
                preferences: preferences, unread: unread)
        }

        func write(app: String, user: String, on redis: RedisConnection) async throws {
            for device in devices {
                try await redis.send(
                    "HSET", StateMigrationTests.key(app, user, .devices), device.token, device.jsonBytes()
                ).orThrow()
            }
            try await redis.send(
                "ZADD", StateMigrationTests.key(app, user, .presence), StateMigrationTests.live, devices[0].token,
                StateMigrationTests.t0 - 1, devices[1].token
            ).orThrow()
            try await redis.send("SET", StateMigrationTests.key(app, user, .preferences), preferences.jsonBytes())
                .orThrow()
            var counts: [any RedisArgument] = [StateMigrationTests.key(app, user, .unread), "total", unread.total]
            for (conversation, count) in unread.conversations {
                counts.append(RedisKeys.unreadField(conversation: conversation))
                counts.append(count)
            }
            try await redis.send(RedisCommand("HSET", counts)).orThrow()
        }
    }

    static func exists(_ redis: RedisConnection, _ key: String) async throws -> Bool {
        try await redis.send("EXISTS", key).orThrow().int == 1
    }

    static func oldKeysLeft(_ redis: RedisConnection, app: String, user: String) async throws -> [RedisKeys.UserPart] {
        var left: [RedisKeys.UserPart] = []
        for part in StateStore.legacyUserParts {
            if try await exists(redis, key(app, user, part)) { left.append(part) }
        }
        return left
    }

    @Test("the four old keys become the state hash: devices, live presence, preferences, unread; then deleted")
    func migratesUsers() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)

        let users = (0..<5).map { "u\($0)" }
        for (n, user) in users.enumerated() { try await Legacy(n).write(app: "a", user: user, on: redis) }
        // Keys the migration must leave alone: the user's mentions and counted marks, and the same users of another
        // app, of an app the pattern `x?` would match unescaped, and of an app whose id begins with "a".
        try await redis.send("HSET", Self.key("a", "u0", .mentions), "total", 2).orThrow()
        try await redis.send("SET", "herald:a:user:{u0}:counted:e1", 1).orThrow()
        try await Legacy(0).write(app: "b", user: "u0", on: redis)
        try await Legacy(0).write(app: "xy", user: "u0", on: redis)
        try await Legacy(0).write(app: "ab", user: "u0", on: redis)

        #expect(try await store.countLegacyUserKeys(app: "a") == 20)
        var reports: [LegacyMigration] = []
        let result = try await store.migrateLegacyUserKeys(app: "a", batch: 2, now: Self.t0) { reports.append($0) }
        #expect(result == LegacyMigration(users: 5, keysDeleted: 20, keysSkipped: 0))
        #expect(reports.last == result)
        #expect(reports.count >= 3)  // 5 users, 2 per round trip
        #expect(zip(reports, reports.dropFirst()).allSatisfy { $0.users <= $1.users })

        for (n, user) in users.enumerated() {
            #expect(try await store.loadUser(app: "a", user: user, now: Self.t0) == Legacy(n).state, "user \(user)")
            #expect(try await Self.oldKeysLeft(redis, app: "a", user: user).isEmpty, "user \(user)")
        }
        // The presence expiry is written as digits, and the expired entry is gone.
        let online = try await redis.send("HGET", RedisKeys.userState(app: "a", user: "u0"), "o").orThrow().text
        #expect(online == "\(Self.live) \(Self.token(0))")
        // An expiry 1.79e12 is understood by the new version's presence script as well.
        try await store.setDevicePresence(
            app: "a", user: "u0", token: "fcm-0:x", online: true, ttlMilliseconds: 1000, now: Self.t0)
        #expect(Set(try await store.loadUser(app: "a", user: "u0", now: Self.t0).online) == [Self.token(0), "fcm-0:x"])

        // Untouched: mentions, counted marks, other apps.
        #expect(try await redis.send("HGET", Self.key("a", "u0", .mentions), "total").orThrow().int == 2)
        #expect(try await Self.exists(redis, "herald:a:user:{u0}:counted:e1"))
        for app in ["b", "xy", "ab"] {
            #expect(try await Self.oldKeysLeft(redis, app: app, user: "u0").count == 4, "app \(app)")
            #expect(try await !Self.exists(redis, RedisKeys.userState(app: app, user: "u0")), "app \(app)")
        }

        // A second run finds nothing.
        #expect(try await store.migrateLegacyUserKeys(app: "a", batch: 2, now: Self.t0) == LegacyMigration())
        #expect(try await store.countLegacyUserKeys(app: "a") == 0)
        // The pattern's glob characters are escaped: "x?" names no key of "xy".
        #expect(try await store.migrateLegacyUserKeys(app: "x?", now: Self.t0) == LegacyMigration())
        #expect(try await Self.oldKeysLeft(redis, app: "xy", user: "u0").count == 4)
        // Another app is migrated on its own.
        #expect(
            try await store.migrateLegacyUserKeys(app: "ab", now: Self.t0) == LegacyMigration(users: 1, keysDeleted: 4))
        #expect(try await store.loadUser(app: "ab", user: "u0", now: Self.t0) == Legacy(0).state)
        #expect(try await Self.oldKeysLeft(redis, app: "b", user: "u0").count == 4)
    }

    @Test("fields the state hash already holds win; counts merge field by field; empty results write no field")
    func mergesWithNewState() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)

        // u1: written by the new version after the upgrade: preferences, one device, a total and one count.
        try await Legacy(1).write(app: "a", user: "u1", on: redis)
        let newer = Preferences(trigger: .off, displayName: "Newer")
        try await store.setPreferences(app: "a", user: "u1", preferences: newer)
        let device = Device(token: Self.token(77), registeredAt: Self.t0 + 9)
        try await store.registerDevice(app: "a", user: "u1", device: device)
        try await redis.send("HSET", RedisKeys.userState(app: "a", user: "u1"), "total", 40, "c:x", 30).orThrow()
        // u2: only expired presence and empty preferences: nothing to write, the keys still go.
        try await redis.send("ZADD", Self.key("a", "u2", .presence), Self.t0, "gone").orThrow()
        try await redis.send("SET", Self.key("a", "u2", .preferences), "").orThrow()
        // u3: old devices, one JSON entry with line breaks (pretty-printed by hand), a field of another name in the
        // unread hash, and presence stored as a hash (not 0.9's form): left in place.
        let pretty = Device(token: Self.token(3), registeredAt: Self.t0)
        let prettyJSON = String(decoding: pretty.jsonBytes(), as: UTF8.self).replacingOccurrences(of: ",", with: ",\n")
        try await redis.send("HSET", Self.key("a", "u3", .devices), pretty.token, prettyJSON).orThrow()
        try await redis.send("HSET", Self.key("a", "u3", .unread), "total", 4, "d", "junk").orThrow()
        try await redis.send("HSET", Self.key("a", "u3", .presence), "f", "v").orThrow()

        let result = try await store.migrateLegacyUserKeys(app: "a", batch: 500, now: Self.t0)
        #expect(result == LegacyMigration(users: 3, keysDeleted: 4 + 2 + 2, keysSkipped: 1))

        let u1 = try await store.loadUser(app: "a", user: "u1", now: Self.t0)
        #expect(u1.preferences == newer)
        #expect(u1.devices == [device])
        // The state hash had no `o`: the old live entry is kept (presence is merged on its own, like every field).
        #expect(u1.online == [Self.token(1)])
        #expect(u1.unread == Unread(total: 40, conversations: ["x": 30, "y:z": 1]))

        let u2 = RedisKeys.userState(app: "a", user: "u2")
        #expect(try await !Self.exists(redis, u2))
        #expect(try await Self.oldKeysLeft(redis, app: "a", user: "u2").isEmpty)

        let u3 = try await store.loadUser(app: "a", user: "u3", now: Self.t0)
        #expect(u3.devices == [pretty])
        #expect(u3.unread == Unread(total: 4))
        #expect(try await redis.send("HEXISTS", RedisKeys.userState(app: "a", user: "u3"), "d").orThrow().int == 1)
        #expect(try await Self.oldKeysLeft(redis, app: "a", user: "u3") == [.presence])

        // Run again: nothing moves; the key of the wrong type is still reported, once.
        #expect(
            try await store.migrateLegacyUserKeys(app: "a", batch: 1, now: Self.t0) == LegacyMigration(keysSkipped: 1))
        #expect(try await store.loadUser(app: "a", user: "u3", now: Self.t0) == u3)
    }

    @Test("old key names are recognised exactly; glob characters of the app id are escaped")
    func keyNames() {
        func parsed(_ key: String) -> String? {
            StateStore.legacyUserKey(key, app: "a").map { "\($0.user) \($0.part.rawValue)" }
        }
        #expect(parsed("herald:a:user:{u}:devices") == "u devices")
        #expect(parsed("herald:a:user:{u}:prefs") == "u prefs")
        #expect(parsed("herald:a:user:{a}b}:unread") == "a}b unread")
        #expect(parsed("herald:a:user:{}:presence") == " presence")
        #expect(parsed("herald:a:user:{e\u{301}}:presence") == "e\u{301} presence")
        // A user id that begins with a combining mark (it joins the `{` into one character).
        #expect(parsed("herald:a:user:{\u{301}u}:presence") == "\u{301}u presence")
        for other in [
            "herald:a:user:{u}:state", "herald:a:user:{u}:mentions", "herald:a:user:{u}:counted:e",
            "herald:b:user:{u}:devices",
            "herald:a:user:u:devices", "herald:a:user:{u}:devicesx", "herald:a:user:{}:device",
        ] {
            #expect(parsed(other) == nil, "\(other)")
        }
        #expect(StateStore.globEscaped(#"a*b?c[d]e\f:g"#) == #"a\*b\?c\[d\]e\\f:g"#)
    }

    @Test("on a Redis Cluster: every master is scanned and each user moves on the master of their slot")
    func cluster() async throws {
        let cluster = try await RedisTestCluster.start()
        defer { cluster.stop() }
        var configuration = try RedisConfiguration(url: cluster.url)
        configuration.connectTimeout = .seconds(1)
        configuration.commandTimeout = .seconds(5)
        let redis = RedisConnection(configuration: configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)

        let users = (0..<40).map { "user-\($0)" }
        for (n, user) in users.enumerated() { try await Legacy(n).write(app: "a", user: user, on: redis) }
        try await Legacy(0).write(app: "b", user: users[0], on: redis)
        // The users are spread over every master.
        var owners = Set<RedisNodeAddress>()
        for user in users {
            if let node = try await redis.clusterRouter?.node(forSlot: RedisSlot.of(Self.key("a", user, .devices))) {
                owners.insert(node)
            }
        }
        #expect(owners.count == 3)
        #expect(try await redis.masterConnections().count == 3)

        #expect(try await store.countLegacyUserKeys(app: "a") == 4 * users.count)
        var reports = 0
        let result = try await store.migrateLegacyUserKeys(app: "a", batch: 7, now: Self.t0) { _ in reports += 1 }
        #expect(result == LegacyMigration(users: users.count, keysDeleted: 4 * users.count))
        #expect(reports >= 6)
        let loaded = try await store.loadUsers(app: "a", users: users, now: Self.t0)
        for (n, user) in users.enumerated() {
            #expect(loaded[user] == Legacy(n).state, "user \(user)")
            #expect(try await Self.oldKeysLeft(redis, app: "a", user: user).isEmpty, "user \(user)")
        }
        #expect(try await Self.oldKeysLeft(redis, app: "b", user: users[0]).count == 4)
        #expect(try await store.migrateLegacyUserKeys(app: "a", now: Self.t0) == LegacyMigration())
    }
}
