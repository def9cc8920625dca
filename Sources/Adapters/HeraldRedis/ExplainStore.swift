import Foundation
import HeraldCore

/// The explain trail in Redis: written by the stages, read by `heraldctl explain` and the registry API.
///
/// It is kept compact, so that it does not grow with the notifications that went as expected
/// (docs/redis-keys.md, "The explain trail"):
/// - the entries that say why a user was not notified (or only after a retry), and every entry `fullTrail`
///   selects, are pushed as one line each (`ExplainEntry.writeLine`) onto the hourly log (a list) of their event's
///   shard (`RedisKeys.explainLog`), kept for `ttlMilliseconds`;
/// - each user's latest user-level decision (deliver, suppress, error) is one field of their shard's hash
///   (`RedisKeys.lastDecisions`), replaced by the next one.
/// Routine entries outside `fullTrail` (the fan-out, a decision to deliver, a first-attempt delivery) are not
/// appended. Writes are one pipelined round trip per batch.
public final class ExplainStore: Sendable {
    public let connection: RedisConnection
    public let ttlMilliseconds: Int64
    public let fullTrail: FullTrailPolicy
    /// Shards of the users' latest decisions (`explain.last_decision_shards`, docs/redis-keys.md).
    public let lastDecisionShards: UInt64
    /// Shards of the hourly logs (`explain.log_shards`).
    public let logShards: UInt64
    /// The hourly logs whose TTL this store set lately (`ExpiryMemo`).
    let expiries = ExpiryMemo()

    /// - Parameters:
    ///   - ttlMilliseconds: how long a log line is kept (default 2 days; at least 24 hours is what support needs).
    ///   - fullTrail: what is kept in full, routine entries included.
    ///   - lastDecisionShards: shards of the users' latest decisions (`explain.last_decision_shards`).
    ///   - logShards: shards of the hourly logs (`explain.log_shards`).
    public init(
        connection: RedisConnection, ttlMilliseconds: Int64 = ExplainStore.defaultTTLMilliseconds,
        fullTrail: FullTrailPolicy = FullTrailPolicy(), lastDecisionShards: UInt64 = RedisKeys.lastDecisionShards,
        logShards: UInt64 = RedisKeys.explainShards
    ) {
        self.connection = connection
        self.ttlMilliseconds = ttlMilliseconds
        self.fullTrail = fullTrail
        self.lastDecisionShards = max(1, lastDecisionShards)
        self.logShards = max(1, logShards)
    }

    public static let defaultTTLMilliseconds: Int64 = 2 * 86_400_000

    /// Whether `record` writes anything of `entry`: a line of the hourly log (see `isLogged`) or a user's latest
    /// decision (see `isDecision`). A routine entry about a device, outside `fullTrail`, is neither.
    public func keeps(_ entry: ExplainEntry) -> Bool {
        Self.isDecision(entry) || Self.isLogged(entry, fullTrail: fullTrail)
    }

    /// Whether `record` would write a routine entry of event `eventID` in `appID` about `user` (a device's or the
    /// event's, nil): only when `fullTrail` selects it.
    public func keepsRoutine(appID: String, eventID: String, user: String?) -> Bool {
        fullTrail.wantsAll(appID: appID, eventID: eventID, user: user)
    }

    /// Whether `entry` is a line of its event's hourly log: it is not routine, or `fullTrail` selects it.
    static func isLogged(_ entry: ExplainEntry, fullTrail: FullTrailPolicy) -> Bool {
        !entry.isRoutine || fullTrail.wantsAll(entry)
    }

    /// Whether `entry` is a user's decision, which replaces their latest one.
    static func isDecision(_ entry: ExplainEntry) -> Bool { entry.token == nil && entry.user != nil }

