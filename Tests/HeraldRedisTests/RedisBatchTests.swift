import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@testable import HeraldRedis

/// `RedisBatch` writes the hot paths' commands straight into one buffer; these tests hold every such batch to the
/// same bytes as the commands built one by one with `RedisCommand` and `RedisKeys`, and check the batch calls of
/// the connection against a real server.
@Suite("RedisBatch: commands written into one buffer")
struct RedisBatchTests {
    static func concatenated(_ commands: [RedisCommand]) -> [UInt8] { commands.flatMap(\.encoded) }

    @Test("every kind of argument, and a key written in parts, give the bytes RedisCommand gives")
    func sameBytesAsCommands() {
        var batch = RedisBatch()
        batch.command("HSET", arguments: 4)
        batch.argument("herald", ":", "app é", ":user:{", "u\r\n1", "}:devices", "")
        batch.argument([0xFF, 0x00] as [UInt8])
        batch.argument(Int64.min)
        batch.argument(([9, 1, 2, 3] as [UInt8])[1...2])
        batch.command("PING", arguments: 0)
        batch.command("GET", arguments: 1)
        batch.argument("k")
        batch.command("SET", arguments: 2)
        batch.argument("")
        batch.argument("v")
        let expected = Self.concatenated([
            RedisCommand(
                "HSET", "herald:app é:user:{u\r\n1}:devices", [0xFF, 0x00] as [UInt8], Int64.min, [1, 2] as [UInt8]),
            RedisCommand("PING"), RedisCommand("GET", "k"), RedisCommand("SET", "", "v"),
        ])
        #expect(batch.bytes == expected)
        #expect(batch.count == 4)
        #expect(batch.isComplete)

        var joined = RedisBatch()
        joined.command("PING", arguments: 0)
        joined.append(batch)
        #expect(joined.count == 5)
        #expect(joined.bytes == RedisCommand("PING").encoded + expected)
    }

    @Test("loadUsers' reads are the commands of docs/redis-keys.md, with each user's conversations and without")
    func loadBatchMatchesCommands() {
        let users = ["u1", "ü2", "u{3}"]
        let lists: [[String]] = [["c1"], [], ["c1", "c{2}"]]
        for unreadOf in [lists, nil] as [[[String]]?] {
            let batch = StateStore.loadBatch(
                app: "app1", users: users, unreadOf: unreadOf, preferencesOnly: ["sender"])
            var commands: [RedisCommand] = []
            for (index, user) in users.enumerated() {
                let key = RedisKeys.userState(app: "app1", user: user)
                if let unreadOf {
                    commands.append(
                        RedisCommand(
                            "HMGET",
                            [key, "d", "o", "p", RedisKeys.unreadTotalField]
                                + unreadOf[index].map { RedisKeys.unreadField(conversation: $0) } as [any RedisArgument]
                        ))
                } else {
                    commands.append(RedisCommand("HGETALL", key))
                }
            }
            commands.append(RedisCommand("HGET", RedisKeys.userState(app: "app1", user: "sender"), "p"))
            #expect(batch.bytes == Self.concatenated(commands), "scoped \(unreadOf != nil)")
            #expect(batch.count == commands.count)
        }
    }

