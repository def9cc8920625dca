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
                app: "app1", users: users, unreadOf: Array(repeating: ["c-hiking"], count: users.count),
                preferencesOnly: ["sender"])
        }
        let entries = (0..<recipients).map { i in
            ExplainEntry(
                appID: "app1", eventID: "evt-\(i / 4)", user: "user-\(i)", stage: "suppress",
                decision: i % 3 == 0 ? "suppress" : "deliver", reason: i % 3 == 0 ? "dnd" : nil, at: now,
                count: i % 3 == 0 ? nil : 1)
        }
        let explainBatched = measure { _ = ExplainStore.batch(entries, ttlMilliseconds: 172_800_000) }

        print("herald-bench redis: building the commands for \(recipients) recipients, on-CPU time of one thread")
        print("| what | RedisCommand per command | RedisBatch | ratio |")
        print("| --- | --- | --- | --- |")
        print(
            String(
                format:
                    "| resolve's state reads (one HMGET per user) | %.2f µs per recipient | %.2f µs per recipient | %.2fx |",
                oneByOne / Double(recipients) / 1000, batched / Double(recipients) / 1000, oneByOne / batched))
        print(
            String(
                format:
                    "| explain trail, suppress's entries (compact: APPEND per hourly log, HSET per last-decision shard) | | %.2f µs per recipient | |",
                explainBatched / Double(recipients) / 1000))
    }

    /// loadUsers' reads as they were built before RedisBatch.
    static func loadCommands(
        app: String, users: [String], conversation: String, now: Int64, light: [String]
    )
        -> [RedisCommand]
    {
        var commands: [RedisCommand] = []
        commands.reserveCapacity(users.count + light.count)
        for user in users {
            commands.append(
                RedisCommand(
                    "HMGET", RedisKeys.userState(app: app, user: user), UserRecord.devicesField,
                    UserRecord.onlineField, UserRecord.preferencesField, RedisKeys.unreadTotalField,
                    RedisKeys.unreadField(conversation: conversation)))
        }
        for user in light {
            commands.append(
                RedisCommand("HGET", RedisKeys.userState(app: app, user: user), UserRecord.preferencesField))
        }
        return commands
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
