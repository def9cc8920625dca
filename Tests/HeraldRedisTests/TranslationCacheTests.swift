import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// The translation cache on a real redis-server (docs/redis-keys.md, "Translations"): a kept translation is found
/// again, with its TTL; another text of the same message is not taken for it; an app keeps at most its bound, the
/// oldest going first with their strings; a translation too long to keep is not written.
@Suite("Translation cache in Redis")
struct TranslationCacheTests {
    static func key(
        _ message: String, app: String = "a", target: String = "fr", text: String? = nil
    )
        -> CachedTranslationKey
    {
        CachedTranslationKey(
            app: app, messageID: message, target: target, source: "en", text: text ?? "text of \(message)")
    }

    @Test("a kept translation is found by the next lookup, with the TTL set; other languages and apps are not")
    func hitAfterStore() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let now: Int64 = 1_732_000_000_000
        #expect(try await store.cachedTranslations([Self.key("m1")]) == [nil])
        let kept = ContinuousClock.now
        try await store.keepTranslations(
            [(Self.key("m1"), "Bonne nuit — 🌙"), (Self.key("m2"), "Au revoir !")], ttlMilliseconds: 60_000,
            maxEntries: 100, now: now)
        let found = try await store.cachedTranslations([
            Self.key("m2"), Self.key("m1"), Self.key("m1", target: "de"), Self.key("m1", app: "b"), Self.key("m3"),
        ])
        #expect(found == ["Au revoir !", "Bonne nuit — 🌙", nil, nil, nil])
        let key = RedisKeys.translation(app: "a", target: "fr", messageID: "m1")
        #expect(key == "herald:a:translation:{t:a}:fr:m1")
        let ttl = try #require(try await redis.send("PTTL", key).int)
        let indexTTL = try #require(try await redis.send("PTTL", RedisKeys.translations(app: "a")).int)
        // Set to 60 s when kept: at most what has passed since then is gone, however busy the host is.
        let passed = Int64(((ContinuousClock.now - kept) / .milliseconds(1)).rounded(.up))
        #expect(ttl >= 60_000 - passed && ttl <= 60_000, "PTTL \(ttl), \(passed) ms after keeping")
        #expect(indexTTL >= 60_000 - passed && indexTTL <= 60_000, "index PTTL \(indexTTL), \(passed) ms after keeping")
        #expect(try await redis.send("ZCARD", RedisKeys.translations(app: "a")).int == 2)
    }

    @Test("another text of the same message (an edit) is a miss, and its translation replaces the first")
    func editedMessage() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let first = Self.key("m1", text: "Good night")
        let edited = Self.key("m1", text: "Good night, all")
        try await store.keepTranslations([(first, "Bonne nuit")], ttlMilliseconds: 60_000, maxEntries: 10, now: 1)
        #expect(try await store.cachedTranslations([edited, first]) == [nil, "Bonne nuit"])
        let auto = CachedTranslationKey(app: "a", messageID: "m1", target: "fr", source: "auto", text: "Good night")
        #expect(try await store.cachedTranslations([auto]) == [nil])
        try await store.keepTranslations(
            [(edited, "Bonne nuit à tous")], ttlMilliseconds: 60_000, maxEntries: 10, now: 2)
        #expect(try await store.cachedTranslations([edited, first]) == ["Bonne nuit à tous", nil])
        #expect(try await redis.send("ZCARD", RedisKeys.translations(app: "a")).int == 1)
    }

    @Test("an app keeps at most its bound: the oldest go first, their strings deleted; other apps keep theirs")
    func bound() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        try await store.keepTranslations(
            [(Self.key("b1", app: "b"), "B")], ttlMilliseconds: 60_000, maxEntries: 3, now: 1)
        var evicted = 0
        for n in 1...5 {
            evicted += try await store.keepTranslations(
                [(Self.key("m\(n)"), "t\(n)")], ttlMilliseconds: 60_000, maxEntries: 3, now: Int64(n) * 10)
        }
        #expect(evicted == 2)
        let found = try await store.cachedTranslations((1...5).map { Self.key("m\($0)") } + [Self.key("b1", app: "b")])
        #expect(found == [nil, nil, "t3", "t4", "t5", "B"])
        #expect(try await redis.send("ZCARD", RedisKeys.translations(app: "a")).int == 3)
        #expect(try await redis.send("EXISTS", RedisKeys.translation(app: "a", target: "fr", messageID: "m1")).int == 0)
        // One write of more than the bound keeps the bound's worth.
        evicted = try await store.keepTranslations(
            (6...10).map { (Self.key("m\($0)"), "t\($0)") }, ttlMilliseconds: 60_000, maxEntries: 3, now: 100)
        #expect(evicted == 5)
        #expect(try await redis.send("ZCARD", RedisKeys.translations(app: "a")).int == 3)
        // Members whose TTL ran out leave the index on the next write.
        try await store.keepTranslations(
            [(Self.key("m11"), "t11")], ttlMilliseconds: 60_000, maxEntries: 3, now: 70_000)
        #expect(try await redis.send("ZCARD", RedisKeys.translations(app: "a")).int == 1)
    }

    @Test("a translation longer than the cache keeps is not written; one that does not read as UTF-8 is not served")
    func tooLong() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let long = String(repeating: "é", count: StateStore.translationMaxCachedBytes / 2 + 1)
        #expect(
            try await store.keepTranslations([(Self.key("m1"), long)], ttlMilliseconds: 60_000, maxEntries: 3, now: 1)
                == 0)
        #expect(try await redis.send("EXISTS", RedisKeys.translations(app: "a")).int == 0)
        #expect(try await store.cachedTranslations([Self.key("m1")]) == [nil])
        // A value written by something else: not a translation of this text.
        _ = try await redis.send("SET", RedisKeys.translation(app: "a", target: "fr", messageID: "m2"), "junk")
        #expect(try await store.cachedTranslations([Self.key("m2")]) == [nil])
    }
}
