import Foundation
import HeraldCore

/// The explain trail in Redis: written by the stages, read by `heraldctl explain`.
/// Writes are one pipelined round trip per batch (HSET + PEXPIRE per event); entries expire after the TTL.
public final class ExplainStore: Sendable {
    public let connection: RedisConnection
    public let ttlMilliseconds: Int64

    /// - Parameter ttlMilliseconds: how long a trail is kept after its last write (default 7 days).
    public init(connection: RedisConnection, ttlMilliseconds: Int64 = 7 * 86_400_000) {
        self.connection = connection
        self.ttlMilliseconds = ttlMilliseconds
    }

    /// The hash holding one event's trail.
    public static func key(app: String, eventID: String) -> String {
        "\(RedisKeys.prefix):\(app):explain:{\(eventID)}"
    }

    /// Writes `entries` in one pipelined round trip: one HSET and one PEXPIRE per event (in the order events first
    /// appear), then the latest decision of each user-level entry. Each entry's JSON is built once.
    public func record(_ entries: [ExplainEntry]) async throws {
        if entries.isEmpty { return }
        // Entries of one event mostly come one after another: only a change of event builds its key and looks it up.
        var groups: [(key: String, arguments: [any RedisArgument])] = []
        var groupOf: [String: Int] = [:]
        var current = -1
        var last: ExplainEntry?
        var lastDecisions: [RedisCommand] = []
        for entry in entries {
            let json = entry.jsonBytes
            if current < 0 || last?.eventID != entry.eventID || last?.appID != entry.appID {
                let key = Self.key(app: entry.appID, eventID: entry.eventID)
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
            // The latest decision about each user (what the registry API's explain answers).
            if let user = entry.user, entry.token == nil {
                lastDecisions.append(
                    RedisCommand(
                        "SET", RedisKeys.lastDecision(app: entry.appID, user: user), json, "PX", ttlMilliseconds))
            }
        }
        var commands: [RedisCommand] = []
        commands.reserveCapacity(groups.count * 2 + lastDecisions.count)
        for group in groups {
            commands.append(RedisCommand("HSET", group.arguments))
            commands.append(RedisCommand("PEXPIRE", group.key, ttlMilliseconds))
        }
        commands += lastDecisions
        for reply in try await connection.pipeline(commands) { _ = try reply.orThrow("explain") }
    }

    /// Every entry of one event's trail: the event-level entry first, then users, then devices, each sorted.
    /// Fields that are not valid JSON are skipped.
    public func trail(app: String, eventID: String) async throws -> [ExplainEntry] {
        let reply = try await connection.send(RedisCommand("HGETALL", Self.key(app: app, eventID: eventID))).orThrow(
            "HGETALL")
        guard let values = reply.array else { return [] }
        var out: [ExplainEntry] = []
        var index = 0
        while index + 1 < values.count {
            if let data = values[index + 1].data, let entry = try? ExplainEntry(json: data) {
                out.append(entry)
            }
            index += 2
        }
        func rank(_ e: ExplainEntry) -> Int { e.token != nil ? 2 : (e.user != nil ? 1 : 0) }
        return out.sorted { (rank($0), $0.user ?? "", $0.token ?? "") < (rank($1), $1.user ?? "", $1.token ?? "") }
    }

    /// The user's latest decision (the last user-level entry written, by any event) and that event's trail
    /// about the user; nil when there is none (never a recipient, or the trail expired).
    public func lastDecision(app: String, user: String) async throws -> (decision: ExplainEntry, trail: [ExplainEntry])?
    {
        let reply = try await connection.send(RedisCommand("GET", RedisKeys.lastDecision(app: app, user: user)))
            .orThrow("GET")
        guard let data = reply.data, let entry = try? ExplainEntry(json: data) else { return nil }
        return (entry, try await trail(app: app, eventID: entry.eventID, user: user))
    }

    /// The entries about one user (their decision and their devices' outcomes).
    public func trail(app: String, eventID: String, user: String) async throws -> [ExplainEntry] {
        try await trail(app: app, eventID: eventID).filter { $0.user == user || ($0.user == nil && $0.token == nil) }
    }
}
