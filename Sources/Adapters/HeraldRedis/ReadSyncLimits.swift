import HeraldCore

// The rate limit of cleared-on-read pushes (docs/behaviour.md §6c, docs/redis-keys.md "Read sync"). Spread over 64
// shards by user and cut by the minute of the clock: a shard's hash for a minute holds each user's clears sent in that
// minute and, per (user, conversation), when the last clear was sent and for which read. One script per read touches
// one shard (this minute's key and the last minute's, one Cluster slot); every key expires three minutes after its
// last write, so the state is bounded by the users who read in the last two minutes.

extension RedisKeys {
    /// Shards of the read-sync limiter, by user.
    public static let readSyncShards: UInt64 = 64

    /// Hash for one shard and one minute of the clock (`minute` is epoch ms at the minute's start):
    /// `u:<user>` -> clears sent to the user in that minute, `c:<user's length>:<user>:<conversation>` ->
    /// `<sent at ms>:<read_at>`.
    public static func readSync(app: String, user: String, minute: Int64) -> String {
        "\(prefix):\(app):read_sync:{r\(fnv(user) % readSyncShards)}:\(minute / 60_000)"
    }
}

extension StateStore {
    /// Asks the limiter for one clear of `conversation` (nil: every conversation) at `now` (`ReadSync.admit`, in Lua;
    /// atomic on the user's shard). `sent` takes a slot; a replay of the read that took the conversation's last slot
    /// (same `readAt`) is `sent` again without taking another.
    public func admitReadSync(
        app: String, user: String, conversation: String?, readAt: Int64?, now: Int64, policy: ReadSyncPolicy
    ) async throws -> ReadSyncOutcome {
        let minute = now - now % 60_000
        let conversationField = "c:\(user.utf8.count):\(user):\(conversation ?? ReadSync.everything)"
        let reply = try await connection.send(
            RedisCommand(
                "EVAL", ReadSyncScript.admit, 2,
                RedisKeys.readSync(app: app, user: user, minute: minute),
                RedisKeys.readSync(app: app, user: user, minute: minute - 60_000),
                "u:" + user, conversationField, now, readAt.map { String($0) } ?? "",
                policy.conversationIntervalMilliseconds, policy.perMinute, ReadSync.limiterTTLMilliseconds)
        ).orThrow("EVAL readSync")
        guard let text = reply.text, let outcome = ReadSyncOutcome(rawValue: text) else {
            throw RedisError(.unexpectedReply, "read sync script answered \(reply)")
        }
        return outcome
    }
}

enum ReadSyncScript {
    /// KEYS: this minute's hash, the last minute's hash. ARGV: the user's field, the conversation's field, now (ms),
    /// read_at ('' when unknown), the interval (ms), clears per minute, the keys' TTL (ms).
    /// Returns `sent`, `rate_limited` or `user_limit` (`ReadSync.admit`).
    static let admit = """
        local last = redis.call('HGET', KEYS[1], ARGV[2])
        if not last then last = redis.call('HGET', KEYS[2], ARGV[2]) end
        if last then
          local sep = string.find(last, ':', 1, true)
          if sep then
            local sentAt = tonumber(string.sub(last, 1, sep - 1)) or 0
            local readAt = string.sub(last, sep + 1)
            if ARGV[4] ~= '' and readAt == ARGV[4] then return 'sent' end
            if tonumber(ARGV[3]) - sentAt < tonumber(ARGV[5]) then return 'rate_limited' end
          end
        end
        local count = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
        if count >= tonumber(ARGV[6]) then return 'user_limit' end
        redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
        redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ':' .. ARGV[4])
        redis.call('PEXPIRE', KEYS[1], ARGV[7])
        return 'sent'
        """
}
