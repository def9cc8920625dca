// What a run leaves in Redis and what it costs Redis: `used_memory` (INFO memory) and
// `total_commands_processed` (INFO stats), read once the users' state is loaded and again after the drain.
import Foundation
import HeraldRedis

package struct RedisSnapshot {
    package var usedMemory: Int
    package var commands: Int
    /// `INFO commandstats` per command (Lua scripts' own calls included): calls and microseconds spent.
    package var byCommand: [String: (calls: Int, usec: Int)] = [:]

    /// Reads both figures with one INFO each (the reading itself adds two commands, left in).
    package static func read(port: Int) async throws -> RedisSnapshot {
        let conn = RedisConnection(configuration: try RedisConfiguration(url: "redis://127.0.0.1:\(port)"))
        defer { conn.close() }
        func field(_ section: String, _ name: String) async throws -> Int {
            let text = try await conn.send(RedisCommand("INFO", section)).orThrow("INFO").text ?? ""
            for line in text.split(whereSeparator: \.isNewline) where line.hasPrefix(name + ":") {
                if let v = Int(line.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces)) { return v }
            }
            throw BenchError("INFO \(section) has no \(name)")
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
        return RedisSnapshot(
            usedMemory: try await field("memory", "used_memory"),
            commands: try await field("stats", "total_commands_processed"), byCommand: byCommand)
    }
}

/// Redis before and after a run.
package struct RedisFootprint {
    package var before: RedisSnapshot
    package var after: RedisSnapshot

    /// Bytes of Redis memory the run left behind (what it keeps per notification until its TTLs end).
    package var retainedBytes: Int { after.usedMemory - before.usedMemory }
    package var commands: Int { after.commands - before.commands }

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
