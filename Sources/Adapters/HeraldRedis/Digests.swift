import Foundation
import HeraldCore

// The digest when Do Not Disturb or a snooze ends (docs/behaviour.md §6d, docs/redis-keys.md "Digests"). Each user
// with messages counted has one hash beside their state, in the same Cluster slot (`herald:<app>:user:{<user>}:digest`):
// the window's end and kind, the total, up to `Digest.maxConversations` conversations by name, and the fingerprints
// of the last `Digest.seenEvents` events counted (a replay is not counted twice). The count script and the
// mark-read script (Counters.swift) touch only that hash, so it is bounded and atomic per user. When each user's
// digest is due is kept apart, in 64 sorted sets by user (`digest_due:{g<shard>}`), which the flush timer reads.
// A traced message counted leaves its trace context in the hash (`t`, the latest traced one's), which the digest's
// record carries; an untraced one sends and stores nothing more.

extension RedisKeys {
    /// Shards of the digest schedule, by user.
    public static let digestShards: UInt64 = 64

    /// The digest shard of a user.
    public static func digestShard(user: String) -> UInt64 { fnv(user) % digestShards }

    /// Hash: one user's digest: `end` (epoch ms), `w` (`dnd`/`snooze`), `total`, `n` (conversations by name),
    /// `other` (messages of conversations beyond them), `c:<conversation>` -> `<count>:<name>`, `s` (fingerprints),
    /// `t` (the trace context of the latest traced message counted, `HeldTrace.stored`; only when one was traced).
    public static func digest(app: String, user: String) -> String { userPrefix(app: app, user: user) + "digest" }

    /// Sorted set: user -> when their digest is due (epoch ms; a claimed digest: when its lease passes).
    public static func digestsDue(app: String, shard: UInt64) -> String { "\(prefix):\(app):digest_due:{g\(shard)}" }
}

extension StateStore {
    /// How long a claimed digest stays with the claiming process before another may take it.
    public static let digestLeaseMilliseconds: Int64 = 10_000
    /// The most digests one shard hands out per claim.
    static let digestClaimLimit = 200
    /// How long a user's digest hash outlives its deadline.
    static let digestMarginMilliseconds: Int64 = 3_600_000

    /// Counts each message once per (event, user) in its user's digest and schedules the digest at its window's
    /// end (one pipelined round trip: per message a script on the user's hash, then `ZADD GT` on the schedule).
    /// Returns, per message, whether it was counted now (false: a replay).
    public func countDigests(_ counts: [DigestCount], now: Int64) async throws -> [Bool] {
        if counts.isEmpty { return [] }
        let replies = try await BurstPipeline.run(
            [DigestScripts.count], count: counts.count * 2, on: connection, what: "digest count",
            capacity: counts.count * 320
        ) { batch, sha, i in
            let c = counts[i / 2]
            if i % 2 == 0 {
                let trace = c.trace?.stored
                batch.command("EVALSHA", arguments: trace == nil ? 10 : 11)
                batch.argument(sha(DigestScripts.count))
                batch.argument("1")
                batch.argument(RedisKeys.digest(app: c.appID, user: c.user))
                batch.argument(withUnsafeBytes(of: RedisKeys.fnv(c.eventID).bigEndian) { Array($0) })
                batch.argument(RedisKeys.unreadField(conversation: c.conversation))
                batch.argument(c.name)
                batch.argument(c.end)
                batch.argument(c.window.rawValue)
                batch.argument(Int64(Digest.maxConversations))
                batch.argument(max(c.end - now, 0) + c.deadlineMilliseconds + Self.digestMarginMilliseconds)
                if let trace { batch.argument(trace) }
            } else {
                batch.command("ZADD", arguments: 4)
                batch.argument(RedisKeys.digestsDue(app: c.appID, shard: RedisKeys.digestShard(user: c.user)))
                batch.argument("GT")
                batch.argument(c.end)
                batch.argument(c.user)
            }
        }
        var out: [Bool] = []
        out.reserveCapacity(counts.count)
        for index in counts.indices {
            let reply = try replies[index * 2].orThrow("EVALSHA digest count")
            _ = try replies[index * 2 + 1].orThrow("ZADD digest due")
            guard let flag = reply.int else {
                throw RedisError(.unexpectedReply, "the digest count script answered \(reply)")
            }
            out.append(flag == 1)
        }
        return out
    }

