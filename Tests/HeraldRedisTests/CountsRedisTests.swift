import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// The Redis scripts of the Herald-kept counts give what the in-memory rules (`CountBook`) give, step by step,
/// and a replay never counts twice (docs/redis-keys.md, "Counts").
@Suite("Counts in Redis")
struct CountsRedisTests {
    @Test("count, replay, mark_read and set_unread in Redis match CountBook")
    func matchesBook() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        var book = CountBook()
        enum Step { case count([CountKey]), read(String, String?), set(String, Unread) }
        func k(_ user: String, _ event: String, _ conv: String, _ mentioned: Bool = false) -> CountKey {
            CountKey(user: user, eventID: event, conversation: conv, mentioned: mentioned)
        }
        let steps: [Step] = [
            .count([k("u2", "e1", "c1"), k("u3", "e1", "c1", true), k("u2", "e2", "c1", true), k("u2", "e3", "c2")]),
            .count([k("u2", "e2", "c1", true), k("u3", "e1", "c1", true)]),  // replays
            .read("u2", "c1"),
            .count([k("u2", "e4", "c1", true), k("u2", "e5", "c2")]),
            .set("u2", Unread(total: 10, conversations: ["c1": 6, "c2": 4])),
            .count([k("u2", "e6", "c2", true)]),
            .read("u3", nil),
            .count([k("u3", "e7", "c1")]),
            .set("u4", Unread(total: 1, conversations: ["c1": 5])),
            .read("u4", "c1"),
        ]
        for (n, step) in steps.enumerated() {
            switch step {
            case .count(let keys):
                let got = try await store.countMessages(app: "a", keys, markerTTLMilliseconds: 60_000)
                let want = keys.map { book.count($0) }
                #expect(got == want, "step \(n)")
            case .read(let user, let conv):
                try await store.markRead(app: "a", user: user, conversation: conv)
                book.markRead(user: user, conversation: conv)
            case .set(let user, let value):
                try await store.setUnread(app: "a", user: user, unread: value)
                book.setUnread(user: user, value)
            }
            for user in ["u2", "u3", "u4"] {
                let stored = try await store.withMentionCounts(
                    app: "a", user: user,
                    unread: try await store.loadUser(app: "a", user: user, now: 0).unread)
                #expect(stored == (book.unread[user] ?? Unread()), "step \(n), \(user)")
            }
        }
    }

    @Test("a replay within the marker TTL counts nothing; the marker carries that TTL")
    func markerTTL() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let key = CountKey(user: "u2", eventID: "e1", conversation: "c1", mentioned: false)
        // A TTL long enough that a starved test process (parallel suites on 2 cores) cannot outlive it.
        let markerTTL: Int64 = 600_000
        #expect(try await store.countMessages(app: "a", [key], markerTTLMilliseconds: markerTTL)[0].counted)
        #expect(try await !store.countMessages(app: "a", [key], markerTTLMilliseconds: markerTTL)[0].counted)
        let ttl =
            try await redis.send(RedisCommand("PTTL", RedisKeys.counted(app: "a", user: "u2", eventID: "e1"))).int ?? -1
        #expect(ttl > 0 && ttl <= markerTTL)
        // Once the marker is gone (expired), the event counts again.
        _ = try await redis.send(RedisCommand("DEL", RedisKeys.counted(app: "a", user: "u2", eventID: "e1")))
        #expect(try await store.countMessages(app: "a", [key], markerTTLMilliseconds: markerTTL)[0].counted)
    }
}

/// The Lua patch script stores what `PreferencePatch.apply(to:)` gives, from stored, absent and corrupt preferences.
@Suite("Preference patches in Redis")
struct PreferencePatchRedisTests {
    @Test("the script and the Swift rule agree, patch after patch")
    func scriptMatchesRule() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let bodies = [
            #"{"trigger": "mention_only", "languages": ["fr", "de"], "display_name": "Cindy"}"#,
            #"{"conversations": {"c1": {"muted": true}, "c2": {"trigger": "off"}}}"#,
            #"{"dnd": {"start": "22:00", "end": "08:00", "timezone": "Asia/Seoul"}, "snooze": {"start": 1732000000000, "end": 1732003600000}}"#,
            #"{"conversations": {"c1": {"trigger": "all"}, "c2": null}, "badge": false, "display_style": "simple_banner"}"#,
            #"{"dnd": null, "languages": [], "display_name": null, "template": "alternative"}"#,
            #"{"conversations": {"c1": null}, "trigger": null, "badge": null}"#,
        ]
        var expected = Preferences()
        for body in bodies {
            let patch = try PreferencePatch.parse(Array(body.utf8))
            expected = patch.apply(to: expected)
            let stored = try await store.patchPreferences(app: "a", user: "u", patch: patch)
            #expect(stored == expected, "\(body)")
            #expect(try await store.preferences(app: "a", user: "u") == expected)
        }
        // Corrupt stored preferences count as the defaults, as reads do.
        _ = try await redis.send(RedisCommand("HSET", RedisKeys.userState(app: "a", user: "bad"), "p", "{not json"))
        let patch = try PreferencePatch.parse(Array(#"{"badge": false}"#.utf8))
        #expect(try await store.patchPreferences(app: "a", user: "bad", patch: patch) == Preferences(badge: false))
    }
}
