// What a run leaves in Redis and what it costs Redis: `used_memory` (INFO memory) and
// `total_commands_processed`, `total_reads_processed` and `total_writes_processed` (INFO stats), read once the users'
// state is loaded and again after the drain.
import Foundation
import HeraldRedis

package struct RedisSnapshot {
    package var usedMemory: Int
    package var commands: Int
    /// Reads from its clients' connections (`total_reads_processed`): about one per round trip a client made.
    package var reads: Int = 0
    /// Writes of replies to its clients' connections (`total_writes_processed`).
    package var writes: Int = 0
    /// `INFO commandstats` per command (Lua scripts' own calls included): calls and microseconds spent.
    package var byCommand: [String: (calls: Int, usec: Int)] = [:]

    /// Reads the figures with one INFO per section (the reading itself adds three commands, left in).
    package static func read(port: Int) async throws -> RedisSnapshot {
        let conn = RedisConnection(configuration: try RedisConfiguration(url: "redis://127.0.0.1:\(port)"))
        defer { conn.close() }
        func section(_ name: String) async throws -> String {
            try await conn.send(RedisCommand("INFO", name)).orThrow("INFO").text ?? ""
        }
        func field(_ text: String, _ name: String) throws -> Int {
            for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix(name + ":") {
                if let v = Int(line.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces)) { return v }
            }
            throw BenchError("INFO has no \(name)")
        }
        var byCommand: [String: (calls: Int, usec: Int)] = [:]
        let stats = try await conn.send(RedisCommand("INFO", "commandstats")).orThrow("INFO").text ?? ""
        // cmdstat_hget:calls=12,usec=30,usec_per_call=2.50,...
        for line in stats.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_") {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = String(line[line.index(line.startIndex, offsetBy: 8)..<colon])
            var calls = 0
            var usec = 0
            for pair in line[line.index(after: colon)...].split(separator: ",") {
                let kv = pair.split(separator: "=", maxSplits: 1)
                guard kv.count == 2, let v = Int(kv[1]) else { continue }
                if kv[0] == "calls" { calls = v } else if kv[0] == "usec" { usec = v }
            }
            byCommand[name] = (calls, usec)
        }
        let memory = try await section("memory")
        let counters = try await section("stats")
        return RedisSnapshot(
            usedMemory: try field(memory, "used_memory"), commands: try field(counters, "total_commands_processed"),
            reads: try field(counters, "total_reads_processed"), writes: try field(counters, "total_writes_processed"),
            byCommand: byCommand)
    }
}

/// Redis before and after a run.
package struct RedisFootprint {
    package var before: RedisSnapshot
    package var after: RedisSnapshot

    /// Bytes of Redis memory the run left behind (what it keeps per notification until its TTLs end).
    package var retainedBytes: Int { after.usedMemory - before.usedMemory }
    package var commands: Int { after.commands - before.commands }
    package var reads: Int { after.reads - before.reads }
    package var writes: Int { after.writes - before.writes }

    /// Calls and microseconds per command during the run, most time first.
    package var byCommand: [(name: String, calls: Int, usec: Int)] {
        after.byCommand.map { name, a in
            let b = before.byCommand[name] ?? (0, 0)
            return (name, a.calls - b.calls, a.usec - b.usec)
        }
        .filter { $0.calls > 0 }
        .sorted { ($0.usec, $0.name) > ($1.usec, $1.name) }
    }

    package func perNotification(_ value: Int, _ notifications: Int) -> Double {
        notifications > 0 ? Double(value) / Double(notifications) : 0
    }
}

extension StackInfo {
    /// Rings the idle doorbell of `topics` (topics between stages the bench wrote to itself), as Herald's tools do
    /// after writing there: idle consumers then fetch at once instead of at their next probe. Returns the topics
    /// Redis did not take a ring for.
    package func ringDoorbells(_ topics: [String]) async -> [String] {
        guard let configuration = try? RedisConfiguration(url: redisURL) else { return topics }
        let connection = RedisConnection(configuration: configuration)
        defer { connection.close() }
        return await RedisKeys.ringDoorbells(Set(topics), on: connection)
    }
}
