import Foundation
import HeraldCore

// Preferences changed field by field (docs/redis-keys.md, "Preference patches"): the stored JSON is read,
// changed and written back inside one Lua script, so two patches of different fields that race both survive
// (a read-modify-write in the client would let the later writer undo the earlier one's change).

extension StateStore {
    /// Applies `patch` to the user's stored preferences in one Lua script and returns the result. Stored
    /// preferences that are not valid JSON are treated as the defaults (as reads do) and replaced.
    ///
    /// The script checks `limits` itself, so every writer obeys them (the API, heraldctl and a raw herald.registry
    /// record alike): a patch after which the user would hold more conversations, or more bytes of JSON, than
    /// allowed changes nothing and throws `PreferenceLimitError`.
    @discardableResult
    public func patchPreferences(
        app: String, user: String, patch: PreferencePatch, limits: PreferenceLimits = PreferenceLimits()
    ) async throws -> Preferences {
        let json = patch.jsonBytes()
        let answer = try await connection.send(
            RedisCommand(
                "EVAL", PatchScripts.patchPreferences, 1,
                RedisKeys.userState(app: app, user: user), json, limits.maxConversations, limits.maxBytes))
        if case .error(let message) = answer, let over = PatchScripts.limitError(message) { throw over }
        let reply = try answer.orThrow("EVAL patchPreferences")
        guard let data = reply.data else { throw RedisError(.unexpectedReply, "preference patch answered \(reply)") }
        do {
            return try Preferences.fromJSON(data)
        } catch {
            throw RedisError(.unexpectedReply, "preference patch stored preferences that do not decode: \(error)")
        }
    }

    /// The user's stored preferences (the defaults when none are stored or they do not decode).
    public func preferences(app: String, user: String) async throws -> Preferences {
        let reply = try await connection.send(
            RedisCommand("HGET", RedisKeys.userState(app: app, user: user), UserRecord.preferencesField)
        ).orThrow("HGET")
        guard let data = reply.data else { return Preferences() }
        return (try? Preferences.fromJSON(data)) ?? Preferences()
    }
}

enum PatchScripts {
    /// KEYS: the user's state hash (its `p` field holds the preferences). ARGV: the patch JSON (`PreferencePatch`'s record form), the most
    /// conversations and the most bytes the stored JSON may have. Empty tables are dropped before encoding: cjson
    /// writes an empty table as `{}`, which is not a list. Returns the stored JSON, or an error reply
    /// `OVER_LIMIT conversations <n> <max>` / `OVER_LIMIT bytes <n> <max>` having written nothing.
    static let patchPreferences = """
        local raw = redis.call('HGET', KEYS[1], 'p')
        local prefs = {}
        if raw then
          local ok, v = pcall(cjson.decode, raw)
          if ok and type(v) == 'table' then prefs = v end
        end
        local patch = cjson.decode(ARGV[1])
        if type(patch.set) == 'table' then
          for k, v in pairs(patch.set) do prefs[k] = v end
        end
        if type(patch.clear) == 'table' then
          for _, k in ipairs(patch.clear) do prefs[k] = nil end
        end
        local convs = prefs.conversations
        if type(convs) ~= 'table' then convs = {} end
        if type(patch.conversations) == 'table' then
          for id, fields in pairs(patch.conversations) do
            local c = convs[id]
            if type(c) ~= 'table' then c = {} end
            for k, v in pairs(fields) do c[k] = v end
            convs[id] = c
          end
        end
        if type(patch.remove_conversations) == 'table' then
          for _, id in ipairs(patch.remove_conversations) do convs[id] = nil end
        end
        local count = 0
        for _ in pairs(convs) do count = count + 1 end
        local maxConvs = tonumber(ARGV[2])
        if count > maxConvs then
          return redis.error_reply('OVER_LIMIT conversations ' .. count .. ' ' .. maxConvs)
        end
        if next(convs) == nil then prefs.conversations = nil else prefs.conversations = convs end
        if type(prefs.languages) == 'table' and next(prefs.languages) == nil then prefs.languages = nil end
        local out = cjson.encode(prefs)
        local maxBytes = tonumber(ARGV[3])
        if #out > maxBytes then
          return redis.error_reply('OVER_LIMIT bytes ' .. #out .. ' ' .. maxBytes)
        end
        redis.call('HSET', KEYS[1], 'p', out)
        return out
        """

    /// The `PreferenceLimitError` an `OVER_LIMIT` error reply of the patch script stands for; nil for any other.
    static func limitError(_ message: String) -> PreferenceLimitError? {
        let words = message.split(separator: " ")
        guard let at = words.firstIndex(of: "OVER_LIMIT"), words.count >= at + 4 else { return nil }
        let (what, count, limit) = (words[at + 1], words[at + 2], words[at + 3])
        return what == "conversations" ? .conversations(count, limit: limit) : .bytes(count, limit: limit)
    }
}
