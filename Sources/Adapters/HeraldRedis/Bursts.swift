import HeraldCore

// Burst coalescing state (docs/behaviour.md §6a, docs/redis-keys.md "Bursts"). Bursts are spread over 64 shards by
// user; each shard is two keys in one Cluster slot: a hash of the shard's active bursts and a sorted set of when
// each is due (its flush, or its end). Every script touches one shard. Ended bursts are deleted by the flush
// timer, and both keys expire when their shard has been quiet for two windows.

extension RedisKeys {
    /// Shards of the burst state, by user.
    public static let burstShards: UInt64 = 64

    /// The burst shard of a user.
    public static func burstShard(user: String) -> UInt64 { fnv(user) % burstShards }

    /// Hash: burst field -> `<count>:<shown>:<shown at ms>:<last at ms>:<lane>[:<held record>]`.
    public static func bursts(app: String, shard: UInt64) -> String { "\(prefix):\(app):burst:{b\(shard)}" }

    /// Sorted set: burst field -> when the flush timer looks at it next (epoch ms).
    public static func burstsDue(app: String, shard: UInt64) -> String { "\(prefix):\(app):burst_due:{b\(shard)}" }

    /// The field of a (user, conversation) burst: `<user's length in bytes>:<user>:<conversation>`.
    public static func burstField(user: String, conversation: String) -> String {
        "\(user.utf8.count):\(user):\(conversation)"
    }

    /// The user and conversation of a burst field; nil for anything else.
    static func burstParts(_ field: String) -> (user: String, conversation: String)? {
        let bytes = Array(field.utf8)
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")),
            let length = Int(String(decoding: bytes[..<colon], as: UTF8.self)), length >= 0,
            colon + 1 + length < bytes.count, bytes[colon + 1 + length] == UInt8(ascii: ":")
        else { return nil }
        return (
            String(decoding: bytes[(colon + 1)..<(colon + 1 + length)], as: UTF8.self),
            String(decoding: bytes[(colon + 2 + length)...], as: UTF8.self)
        )
    }
}

extension StateStore {
    /// How long a claimed flush stays with the claiming process before another may take it (it died before the
    /// flush was produced and confirmed).
    public static let burstLeaseMilliseconds: Int64 = 10_000
    /// The most flushes one shard hands out per claim.
    static let burstClaimLimit = 200

    /// The TTL of a shard's keys, refreshed by every write: two windows (at least two minutes, for the flood guard) and
    /// the lease.
    static func burstTTL(_ policy: CoalescePolicy) -> Int64 {
        2 * max(policy.windowMilliseconds, FloodGuard.minuteMilliseconds) + burstLeaseMilliseconds + 60_000
    }

    /// Steps each message through its burst (`Coalescing.step`, in Lua), or, for a message with an empty
    /// conversation, through its user's flood guard (`FloodGuard.step`): one pipelined round trip per kind, one
    /// script per message, each atomic on its shard; the answers in order.
    public func stepBursts(_ messages: [BurstMessage]) async throws -> [BurstStep] {
        if messages.isEmpty { return [] }
        var out = [BurstStep](repeating: .first, count: messages.count)
        for flood in [false, true] {
            let indices = messages.indices.filter { messages[$0].conversation.isEmpty == flood }
            if indices.isEmpty { continue }
            let script = flood ? BurstScripts.flood : BurstScripts.step
            let replies = try await script.run(on: connection, what: flood ? "flood step" : "burst step") { sha in
                var batch = RedisBatch(capacity: 256 + indices.reduce(0) { $0 + messages[$1].record.count + 160 })
                for index in indices {
                    let m = messages[index]
                    let shard = RedisKeys.burstShard(user: m.user)
                    batch.command("EVALSHA", arguments: 11)
                    batch.argument(sha)
                    batch.argument("2")
                    batch.argument(RedisKeys.bursts(app: m.appID, shard: shard))
                    batch.argument(RedisKeys.burstsDue(app: m.appID, shard: shard))
                    batch.argument(RedisKeys.burstField(user: m.user, conversation: m.conversation))
                    batch.argument(m.at)
                    batch.argument(flood ? FloodGuard.minuteMilliseconds : max(1, m.policy.windowMilliseconds))
                    batch.argument(flood ? Int64(m.flood.perMinute) : m.policy.updateMilliseconds)
                    batch.argument(Self.burstTTL(m.policy))
                    batch.argument(m.lane.rawValue)
                    batch.argument(m.record)
                }
                return batch
            }
            for (index, reply) in zip(indices, replies) {
                guard let values = try reply.orThrow("EVALSHA burst step").array, values.count == 2,
                    let step = values[0].int, let count = values[1].int
                else { throw RedisError(.unexpectedReply, "the burst script answered \(reply)") }
                switch step {
                case 0: out[index] = .first
                case 1: out[index] = .update(count: Int(count))
                default: out[index] = .held(count: Int(count))
                }
            }
        }
        return out
    }

