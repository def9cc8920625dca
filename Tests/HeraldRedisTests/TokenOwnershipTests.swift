// Token ownership: one owner per token and app (an account switch moves the token), Sendbird's
// `unique: true`, and the 20-device cap counted per device kind. Against a real redis-server.

import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

@Suite("Token ownership against a real redis-server")
struct TokenOwnershipTests {
    static let t0: Int64 = 1_732_000_000_000

    static func token(_ n: Int, _ prefix: String = "") -> String {
        prefix + String(repeating: String(format: "%02x", n % 256), count: 32)
    }

    func withStore(_ body: (StateStore) async throws -> Void) async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        try await body(StateStore(connection: redis))
    }

    @Test("registering a token for another user moves it: gone from the old owner with its presence")
    func accountSwitch() async throws {
        try await withStore { store in
            let t = Self.token(1)
            try await store.registerDevice(app: "a", user: "alice", device: Device(token: t, registeredAt: Self.t0))
            try await store.registerDevice(
                app: "a", user: "alice", device: Device(token: Self.token(2), registeredAt: Self.t0))
            try await store.setPresence(app: "a", user: "alice", online: [t], ttlMilliseconds: 60_000, now: Self.t0)
            #expect(try await store.owner(app: "a", token: t) == "alice")

            let r = try await store.registerDeviceReporting(
                app: "a", user: "bob", device: Device(token: t, registeredAt: Self.t0 + 5))
            #expect(r.movedFrom == "alice" && r.evicted.isEmpty)
            #expect(try await store.owner(app: "a", token: t) == "bob")
            let alice = try await store.loadUser(app: "a", user: "alice", now: Self.t0)
            #expect(alice.devices.map(\.token) == [Self.token(2)])
            #expect(alice.online.isEmpty)
            #expect(try await store.loadUser(app: "a", user: "bob", now: Self.t0).devices.map(\.token) == [t])

            // Registering again for the same owner moves nothing; another app is another owner space.
            #expect(
                try await store.registerDeviceReporting(
                    app: "a", user: "bob", device: Device(token: t, registeredAt: Self.t0 + 6)
                ).movedFrom == nil)
            try await store.registerDevice(app: "b", user: "carol", device: Device(token: t, registeredAt: Self.t0))
            #expect(try await store.loadUser(app: "a", user: "bob", now: Self.t0).devices.map(\.token) == [t])

            // The old owner unregistering the token does not release the new owner's index entry.
            #expect(try await !store.unregisterDevice(app: "a", user: "alice", token: t))
            #expect(try await store.owner(app: "a", token: t) == "bob")
            #expect(try await store.unregisterDevice(app: "a", user: "bob", token: t))
            #expect(try await store.owner(app: "a", token: t) == nil)
        }
    }

    @Test("unregister_all, eviction and dead-token removal release the owner index")
    func ownerIndexCleanup() async throws {
        try await withStore { store in
            for n in 0..<3 {
                try await store.registerDevice(
                    app: "a", user: "u", device: Device(token: Self.token(n), registeredAt: Self.t0 + Int64(n)))
            }
            #expect(
                try await store.removeDeadToken(app: "a", user: "u", token: Self.token(0), deadSince: Self.t0 + 10)
                    == .removed)
            #expect(try await store.owner(app: "a", token: Self.token(0)) == nil)
            #expect(try await store.unregisterAll(app: "a", user: "u") == 2)
            #expect(try await store.owner(app: "a", token: Self.token(1)) == nil)
            #expect(try await store.owner(app: "a", token: Self.token(2)) == nil)
        }
    }

    @Test("unique: true leaves the user one token of that kind; other kinds stay (Sendbird semantics)")
    func unique() async throws {
        try await withStore { store in
            let a = Self.token(1), b = Self.token(2), v = Self.token(3), f = "fcm-" + Self.token(4), c = Self.token(5)
            try await store.registerDevice(app: "a", user: "u", device: Device(token: a, registeredAt: Self.t0))
            try await store.registerDevice(app: "a", user: "u", device: Device(token: b, registeredAt: Self.t0 + 1))
            try await store.registerDevice(
                app: "a", user: "u", device: Device(token: v, kind: .voip, registeredAt: Self.t0 + 2))
            try await store.registerDevice(
                app: "a", user: "u", device: Device(token: f, kind: .fcm, registeredAt: Self.t0 + 3))
            let unique = Device(token: c, registeredAt: Self.t0 + 4)
            let evicted = try await store.registerDevice(app: "a", user: "u", device: unique, unique: true)
            #expect(Set(evicted) == [a, b])
            let state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
            #expect(Set(state.devices.map(\.token)) == [c, v, f])
            #expect(try await store.owner(app: "a", token: a) == nil)
            #expect(try await store.owner(app: "a", token: c) == "u")

            // The same through the core's in-memory rule.
            var model = UserState()
            model.register(Device(token: a, registeredAt: Self.t0));
            model.register(Device(token: b, registeredAt: Self.t0 + 1))
            model.register(Device(token: v, kind: .voip, registeredAt: Self.t0 + 2))
            model.register(Device(token: f, kind: .fcm, registeredAt: Self.t0 + 3))
            #expect(Set(model.register(unique, unique: true).map(\.token)) == [a, b])
            #expect(Set(model.devices) == Set(state.devices))

            // unique on an already unique token evicts nothing.
            #expect(try await store.registerDevice(app: "a", user: "u", device: unique, unique: true).isEmpty)
        }
    }

    @Test("the 20-device cap counts each kind separately: VoIP tokens do not evict APNs tokens")
    func capPerKind() async throws {
        try await withStore { store in
            var model = UserState()
            for n in 0..<20 {
                let d = Device(token: Self.token(n), registeredAt: Self.t0 + Int64(n))
                #expect(try await store.registerDevice(app: "a", user: "u", device: d).isEmpty)
                model.register(d)
            }
            for n in 0..<20 {
                let d = Device(token: Self.token(100 + n), kind: .voip, registeredAt: Self.t0 + Int64(n))
                #expect(try await store.registerDevice(app: "a", user: "u", device: d).isEmpty)
                model.register(d)
            }
            var state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
            #expect(state.devices.count == 40)
            let apns21 = Device(token: Self.token(50), registeredAt: Self.t0 + 100)
            #expect(try await store.registerDevice(app: "a", user: "u", device: apns21) == [Self.token(0)])
            #expect(model.register(apns21).map(\.token) == [Self.token(0)])
            let voip21 = Device(token: Self.token(150), kind: .voip, registeredAt: Self.t0 + 100)
            #expect(try await store.registerDevice(app: "a", user: "u", device: voip21) == [Self.token(100)])
            #expect(model.register(voip21).map(\.token) == [Self.token(100)])
            state = try await store.loadUser(app: "a", user: "u", now: Self.t0)
            #expect(state.devices.filter { $0.kind == .apns }.count == 20)
            #expect(state.devices.filter { $0.kind == .voip }.count == 20)
            #expect(Set(model.devices) == Set(state.devices))
        }
    }

    @Test("a state fixture load writes the owner index")
    func fixtureOwners() async throws {
        try await withStore { store in
            let fixture = StateFixture(users: [
                "u1": UserState(devices: [Device(token: Self.token(7), registeredAt: Self.t0)])
            ])
            try await store.loadFixture(app: "a", fixture: fixture, presenceTTLMilliseconds: 60_000, now: Self.t0)
            #expect(try await store.owner(app: "a", token: Self.token(7)) == "u1")
            // A later registration for someone else moves it out of the fixture user.
            try await store.registerDevice(
                app: "a", user: "u2", device: Device(token: Self.token(7), registeredAt: Self.t0 + 1))
            #expect(try await store.loadUser(app: "a", user: "u1", now: Self.t0).devices.isEmpty)
        }
    }
}