    /// Takes the digests of `app` due at `now` (one script per shard, one round trip), leasing each for
    /// `digestLeaseMilliseconds`, and reads each user's counts (one more round trip).
    public func claimDueDigests(app: String, now: Int64) async throws -> [DueDigest] {
        let shards = Array(0..<RedisKeys.digestShards)
        let lease = now + Self.digestLeaseMilliseconds
        let replies = try await BurstPipeline.run(
            [DigestScripts.claim], count: shards.count, on: connection, what: "digest claim",
            capacity: shards.count * 128
        ) { batch, sha, i in
            batch.command("EVALSHA", arguments: 6)
            batch.argument(sha(DigestScripts.claim))
            batch.argument("1")
            batch.argument(RedisKeys.digestsDue(app: app, shard: shards[i]))
            batch.argument(now)
            batch.argument(lease)
            batch.argument(Int64(Self.digestClaimLimit))
        }
        var users: [String] = []
        for reply in replies {
            guard let values = try reply.orThrow("EVALSHA digest claim").array else {
                throw RedisError(.unexpectedReply, "the digest claim script answered \(reply)")
            }
            users += values.compactMap(\.text)
        }
        if users.isEmpty { return [] }
        var batch = RedisBatch(capacity: users.count * 96)
        for user in users {
            batch.command("HGETALL", arguments: 1)
            batch.argument(RedisKeys.digest(app: app, user: user))
        }
        let hashes = try await connection.pipeline(batch)
        guard hashes.count == users.count else {
            throw RedisError(.unexpectedReply, "digest read: expected \(users.count) replies, got \(hashes.count)")
        }
        return try zip(users, hashes).map { user, reply in
            try Self.readDigest(user: user, try reply.orThrow("HGETALL digest").array ?? [], lease: lease)
        }
    }

    static func readDigest(user: String, _ values: [RedisValue], lease: Int64) throws -> DueDigest {
        var digest = DueDigest(
            user: user, end: 0, window: .dnd, messages: 0, conversations: [], other: 0, lease: lease)
        var i = 0
        while i + 1 < values.count {
            defer { i += 2 }
            guard let field = values[i].text else { continue }
            if field == "s" { continue }
            if field == "t" {
                digest.trace = values[i + 1].data.flatMap { HeldTrace(stored: Array($0)) }
                continue
            }
            let value = values[i + 1].text ?? ""
            switch field {
            case "end": digest.end = Int64(value) ?? 0
            case "w": digest.window = DigestSummary.Window(rawValue: value) ?? .dnd
            case "total": digest.messages = max(Int(value) ?? 0, 0)
            case "other": digest.other = max(Int(value) ?? 0, 0)
            default:
                guard field.hasPrefix("c:"), let colon = value.firstIndex(of: ":"),
                    let count = Int(value[..<colon])
                else { continue }
                digest.conversations.append(
                    DueDigest.Conversation(
                        id: String(field.dropFirst(2)), name: String(value[value.index(after: colon)...]),
                        count: count))
            }
        }
        digest.conversations.sort { $0.id < $1.id }
        return digest
    }

    /// Forgets a digest that was sent (or dropped): its hash, unless a later window was counted meanwhile, and its
    /// schedule entry, unless it was scheduled again.
    public func confirmDigest(app: String, _ digest: DueDigest) async throws {
        var batch = RedisBatch(capacity: 512)
        batch.command("EVAL", arguments: 4)
        batch.argument(DigestScripts.forget)
        batch.argument("1")
        batch.argument(RedisKeys.digest(app: app, user: digest.user))
        batch.argument(digest.end)
        batch.command("EVAL", arguments: 5)
        batch.argument(DigestScripts.unschedule)
        batch.argument("1")
        batch.argument(RedisKeys.digestsDue(app: app, shard: RedisKeys.digestShard(user: digest.user)))
        batch.argument(digest.user)
        batch.argument(digest.lease)
        for reply in try await connection.pipeline(batch) { _ = try reply.orThrow("EVAL digest confirm") }
    }