    /// Takes the bursts of every shard of `app` whose flush is due at `now` (one pipelined round trip, one script
    /// per shard), leasing each to the caller for `burstLeaseMilliseconds`; ended bursts are deleted on the way.
    public func claimDueBursts(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        let shards = Array(0..<RedisKeys.burstShards)
        let replies = try await BurstScripts.claim.run(on: connection, what: "burst claim") { sha in
            var batch = RedisBatch(capacity: shards.count * 160)
            for shard in shards {
                Self.shardCall(&batch, sha: sha, app: app, shard: shard, more: 3, now: now, policy: policy)
                batch.argument(Self.burstLeaseMilliseconds)
                batch.argument(Int64(Self.burstClaimLimit))
                batch.argument(Self.burstTTL(policy))
            }
            return batch
        }
        var out: [HeldBurst] = []
        for reply in replies {
            guard let values = try reply.orThrow("EVALSHA burst claim").array, values.count % 4 == 0 else {
                throw RedisError(.unexpectedReply, "the burst claim script answered \(reply)")
            }
            var i = 0
            while i < values.count {
                defer { i += 4 }
                guard let field = values[i].text, let parts = RedisKeys.burstParts(field),
                    let count = values[i + 1].int, let laneName = values[i + 2].text,
                    let record = values[i + 3].data
                else { throw RedisError(.unexpectedReply, "the burst claim script answered \(values[i])") }
                out.append(
                    HeldBurst(
                        user: parts.user, conversation: parts.conversation, count: Int(count),
                        lane: Lane(rawValue: laneName) ?? .bulk, record: Array(record)))
            }
        }
        return out
    }

    /// Records flushes as shown (`Coalescing.flushed`, in Lua) once their records were produced: one pipelined round
    /// trip, one script per shard.
    public func confirmBursts(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        if flushed.isEmpty { return }
        var byShard: [UInt64: [HeldBurst]] = [:]
        for b in flushed { byShard[RedisKeys.burstShard(user: b.user), default: []].append(b) }
        let groups = byShard.sorted { $0.key < $1.key }
        let replies = try await BurstScripts.confirm.run(on: connection, what: "burst confirm") { sha in
            var batch = RedisBatch(capacity: 256 + flushed.count * 96)
            for (shard, bursts) in groups {
                Self.shardCall(
                    &batch, sha: sha, app: app, shard: shard, more: 1 + 2 * bursts.count, now: now, policy: policy)
                batch.argument(Self.burstTTL(policy))
                for b in bursts {
                    batch.argument(RedisKeys.burstField(user: b.user, conversation: b.conversation))
                    batch.argument(Int64(b.count))
                }
            }
            return batch
        }
        for reply in replies { _ = try reply.orThrow("EVALSHA burst confirm") }
    }

    /// A script call on one shard up to its common arguments: EVALSHA, the shard's hash and due set, now, the window
    /// and the update interval; `more` arguments follow.
    static func shardCall(
        _ batch: inout RedisBatch, sha: String, app: String, shard: UInt64, more: Int, now: Int64,
        policy: CoalescePolicy
    ) {
        batch.command("EVALSHA", arguments: 7 + more)
        batch.argument(sha)
        batch.argument("2")
        batch.argument(RedisKeys.bursts(app: app, shard: shard))
        batch.argument(RedisKeys.burstsDue(app: app, shard: shard))
        batch.argument(now)
        batch.argument(max(1, policy.windowMilliseconds))
        batch.argument(policy.updateMilliseconds)
    }
}

/// The burst scripts. Each runs on one shard: KEYS[1] its hash of bursts, KEYS[2] its sorted set of due times.
/// They mirror `Coalescing.step`, `Coalescing.flush` and `Coalescing.flushed`.
enum BurstScripts {
    /// Reading and writing a burst's value, and its due time.
    static let common = """
        local function parse(v)
          if not v then return nil end
          local s, e, c, sh, sa, la, ln = string.find(v, '^(%d+):(%d+):(%-?%d+):(%-?%d+):(%a+)')
          if not s then return nil end
          local st = {count = tonumber(c), shown = tonumber(sh), shownAt = tonumber(sa), lastAt = tonumber(la), lane = ln}
          if #v > e + 1 then st.rec = string.sub(v, e + 2) end
          return st
        end
        local function encode(st)
          local v = string.format('%d:%d:%d:%d:%s', st.count, st.shown, st.shownAt, st.lastAt, st.lane)
          if st.rec then v = v .. ':' .. st.rec end
          return v
        end
        local function due(st, window, update)
          if st.rec then return st.shownAt + update end
          return st.lastAt + window
        end
        -- A user's flood guard is the field with an empty conversation; it is flushed and ended by the minute.
        local function isflood(f) return string.sub(f, -1) == ':' end

        """

