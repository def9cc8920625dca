import Foundation
import HeraldCore

// Unread and mention counts kept by Herald (an app's `counts: true`, docs/behaviour.md §12): every message
// event counts once for each recipient, in one Lua script per (event, recipient) that also sets the marker
// making a replay count nothing (docs/redis-keys.md, "Counts").

extension RedisKeys {
    /// Hash: `total` -> mentions not yet read, `c:<conversation>` -> per conversation (like `unread`).
    public static func mentions(app: String, user: String) -> String { Self.user(app: app, user: user, .mentions) }
    /// String with a TTL: this event was counted for this user (so a replay is not counted again).
    public static func counted(app: String, user: String, eventID: String) -> String {
        userPrefix(app: app, user: user) + "counted:" + eventID
    }
}

extension StateStore {
    /// Counts each (event, recipient) once: when its marker is new, the unread total and the conversation's
    /// count go up by one, and the mention counts too when the recipient is mentioned. One pipelined round trip
    /// (one script per key, each atomic); the answers are the counts afterwards, in order.
    /// - Parameter markerTTLMilliseconds: how long a replay of the event is recognised.
    public func countMessages(
        app: String, _ keys: [CountKey], markerTTLMilliseconds: Int64
    ) async throws -> [CountsAfter] {
        if keys.isEmpty { return [] }
        let commands = keys.map { k in
            RedisCommand(
                "EVAL", CountScripts.count, 3,
                RedisKeys.userState(app: app, user: k.user), RedisKeys.mentions(app: app, user: k.user),
                RedisKeys.counted(app: app, user: k.user, eventID: k.eventID),
                RedisKeys.unreadField(conversation: k.conversation), k.mentioned ? 1 : 0, markerTTLMilliseconds)
        }
        let replies = try await connection.pipeline(commands)
        guard replies.count == commands.count else {
            throw RedisError(.unexpectedReply, "expected \(commands.count) replies, got \(replies.count)")
        }
        return try replies.map { reply in
            guard let values = try reply.orThrow("EVAL count").array, values.count == 6 else {
                throw RedisError(.unexpectedReply, "count script answered \(reply)")
            }
            let n = values.map { Int($0.int ?? 0) }
            return CountsAfter(
                counted: n[0] == 1, unreadTotal: n[1], unreadConversation: n[2],
                mentionTotal: n[3], mentionConversation: n[4], mentionedConversations: n[5])
        }
    }

    /// Resets the unread and mention counts of one conversation (the totals drop by what it held, never below
    /// 0), or every count of the user when `conversation` is nil, and takes what was read out of the user's digest
    /// (docs/behaviour.md §6d). Atomic (one script).
    public func markRead(app: String, user: String, conversation: String?) async throws {
        let field = conversation.map { RedisKeys.unreadField(conversation: $0) } ?? ""
        _ = try await connection.send(
            RedisCommand(
                "EVAL", CountScripts.markRead, 3,
                RedisKeys.userState(app: app, user: user), RedisKeys.mentions(app: app, user: user),
                RedisKeys.digest(app: app, user: user), field)
        ).orThrow("EVAL markRead")
    }

    /// `unread` with the user's Herald-kept mention counts filled in (zero when none are kept).
    public func withMentionCounts(app: String, user: String, unread: Unread) async throws -> Unread {
        let reply = try await connection.send(RedisCommand("HGETALL", RedisKeys.mentions(app: app, user: user)))
            .orThrow("HGETALL")
        var counts = unread
        counts.mentionTotal = 0
        counts.mentionConversations = [:]
        let values = reply.array ?? []
        var i = 0
        while i + 1 < values.count {
            if let field = values[i].text {
                var total: Int? = counts.mentionTotal
                _ = CountFields.read(
                    field, values[i + 1], total: &total, conversations: &counts.mentionConversations)
                counts.mentionTotal = total ?? 0
            }
            i += 2
        }
        return counts
    }
}

