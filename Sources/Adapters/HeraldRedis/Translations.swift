import Foundation
import HeraldCore

// The translation cache (docs/behaviour.md §7a, docs/redis-keys.md "Translations"): what an app's translator answered,
// per (message, language), so the recipients of one message spread over batches and processes cost one call. All of
// an app's translations and their index share one hash tag (one Cluster slot), so a batch's lookups are one MGET per
// app and its writes one script per app, atomic with the index that bounds them.

extension RedisKeys {
    /// String: a translation of one message: 16 hex digits of the fingerprint of what was translated
    /// (`translationFingerprint`), then the translated text. With the TTL of the app's `translator.cache_ttl_seconds`.
    public static func translation(app: String, target: String, messageID: String) -> String {
        "\(prefix):\(app):translation:{t:\(app)}:\(translationMember(target: target, messageID: messageID))"
    }

    /// Sorted set: the app's kept translations (`<target>:<message id>`) by when they were written (epoch ms); the
    /// oldest beyond `translator.cache_max_entries` are deleted with their strings.
    public static func translations(app: String) -> String { "\(prefix):\(app):translations:{t:\(app)}" }

    /// What every translation key of `app` starts with: the key of a member of the index is this and the member.
    static func translationPrefix(app: String) -> String { "\(prefix):\(app):translation:{t:\(app)}:" }

    static func translationMember(target: String, messageID: String) -> String { "\(target):\(messageID)" }

    /// FNV-1a 64 over the source code, a zero byte and the text, in 16 hex digits: a kept translation of another text
    /// of the same message (an edit) is not taken for this one.
    static func translationFingerprint(source: String, text: String) -> String {
        let hex = String(fnv(source, then: text), radix: 16)
        return String(repeating: "0", count: 16 - hex.utf8.count) + hex
    }
}

/// One translation in the cache: the message, the language, and what was translated.
public struct CachedTranslationKey: Sendable, Hashable {
    public var app: String
    public var messageID: String
    /// The translator's code of the language (`fr`).
    public var target: String
    /// The source code sent with the text (`en`, `auto`).
    public var source: String
    public var text: String

    public init(app: String, messageID: String, target: String, source: String, text: String) {
        self.app = app
        self.messageID = messageID
        self.target = target
        self.source = source
        self.text = text
    }

    var key: String { RedisKeys.translation(app: app, target: target, messageID: messageID) }
    var fingerprint: String { RedisKeys.translationFingerprint(source: source, text: text) }
}

extension StateStore {
    /// The most bytes of translated text kept: a longer translation is used but not kept (so one app's cache holds at
    /// most `cache_max_entries` times this, docs/capacity.md). A push shows at most about 4 KB of text anyway.
    public static let translationMaxCachedBytes = 4_096

    /// The kept translation of each key (nil: none, expired, or one of another text), in one pipelined round trip:
    /// one `MGET` per app.
    public func cachedTranslations(_ keys: [CachedTranslationKey]) async throws -> [String?] {
        if keys.isEmpty { return [] }
        var apps = IndexGroups<String>(capacity: keys.count)
        for (index, key) in keys.enumerated() { apps.add(index, to: key.app) }
        let groups = apps.members()
        var batch = RedisBatch(capacity: 64 + keys.count * 96)
        for indices in groups {
            batch.command("MGET", arguments: indices.count)
            for index in indices { batch.argument(keys[index].key) }
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == groups.count else {
            throw RedisError(.unexpectedReply, "translations: expected \(groups.count) replies, got \(replies.count)")
        }
        var out = [String?](repeating: nil, count: keys.count)
        for (indices, reply) in zip(groups, replies) {
            guard let values = try reply.orThrow("MGET").array, values.count == indices.count else {
                throw RedisError(.unexpectedReply, "MGET of translations answered \(reply)")
            }
            for (index, value) in zip(indices, values) {
                guard let data = value.data else { continue }
                out[index] = Self.translation(stored: [UInt8](data), fingerprint: keys[index].fingerprint)
            }
        }
        return out
    }

    /// The text of a stored translation when it was made from what `fingerprint` names; nil otherwise.
    static func translation(stored: [UInt8], fingerprint: String) -> String? {
        let mark = Array(fingerprint.utf8)
        guard stored.count > mark.count, stored.starts(with: mark) else { return nil }
        return String(validating: stored[mark.count...], as: UTF8.self)
    }

    /// Keeps translations (at `now`, epoch ms), one script per app in one pipelined round trip: each string with
    /// its TTL, its member in the app's index; then the index loses the members older than the TTL and, beyond
    /// `maxEntries`, the oldest, whose strings are deleted with them. Translations longer than
    /// `translationMaxCachedBytes` are not kept. Returns how many translations the bound evicted.
    @discardableResult
    public func keepTranslations(
        _ entries: [(key: CachedTranslationKey, text: String)], ttlMilliseconds: Int64, maxEntries: Int, now: Int64
    ) async throws -> Int {
        let kept = entries.filter { $0.text.utf8.count <= Self.translationMaxCachedBytes }
        guard !kept.isEmpty, ttlMilliseconds > 0, maxEntries > 0 else { return 0 }
        var apps = IndexGroups<String>(capacity: kept.count)
        for (index, entry) in kept.enumerated() { apps.add(index, to: entry.key.app) }
        let groups = apps.members()
        let replies = try await TranslationScripts.keep.run(on: connection, what: "translation keep") { sha in
            var batch = RedisBatch(capacity: 128 + kept.reduce(0) { $0 + $1.text.utf8.count + 160 })
            for (app, indices) in zip(apps.keys, groups) {
                batch.command("EVALSHA", arguments: 2 + 1 + indices.count + 4 + indices.count)
                batch.argument(sha)
                batch.argument(Int64(1 + indices.count))
                batch.argument(RedisKeys.translations(app: app))
                for index in indices { batch.argument(kept[index].key.key) }
                batch.argument(ttlMilliseconds)
                batch.argument(Int64(maxEntries))
                batch.argument(now)
                batch.argument(RedisKeys.translationPrefix(app: app))
                for index in indices { batch.argument(kept[index].key.fingerprint + kept[index].text) }
            }
            return batch
        }
        var evicted = 0
        for reply in replies { evicted += Int(try reply.orThrow("EVALSHA translation keep").int ?? 0) }
        return evicted
    }
}

enum TranslationScripts {
    /// KEYS: the app's index, then the translations' strings. ARGV: TTL (ms), most entries, now (ms), the prefix of
    /// the app's translation keys, then the strings' values (in KEYS order). Writes each string with its TTL and its
    /// member (the key without the prefix) with `now` as its score; drops the members whose TTL ran out and, beyond
    /// the bound, the oldest members and their strings; the index lives as long as its newest entry. Answers how
    /// many the bound evicted.
    static let keep = LoadedScript(
        """
        local ttl, max, now, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
        for i = 2, #KEYS do
          redis.call('SET', KEYS[i], ARGV[i + 3], 'PX', ttl)
          redis.call('ZADD', KEYS[1], now, string.sub(KEYS[i], #prefix + 1))
        end
        redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now - ttl))
        local over = redis.call('ZCARD', KEYS[1]) - max
        if over > 0 then
          local old = redis.call('ZRANGE', KEYS[1], 0, over - 1)
          redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
          for _, member in ipairs(old) do redis.call('DEL', prefix .. member) end
        else
          over = 0
        end
        redis.call('PEXPIRE', KEYS[1], ttl)
        return over
        """)
}