    /// ARGV: field, now (ms), window (ms), update interval (ms), keys' TTL (ms), lane, the message's record.
    /// Returns {step, count}: step 0 first, 1 update, 2 held.
    static let step = LoadedScript(
        common + """
            local now, window, update = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
            local p = parse(redis.call('HGET', KEYS[1], ARGV[1]))
            local st, step
            local waspending = p ~= nil and p.rec ~= nil
            if p == nil or p.count == 0 or ((not waspending) and now - p.lastAt >= window) then
              st = {count = 1, shown = 1, shownAt = now, lastAt = now, lane = ARGV[6]}
              step = 0
            else
              st = p
              st.count = st.count + 1
              if now > st.lastAt then st.lastAt = now end
              if (not waspending) and now - st.shownAt >= update then
                st.shown = st.count
                st.shownAt = now
                step = 1
              else
                st.rec = ARGV[7]
                st.lane = ARGV[6]
                step = 2
              end
            end
            redis.call('HSET', KEYS[1], ARGV[1], encode(st))
            if not (step == 2 and waspending) then redis.call('ZADD', KEYS[2], due(st, window, update), ARGV[1]) end
            redis.call('PEXPIRE', KEYS[1], ARGV[5])
            redis.call('PEXPIRE', KEYS[2], ARGV[5])
            return {step, st.count}
            """)

    /// A user's flood guard. ARGV: field, now (ms), the minute (ms), the most visible pushes per minute, keys' TTL
    /// (ms), lane, the push's record. Returns {step, count}: step 0 lets it go, 2 holds it (count: held pushes).
    static let flood = LoadedScript(
        common + """
            local now, minute, limit = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
            local start = now - now % minute
            local st = parse(redis.call('HGET', KEYS[1], ARGV[1]))
            local waspending = st ~= nil and st.rec ~= nil
            if st == nil or ((not waspending) and st.shownAt < start) then
              st = {count = 0, shown = 0, shownAt = start, lastAt = now, lane = ARGV[6]}
            end
            if now > st.lastAt then st.lastAt = now end
            local step
            if waspending or st.shown >= limit then
              st.count = st.count + 1
              st.rec = ARGV[7]
              st.lane = ARGV[6]
              step = 2
            else
              st.shown = st.shown + 1
              step = 0
            end
            redis.call('HSET', KEYS[1], ARGV[1], encode(st))
            if not waspending then redis.call('ZADD', KEYS[2], due(st, minute, minute), ARGV[1]) end
            redis.call('PEXPIRE', KEYS[1], ARGV[5])
            redis.call('PEXPIRE', KEYS[2], ARGV[5])
            return {step, st.count}
            """)

    /// ARGV: now (ms), window (ms), update interval (ms), lease (ms), most bursts to take, keys' TTL (ms).
    /// Returns a flat list of {field, count, lane, record} for each due flush, each leased until now + lease; ended
    /// bursts are deleted, others get their due time again.
    static let claim = LoadedScript(
        common + """
            local now, window, update = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
            local fields = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[5])
            local out = {}
            for _, f in ipairs(fields) do
              local window, update = window, update
              if isflood(f) then window, update = 60000, 60000 end
              local st = parse(redis.call('HGET', KEYS[1], f))
              if st == nil then
                redis.call('ZREM', KEYS[2], f)
              elseif st.rec and now >= st.shownAt + update then
                out[#out + 1] = f
                out[#out + 1] = st.count
                out[#out + 1] = st.lane
                out[#out + 1] = st.rec
                redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), f)
              elseif (not st.rec) and now >= st.lastAt + window then
                redis.call('HDEL', KEYS[1], f)
                redis.call('ZREM', KEYS[2], f)
              else
                redis.call('ZADD', KEYS[2], due(st, window, update), f)
              end
            end
            if #fields > 0 and redis.call('EXISTS', KEYS[1]) == 1 then
              redis.call('PEXPIRE', KEYS[1], ARGV[6])
              redis.call('PEXPIRE', KEYS[2], ARGV[6])
            end
            return out
            """)

    /// ARGV: now (ms), window (ms), update interval (ms), keys' TTL (ms), then (field, count shown) pairs.
    /// A flush that showed more than the burst had shown becomes its last visible push; the held record is dropped
    /// unless messages were held after the flush was taken.
    static let confirm = LoadedScript(
        common + """
            local now, window, update = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
            for i = 5, #ARGV, 2 do
              local f, c = ARGV[i], tonumber(ARGV[i + 1])
              local st = parse(redis.call('HGET', KEYS[1], f))
              if st and isflood(f) then
                if st.rec and c > 0 and st.count >= c then
                  st.count = st.count - c
                  st.shown = 1
                  st.shownAt = now - now % 60000
                  if st.count == 0 then st.rec = nil end
                  redis.call('HSET', KEYS[1], f, encode(st))
                  redis.call('ZADD', KEYS[2], due(st, 60000, 60000), f)
                end
              elseif st and c > st.shown then
                st.shown = c
                st.shownAt = now
                if st.count <= c then st.rec = nil end
                redis.call('HSET', KEYS[1], f, encode(st))
                redis.call('ZADD', KEYS[2], due(st, window, update), f)
              end
            end
            redis.call('PEXPIRE', KEYS[1], ARGV[4])
            redis.call('PEXPIRE', KEYS[2], ARGV[4])
            return 0
            """)
}