/// The fields of a hash of counts (the state hash's unread counts, the mentions hash): `total` and
/// `c:<conversation>`.
enum CountFields {
    /// Reads one field into `total` or `conversations`; false when it is not a count field. A value that is not an
    /// integer reads as no count (and leaves `total` as it was: nil when no total was read).
    static func read(
        _ field: String, _ value: RedisValue, total: inout Int?, conversations: inout [String: Int]
    ) -> Bool {
        if field == RedisKeys.unreadTotalField {
            if let n = value.int { total = Int(n) }
            return true
        }
        guard field.hasPrefix("c:") else { return false }
        if let n = value.int { conversations[String(field.dropFirst(2))] = Int(n) }
        return true
    }
}

enum CountScripts {
    /// Lua: `drop_counts(key)` deletes the `total` and `c:` fields of a hash, leaving its other fields.
    static let dropCounts = """
        local function drop_counts(key)
          for _, f in ipairs(redis.call('HKEYS', key)) do
            if f == 'total' or string.sub(f, 1, 2) == 'c:' then redis.call('HDEL', key, f) end
          end
        end

        """

    /// KEYS: the user's state hash (its unread fields), mentions hash, marker. ARGV: the conversation's field, mentioned (1/0), marker TTL ms.
    /// Returns {counted (1/0), unread total, unread of the conversation, mention total, mentions of the conversation,
    /// conversations holding a mention (the mentions hash's `c:` fields: a read conversation's field is deleted)}.
    static let count = """
        local counted = redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[3])
        if counted then
          redis.call('HINCRBY', KEYS[1], 'total', 1)
          redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
          if ARGV[2] == '1' then
            redis.call('HINCRBY', KEYS[2], 'total', 1)
            redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
          end
        end
        local u = redis.call('HMGET', KEYS[1], 'total', ARGV[1])
        local m = redis.call('HMGET', KEYS[2], 'total', ARGV[1])
        local flag = 0
        if counted then flag = 1 end
        local mentioned = redis.call('HLEN', KEYS[2])
        if m[1] then mentioned = mentioned - 1 end
        return {flag, tonumber(u[1]) or 0, tonumber(u[2]) or 0, tonumber(m[1]) or 0, tonumber(m[2]) or 0, mentioned}
        """

    /// KEYS: the user's state hash (its unread fields), mentions hash, digest hash (Digests.swift: what was read
    /// is not in the digest). ARGV: a conversation's field, or '' for every count (the state hash's `total` and `c:`
    /// fields go, its devices, presence and preferences stay; the digest keeps only the events it counted).
    static let markRead =
        dropCounts + """
            if ARGV[1] == '' then
              drop_counts(KEYS[1])
              redis.call('DEL', KEYS[2])
              local seen = redis.call('HGET', KEYS[3], 's')
              if seen then
                local ttl = redis.call('PTTL', KEYS[3])
                redis.call('DEL', KEYS[3])
                redis.call('HSET', KEYS[3], 's', seen)
                if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) else redis.call('PEXPIRE', KEYS[3], 86400000) end
              end
              return 1
            end
            local d = redis.call('HGET', KEYS[3], ARGV[1])
            if d then
              local n = tonumber(string.match(d, '^(%d+):')) or 0
              redis.call('HDEL', KEYS[3], ARGV[1])
              redis.call('HINCRBY', KEYS[3], 'n', -1)
              if redis.call('HINCRBY', KEYS[3], 'total', -n) < 0 then redis.call('HSET', KEYS[3], 'total', 0) end
            end
            for i = 1, 2 do
              local n = tonumber(redis.call('HGET', KEYS[i], ARGV[1])) or 0
              redis.call('HDEL', KEYS[i], ARGV[1])
              if n > 0 then
                local t = redis.call('HINCRBY', KEYS[i], 'total', -n)
                if t < 0 then redis.call('HSET', KEYS[i], 'total', 0) end
              end
            end
            return 1
            """
}