    /// Writes `entries` in one pipelined round trip (see `batch`).
    public func record(_ entries: [ExplainEntry]) async throws {
        if entries.isEmpty { return }
        var expiring: [ExpiryMemo.Key] = []
        let now = entries.map(\.at).max() ?? 0
        let batch = Self.batch(
            entries, ttlMilliseconds: ttlMilliseconds, fullTrail: fullTrail, lastDecisionShards: lastDecisionShards,
            logShards: logShards
        ) { app, shard, hour in
            let key = ExpiryMemo.Key(kind: ExpiryMemo.explainKind, app: app, shard: shard, period: hour)
            guard expiries.isDue(key, now: now) else { return false }
            expiring.append(key)
            return true
        }
        if batch.isEmpty { return }
        try await connection.write(batch, what: "explain")
        expiries.mark(expiring, now: now)
    }

    /// The commands `record` sends: per hourly log touched, one `RPUSH` of its lines (in entry order) and one
    /// `PEXPIRE` (see `expire`); per last-decision shard touched, one `HSET` of its users' latest decisions.
    /// Empty when there is nothing to keep. (Tests hold it to the commands spelled out one by one; `herald-bench
    /// redis` times it.)
    ///
    /// `expire` says, per hourly log (app, shard, hour), whether its `PEXPIRE` goes in (`record` asks its
    /// `ExpiryMemo`); by default every log's does.
    public static func batch(
        _ entries: [ExplainEntry], ttlMilliseconds: Int64, fullTrail: FullTrailPolicy = FullTrailPolicy(),
        lastDecisionShards: UInt64 = RedisKeys.lastDecisionShards, logShards: UInt64 = RedisKeys.explainShards,
        expire: (_ app: String, _ shard: UInt64, _ hour: Int64) -> Bool = { _, _, _ in true }
    ) -> RedisBatch {
        struct LogRef: Hashable {
            let app: String
            let shard: UInt64
            let hour: Int64
        }
        struct ShardRef: Hashable {
            let app: String
            let shard: UInt64
        }
        // First the entries' places (by index), then every line written straight from its entry through one
        // scratch buffer: no array per line, no copy of an entry.
        var logs = IndexGroups<LogRef>(capacity: entries.count)
        var decisions = IndexGroups<ShardRef>(capacity: entries.count)
        var lastEvent: (app: String, event: String, shard: UInt64)?
        // By index: each entry read in place (a copy of an entry is a retain and a release of each of its strings).
        for index in entries.indices {
            if isLogged(entries[index], fullTrail: fullTrail) {
                let shard: UInt64
                if let last = lastEvent, last.event == entries[index].eventID, last.app == entries[index].appID {
                    shard = last.shard
                } else {
                    shard = RedisKeys.explainShard(eventId: entries[index].eventID, of: logShards)
                    lastEvent = (entries[index].appID, entries[index].eventID, shard)
                }
                logs.add(
                    index,
                    to: LogRef(
                        app: entries[index].appID, shard: shard,
                        hour: entries[index].at / RedisKeys.explainHourMilliseconds))
            }
            if entries[index].token == nil, let user = entries[index].user {
                decisions.add(
                    index,
                    to: ShardRef(
                        app: entries[index].appID,
                        shard: RedisKeys.lastDecisionShard(user: user, of: lastDecisionShards)))
            }
        }
        var batch = RedisBatch(capacity: 64 + entries.count * 120)
        var line: [UInt8] = []
        line.reserveCapacity(256)
        for (ref, indices) in zip(logs.keys, logs.members()) {
            batch.command("RPUSH", arguments: 1 + indices.count)
            logKey(app: ref.app, shard: ref.shard, hour: ref.hour, into: &batch)
            for index in indices {
                line.removeAll(keepingCapacity: true)
                entries[index].writeLine(into: &line, base: ref.hour * RedisKeys.explainHourMilliseconds)
                batch.argument(line[..<(line.count - 1)])  // the newline left out: each line is one list element
            }
            guard expire(ref.app, ref.shard, ref.hour) else { continue }
            batch.command("PEXPIRE", arguments: 2)
            logKey(app: ref.app, shard: ref.shard, hour: ref.hour, into: &batch)
            // The log is kept `ttl` after the end of its hour.
            batch.argument(ttlMilliseconds + RedisKeys.explainHourMilliseconds)
        }
        for (ref, indices) in zip(decisions.keys, decisions.members()) {
            batch.command("HSET", arguments: 1 + 2 * indices.count)
            batch.argument(RedisKeys.prefix, ":", ref.app, ":last_decision:{l", String(ref.shard), "}")
            for index in indices {
                batch.argument(entries[index].user ?? "")
                // The user is the field: the value leaves it out (and stays within Redis's 64-byte listpack
                // values for ids of up to about 20 characters).
                line.removeAll(keepingCapacity: true)
                entries[index].writeLine(into: &line, omittingUser: true)
                batch.argument(line[..<(line.count - 1)])
            }
        }
        return batch
    }

