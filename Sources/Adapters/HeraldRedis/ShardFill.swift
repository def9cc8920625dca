// How full the keys that grow with traffic are: the operator's check that the shard counts suit the deployment
// (`heraldctl shards`, docs/capacity.md).

/// One kind of sharded key, measured from a sample of its shards.
public struct ShardFill: Sendable, Equatable {
    /// `delivered` (send's records of the last whole replay window), `last_decision`, or `explain_log` (the last
    /// whole hour).
    public var kind: String
    /// The shard count the sample was read with.
    public var shards: UInt64
    /// Keys read (evenly spread over the shards).
    public var sampled: Int
    /// Entries per key, mean and largest, over the sample.
    public var meanEntries: Double
    public var maxEntries: Int
    /// Sampled hashes Redis keeps as hashtables rather than listpacks (nil for the logs, which are lists).
    public var hashtables: Int?
    /// Entries a key should hold at most: Redis's `hash-max-listpack-entries` for the hashes (past it a hash is
    /// a hashtable, two to five times the bytes an entry), 5,000 lines for a log (an explain read reads a whole
    /// list per hour of the retention).
    public var ceiling: Int
    /// Entries a key is sized for (docs/capacity.md): 100 for the hashes, 1,000 for a log.
    public var target: Int
    /// Entries over all shards, from the mean.
    public var estimatedEntries: Double { meanEntries * Double(shards) }
    /// The count the sizing rule gives (the entries over `target`), never fewer than now: a change moves every
    /// entry to other keys.
    public var suggestedShards: UInt64 {
        max(shards, UInt64((estimatedEntries / Double(max(1, target))).rounded(.up)))
    }
    /// Whether the sample's keys stay within `ceiling`.
    public var fits: Bool { maxEntries <= ceiling && (hashtables ?? 0) == 0 }
}

extension StateStore {
    /// Reads `sample` shards of each kind (one pipelined round trip of `HLEN` / `LLEN` and `OBJECT ENCODING` per
    /// key; single-key commands, so a Redis Cluster serves them too) and Redis's listpack limit for hashes
    /// (`CONFIG GET`; 512, Redis's default, when the server refuses it, as managed services do).
    public func shardFill(
        app: String, now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds,
        lastDecisionShards: UInt64 = RedisKeys.lastDecisionShards, logShards: UInt64 = RedisKeys.explainShards,
        sample: Int = 64
    ) async throws -> [ShardFill] {
        var listpackLimit = 512
        if let reply = try? await connection.send("CONFIG", "GET", "hash-max-listpack-entries"),
            let pair = reply.array, pair.count == 2, let text = pair[1].text, let n = Int(text)
        {
            listpackLimit = n
        }
        func picks(_ shards: UInt64) -> [UInt64] {
            let n = UInt64(max(1, min(UInt64(sample), shards)))
            return (0..<n).map { $0 * shards / n }
        }
        let hour = now / RedisKeys.explainHourMilliseconds - 1
        let kinds: [(kind: String, shards: UInt64, isHash: Bool, ceiling: Int, key: (UInt64) -> String)] = [
            (
                "delivered", deliveredShards, true, listpackLimit,
                { RedisKeys.delivered(app: app, shard: $0, window: now / window - 1) }
            ),
            (
                "last_decision", lastDecisionShards, true, listpackLimit,
                { RedisKeys.lastDecisions(app: app, shard: $0) }
            ),
            ("explain_log", logShards, false, 5_000, { RedisKeys.explainLog(app: app, shard: $0, hour: hour) }),
        ]
        var out: [ShardFill] = []
        for kind in kinds {
            let keys = picks(max(1, kind.shards)).map(kind.key)
            var commands: [RedisCommand] = []
            for key in keys {
                commands.append(RedisCommand(kind.isHash ? "HLEN" : "LLEN", key))
                if kind.isHash { commands.append(RedisCommand("OBJECT", "ENCODING", key)) }
            }
            let replies = try await connection.pipeline(commands)
            var counts: [Int] = []
            var hashtables = 0
            let step = kind.isHash ? 2 : 1
            for i in stride(from: 0, to: replies.count, by: step) {
                counts.append(Int(try replies[i].orThrow(kind.isHash ? "HLEN" : "LLEN").int ?? 0))
                if kind.isHash, replies[i + 1].text == "hashtable" { hashtables += 1 }
            }
            out.append(
                ShardFill(
                    kind: kind.kind, shards: kind.shards, sampled: keys.count,
                    meanEntries: counts.isEmpty ? 0 : Double(counts.reduce(0, +)) / Double(counts.count),
                    maxEntries: counts.max() ?? 0, hashtables: kind.isHash ? hashtables : nil, ceiling: kind.ceiling,
                    target: kind.isHash ? 100 : 1_000))
        }
        return out
    }
}
