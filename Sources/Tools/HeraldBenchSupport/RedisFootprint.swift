// What a run leaves in Redis and what it costs Redis: `used_memory` (INFO memory) and
// `total_commands_processed` (INFO stats), read once the users' state is loaded and again after the drain.
import Foundation
import HeraldRedis

package struct RedisSnapshot {
    package var usedMemory: Int
    package var commands: Int

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
        return RedisSnapshot(
            usedMemory: try await field("memory", "used_memory"),
            commands: try await field("stats", "total_commands_processed"))
    }
}

/// Redis before and after a run.
package struct RedisFootprint {
    package var before: RedisSnapshot
    package var after: RedisSnapshot

    /// Bytes of Redis memory the run left behind (what it keeps per notification until its TTLs end).
    package var retainedBytes: Int { after.usedMemory - before.usedMemory }
    package var commands: Int { after.commands - before.commands }

    package func perNotification(_ value: Int, _ notifications: Int) -> Double {
        notifications > 0 ? Double(value) / Double(notifications) : 0
    }
}