    /// `RedisKeys.explainLog(app:shard:hour:)` as one argument.
    static func logKey(app: String, shard: UInt64, hour: Int64, into batch: inout RedisBatch) {
        batch.argument(RedisKeys.prefix, ":", app, ":explain:{e", String(shard), "}:", String(hour))
    }

    /// Every entry kept about one event within the retention before `now`: the event-level entries first, then
    /// users, then devices, each sorted; of several entries about one subject (a device retried, then dead) only
    /// the latest. One pipelined round trip over the hourly logs of the event's shard; lines that cannot be read
    /// are skipped.
    public func trail(
        app: String, eventID: String, now: Int64 = Int64(Date().timeIntervalSince1970 * 1000)
    )
        async throws -> [ExplainEntry]
    {
        let shard = RedisKeys.explainShard(eventId: eventID, of: logShards)
        let last = now / RedisKeys.explainHourMilliseconds
        let first = (now - ttlMilliseconds) / RedisKeys.explainHourMilliseconds - 1
        // A clock a little ahead of this one may have written the next hour.
        let hours = Array(first...(last + 1))
        let replies = try await connection.pipeline(
            hours.map { RedisCommand("LRANGE", RedisKeys.explainLog(app: app, shard: shard, hour: $0), 0, -1) })
        let needle = Array(eventID.utf8) + [9]
        var latest: [String: ExplainEntry] = [:]
        var order: [String] = []
        for (hour, reply) in zip(hours, replies) {
            let base = hour * RedisKeys.explainHourMilliseconds
            for item in try reply.orThrow("LRANGE").array ?? [] {
                guard let data = item.data, data.count > needle.count, data.starts(with: needle),
                    let entry = try? ExplainEntry(line: [UInt8](data), appID: app, base: base),
                    entry.eventID == eventID
                else { continue }
                let subject = entry.field
                if latest[subject] == nil { order.append(subject) }
                latest[subject] = entry
            }
        }
        let out = order.compactMap { latest[$0] }
        func rank(_ e: ExplainEntry) -> Int { e.token != nil ? 2 : (e.user != nil ? 1 : 0) }
        return out.sorted { (rank($0), $0.user ?? "", $0.token ?? "") < (rank($1), $1.user ?? "", $1.token ?? "") }
    }

    /// The user's latest decision (the last user-level entry written, by any event) and what the trail keeps of
    /// that event about the user; nil when there is none (never a recipient).
    public func lastDecision(
        app: String, user: String, now: Int64 = Int64(Date().timeIntervalSince1970 * 1000)
    ) async throws -> (decision: ExplainEntry, trail: [ExplainEntry])? {
        let key = RedisKeys.lastDecisions(
            app: app, shard: RedisKeys.lastDecisionShard(user: user, of: lastDecisionShards))
        let reply = try await connection.send(RedisCommand("HGET", key, user)).orThrow("HGET")
        guard let data = reply.data, var entry = try? ExplainEntry(line: [UInt8](data), appID: app) else { return nil }
        entry.user = user
        return (entry, try await trail(app: app, eventID: entry.eventID, user: user, now: now))
    }

    /// The entries about one user (their decision and their devices' outcomes) and the event-level ones.
    public func trail(
        app: String, eventID: String, user: String, now: Int64 = Int64(Date().timeIntervalSince1970 * 1000)
    ) async throws -> [ExplainEntry] {
        try await trail(app: app, eventID: eventID, now: now).filter {
            $0.user == user || ($0.user == nil && $0.token == nil)
        }
    }
}
