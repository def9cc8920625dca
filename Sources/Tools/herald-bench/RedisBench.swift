// herald-bench redis: what it costs to build the Redis commands of the per-recipient paths, one `RedisCommand` at a
// time (how every command was built before RedisBatch) against one `RedisBatch` (how resolve's state reads and
// the explain trail are built now). The `RedisCommand` side is spelled out here as the baseline; RedisBatchTests
// hold both to the same bytes. On-CPU time of this thread, so other work on the machine does not count.

import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis

struct RedisBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "redis",
        abstract: "Time building resolve's state reads and the explain trail: RedisCommand per command vs RedisBatch.")

    @Option(help: "Recipients (users or explain entries) per batch.") var recipients = 500
    @Option(help: "Seconds of CPU time to measure each case (three runs, the best counts).") var seconds = 0.6

    func run() throws {
        let users = (0..<recipients).map { "user-\($0)" }
        let now: Int64 = 1_732_000_000_123
        let oneByOne = measure {
            _ = Self.loadCommands(app: "app1", users: users, conversation: "c-hiking", now: now, light: ["sender"])
        }
        let batched = measure {
            _ = StateStore.loadBatch(
                app: "app1", users: users, conversation: "c-hiking", now: now, preferencesOnly: ["sender"])
        }
        let entries = (0..<recipients).map { i in
            ExplainEntry(
                appID: "app1", eventID: "evt-\(i / 4)", user: "user-\(i)", stage: "suppress",
                decision: i % 3 == 0 ? "suppress" : "deliver", reason: i % 3 == 0 ? "dnd" : nil, at: now,
                count: i % 3 == 0 ? nil : 1)
        }
        let explainOneByOne = measure { _ = Self.explainCommands(entries, ttl: 604_800_000) }
        let explainBatched = measure { _ = ExplainStore.batch(entries, ttlMilliseconds: 604_800_000) }

        print("herald-bench redis: building the commands for \(recipients) recipients, on-CPU time of one thread")
        print("| what | RedisCommand per command | RedisBatch | ratio |")
        print("| --- | --- | --- | --- |")
        for (what, a, b) in [
            ("resolve's state reads (4 per user)", oneByOne, batched),
            (
                "explain trail, suppress's entries (HSET + PEXPIRE per event, SET per user)", explainOneByOne,
                explainBatched
            ),
        ] {
            print(
                String(
                    format: "| %@ | %.2f µs per recipient | %.2f µs per recipient | %.2fx |", what,
                    a / Double(recipients) / 1000, b / Double(recipients) / 1000, a / b))
        }
    }

    /// loadUsers' reads as they were built before RedisBatch.
    static func loadCommands(
        app: String, users: [String], conversation: String, now: Int64, light: [String]
    )
        -> [RedisCommand]
    {
        var commands: [RedisCommand] = []
        commands.reserveCapacity(users.count * 4 + light.count)
        for user in users {
            commands.append(RedisCommand("HGETALL", RedisKeys.devices(app: app, user: user)))
            commands.append(RedisCommand("ZRANGEBYSCORE", RedisKeys.presence(app: app, user: user), "(\(now)", "+inf"))
            commands.append(RedisCommand("GET", RedisKeys.preferences(app: app, user: user)))
            commands.append(
                RedisCommand(
                    "HMGET", RedisKeys.unread(app: app, user: user), RedisKeys.unreadTotalField,
                    RedisKeys.unreadField(conversation: conversation)))
        }
        for user in light { commands.append(RedisCommand("GET", RedisKeys.preferences(app: app, user: user))) }
        return commands
    }

    /// The explain trail's commands as they were built before RedisBatch (entries of one event in a row).
    static func explainCommands(_ entries: [ExplainEntry], ttl: Int64) -> [RedisCommand] {
        var groups: [(key: String, arguments: [any RedisArgument])] = []
        var groupOf: [String: Int] = [:]
        var current = -1
        var last: ExplainEntry?
        var lastDecisions: [RedisCommand] = []
        for entry in entries {
            let json = entry.jsonBytes
            if current < 0 || last?.eventID != entry.eventID || last?.appID != entry.appID {
                let key = ExplainStore.key(app: entry.appID, eventID: entry.eventID)
                if let known = groupOf[key] {
                    current = known
                } else {
                    current = groups.count
                    groupOf[key] = current
                    groups.append((key, [key]))
                }
            }
            last = entry
            groups[current].arguments.append(entry.field)
            groups[current].arguments.append(json)
            if let user = entry.user, entry.token == nil {
                lastDecisions.append(
                    RedisCommand("SET", RedisKeys.lastDecision(app: entry.appID, user: user), json, "PX", ttl))
            }
        }
        var commands: [RedisCommand] = []
        for group in groups {
            commands.append(RedisCommand("HSET", group.arguments))
            commands.append(RedisCommand("PEXPIRE", group.key, ttl))
        }
        return commands + lastDecisions
    }

    /// On-CPU nanoseconds of this thread per call of `body`: the best of three runs of `seconds / 3` each.
    func measure(_ body: () -> Void) -> Double {
        for _ in 0..<20 { body() }
        var best = Double.infinity
        for _ in 0..<3 {
            let start = HeraldBenchClock.threadCPUNanoseconds()
            var calls = 0
            while Double(HeraldBenchClock.threadCPUNanoseconds() - start) < seconds / 3 * 1e9 {
                body()
                calls += 1
            }
            best = min(best, Double(HeraldBenchClock.threadCPUNanoseconds() - start) / Double(calls))
        }
        return best
    }
}