    @Test(
        "the explain trail's batch: routine entries left out; one RPUSH and PEXPIRE per hourly log, one HSET per last-decision shard"
    )
    func explainBatchMatchesCommands() {
        func entry(
            _ app: String, _ event: String, user: String?, token: String? = nil, decision: String,
            reason: String? = nil,
            at: Int64 = 1_700_000_000_000
        ) -> ExplainEntry {
            ExplainEntry(
                appID: app, eventID: event, user: user, token: token, stage: "suppress", decision: decision,
                reason: reason, at: at)
        }
        // Interleaved events, apps and hours; u1 has decisions in e1, e2 and e1 again: all three go to u1's shard
        // in entry order, so the last one wins.
        let entries = [
            entry("app1", "e1", user: "u1", decision: "deliver"),
            entry("app1", "e2", user: "u1", decision: "suppress", reason: "dnd"),
            entry("app2", "e1", user: nil, decision: "classified", reason: "high:direct"),
            entry("app1", "e1", user: "u2", token: "t\"2", decision: "dlq", reason: "BadDeviceToken"),
            entry("app1", "e1", user: "u1", decision: "suppress", reason: "mut\u{e9}d\tx"),
            entry("app1", "e2", user: nil, decision: "fanned_out"),
            entry("app1", "e1", user: "u3", decision: "suppress", reason: "muted", at: 1_700_003_600_000),
        ]
        let ttl: Int64 = 172_800_000
        let hour: Int64 = 3_600_000
        let batch = ExplainStore.batch(entries, ttlMilliseconds: ttl)
        func line(_ i: Int, user: Bool = true) -> [UInt8] {
            var out: [UInt8] = []
            var e = entries[i]
            if !user { e.user = nil }
            // A log line's time counts from the start of its hour; a last decision's is absolute.
            e.writeLine(into: &out, base: user ? e.at / hour * hour : nil)
            return Array(out.dropLast())
        }
        func log(_ app: String, _ event: String, _ at: Int64) -> String {
            RedisKeys.explainLog(app: app, shard: RedisKeys.explainShard(eventId: event), hour: at / hour)
        }
        var commands: [RedisCommand] = []
        // Not routine: 1, 3, 4 (e1 and e2 land in their shards' logs), 6 (next hour).
        var logs: [(String, [Int])] = []
        for index in [1, 3, 4, 6] {
            let key = log(entries[index].appID, entries[index].eventID, entries[index].at)
            if let k = logs.firstIndex(where: { $0.0 == key }) {
                logs[k].1.append(index)
            } else {
                logs.append((key, [index]))
            }
        }
        for (key, members) in logs {
            commands.append(RedisCommand("RPUSH", [key] + members.map { line($0) }))
            commands.append(RedisCommand("PEXPIRE", key, ttl + hour))
        }
        var shards: [(String, [Int])] = []
        for index in [0, 1, 4, 6] {
            let e = entries[index]
            let key = RedisKeys.lastDecisions(app: e.appID, shard: RedisKeys.lastDecisionShard(user: e.user ?? ""))
            if let k = shards.firstIndex(where: { $0.0 == key }) {
                shards[k].1.append(index)
            } else {
                shards.append((key, [index]))
            }
        }
        for (key, members) in shards {
            var arguments: [any RedisArgument] = [key]
            for index in members {
                arguments.append(entries[index].user ?? "")
                arguments.append(line(index, user: false))
            }
            commands.append(RedisCommand("HSET", arguments))
        }
        #expect(batch.bytes == Self.concatenated(commands))
        #expect(batch.count == commands.count)
        // A full trail for app2 adds its routine entry.
        let full = ExplainStore.batch(entries, ttlMilliseconds: ttl, fullTrail: FullTrailPolicy(apps: ["app2"]))
        #expect(full.count == batch.count + 2)
    }

    @Test("a batch is one round trip with one reply per command; write reads every reply and throws the first error")
    func batchesOnARealServer() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }

        var reads = RedisBatch()
        reads.command("SET", arguments: 2)
        reads.argument("k", "1")
        reads.argument("v")
        reads.command("GET", arguments: 1)
        reads.argument("k1")
        reads.command("HGET", arguments: 2)
        reads.argument("k1")
        reads.argument("f")
        #expect(try await redis.pipeline(reads).map { $0.text ?? "" }.prefix(2) == ["OK", "v"])

        var writes = RedisBatch()
        writes.command("SET", arguments: 2)
        writes.argument("a")
        writes.argument("1")
        writes.command("INCR", arguments: 1)
        writes.argument("k1")  // not an integer: an error reply
        writes.command("SET", arguments: 2)
        writes.argument("b")
        writes.argument("2")
        await #expect(throws: RedisError.self) { try await redis.write(writes, what: "test") }
        // Every reply was read: the connection is in step, and the command after the error ran.
        #expect(try await redis.send("GET", "b") == .string(Data("2".utf8)))
        #expect(try await redis.send("GET", "a") == .string(Data("1".utf8)))
        try await redis.write(RedisBatch(), what: "empty")
        #expect(try await redis.pipeline(RedisBatch()).isEmpty)
    }
}