    /// Moves a digest to a window that now ends later (Do Not Disturb or a snooze was extended).
    public func rescheduleDigest(
        app: String, _ digest: DueDigest, window: DigestSummary.Window, end: Int64, deadlineMilliseconds: Int64,
        now: Int64
    ) async throws {
        var batch = RedisBatch(capacity: 512)
        batch.command("EVAL", arguments: 7)
        batch.argument(DigestScripts.move)
        batch.argument("1")
        batch.argument(RedisKeys.digest(app: app, user: digest.user))
        batch.argument(digest.end)
        batch.argument(end)
        batch.argument(window.rawValue)
        batch.argument(max(end - now, 0) + deadlineMilliseconds + Self.digestMarginMilliseconds)
        batch.command("ZADD", arguments: 3)
        batch.argument(RedisKeys.digestsDue(app: app, shard: RedisKeys.digestShard(user: digest.user)))
        batch.argument(end)
        batch.argument(digest.user)
        for reply in try await connection.pipeline(batch) { _ = try reply.orThrow("digest reschedule") }
    }
}

/// The digest scripts; each touches one key.
enum DigestScripts {
    /// KEYS[1]: the user's digest hash. ARGV: the event's fingerprint (8 bytes), the conversation's field, its name,
    /// the window's end, its kind, the most conversations by name, the hash's TTL, and for a traced message its trace
    /// context (kept as `t`). Returns 1 when counted, 0 for an event counted before.
    static let count = LoadedScript(
        """
        local s = redis.call('HGET', KEYS[1], 's') or ''
        for i = 1, #s, 8 do
          if string.sub(s, i, i + 7) == ARGV[1] then return 0 end
        end
        s = s .. ARGV[1]
        if #s > \(Digest.seenEvents * 8) then s = string.sub(s, #s - \(Digest.seenEvents * 8 - 1)) end
        redis.call('HSET', KEYS[1], 's', s)
        local cur = redis.call('HGET', KEYS[1], ARGV[2])
        if cur then
          local n = tonumber(string.match(cur, '^(%d+):')) or 0
          redis.call('HSET', KEYS[1], ARGV[2], (n + 1) .. ':' .. ARGV[3])
        elseif (tonumber(redis.call('HGET', KEYS[1], 'n')) or 0) < tonumber(ARGV[6]) then
          redis.call('HSET', KEYS[1], ARGV[2], '1:' .. ARGV[3])
          redis.call('HINCRBY', KEYS[1], 'n', 1)
        else
          redis.call('HINCRBY', KEYS[1], 'other', 1)
        end
        redis.call('HINCRBY', KEYS[1], 'total', 1)
        if ARGV[8] then redis.call('HSET', KEYS[1], 't', ARGV[8]) end
        local e = tonumber(redis.call('HGET', KEYS[1], 'end')) or 0
        if tonumber(ARGV[4]) > e then
          redis.call('HSET', KEYS[1], 'end', ARGV[4], 'w', ARGV[5])
        end
        local ttl = tonumber(ARGV[7])
        if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
        return 1
        """)

    /// KEYS[1]: a schedule shard. ARGV: now, the lease's end, the most to take. Returns the users taken.
    static let claim = LoadedScript(
        """
        local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
        for i = 1, #due do redis.call('ZADD', KEYS[1], ARGV[2], due[i]) end
        return due
        """)

    /// KEYS[1]: the user's digest hash. ARGV: the end of the window sent.
    static let forget = """
        local e = redis.call('HGET', KEYS[1], 'end')
        if not e or tonumber(e) <= tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) end
        return 1
        """

    /// KEYS[1]: a schedule shard. ARGV: the user, the lease the claim gave.
    static let unschedule = """
        local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
        if score and tonumber(score) == tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) end
        return 1
        """

    /// KEYS[1]: the user's digest hash. ARGV: the window's end as claimed, the new end, its kind, the TTL.
    static let move = """
        if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
        local e = tonumber(redis.call('HGET', KEYS[1], 'end')) or 0
        if tonumber(ARGV[2]) > e then redis.call('HSET', KEYS[1], 'end', ARGV[2], 'w', ARGV[3]) end
        redis.call('PEXPIRE', KEYS[1], ARGV[4])
        return 1
        """
}
