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

    /// `key(app:eventID:)` written into a batch as one argument.
    static func writeKey(app: String, eventID: String, into batch: inout RedisBatch) {
        batch.argument(RedisKeys.prefix, ":", app, ":explain:{", eventID, "}")
    }

    /// Writes `entries` in one pipelined round trip: one HSET and one PEXPIRE per event (in the order events first
    /// appear), then the latest decision of each user-level entry, in the entries' order. Everything is written
    /// straight into one `RedisBatch`: each entry's JSON is built once, into a reused buffer, and the last
    /// decisions copy it from where the HSET holds it.
    public func record(_ entries: [ExplainEntry]) async throws {
        if entries.isEmpty { return }
        try await connection.write(Self.batch(entries, ttlMilliseconds: ttlMilliseconds), what: "explain")
    }

    /// The commands `record` sends (tests hold them to the commands spelled out one by one; `herald-bench redis`
    /// times both).
    public static func batch(_ entries: [ExplainEntry], ttlMilliseconds: Int64) -> RedisBatch {
        struct EventRef: Hashable {
            let app: String
            let event: String
        }
        // Entries of one event mostly come one after another: only a change of event looks its group up.
        var groups: [[Int]] = []
        var groupOf: [EventRef: Int] = [:]
        var current = -1
        for (index, entry) in entries.enumerated() {
            if current < 0 || entries[index - 1].eventID != entry.eventID || entries[index - 1].appID != entry.appID {
                let ref = EventRef(app: entry.appID, event: entry.eventID)
                if let known = groupOf[ref] {
                    current = known
                } else {
                    current = groups.count
                    groupOf[ref] = current
                    groups.append([])
                }
            }
            groups[current].append(index)
        }
        var batch = RedisBatch(capacity: 64 + entries.count * 256)
        var json = JSONWriter(capacity: 256)
        // Where each entry's JSON sits in the batch (start, length), for the last decisions.
        var jsonAt = [(Int, Int)](repeating: (0, 0), count: entries.count)
        for group in groups {
            let first = entries[group[0]]
            batch.command("HSET", arguments: 1 + 2 * group.count)
            writeKey(app: first.appID, eventID: first.eventID, into: &batch)
            for index in group {
                let entry = entries[index]
                if let token = entry.token {
                    batch.argument("device:", entry.user ?? "", ":", token)
                } else if let user = entry.user {
                    batch.argument("user:", user)
                } else {
                    batch.argument(entry.decision == "classified" ? "class" : "event")
                }
                json.bytes.removeAll(keepingCapacity: true)
                entry.writeJSON(into: &json)
                batch.argument(json.bytes)
                jsonAt[index] = (batch.bytes.count - 2 - json.bytes.count, json.bytes.count)
            }
            batch.command("PEXPIRE", arguments: 2)
            writeKey(app: first.appID, eventID: first.eventID, into: &batch)
            batch.argument(ttlMilliseconds)
        }
        // The latest decision about each user (what the registry API's explain answers).
        var decisions = RedisBatch(capacity: 64)
        for (index, entry) in entries.enumerated() {
            guard let user = entry.user, entry.token == nil else { continue }
            let (start, length) = jsonAt[index]
            decisions.command("SET", arguments: 4)
            decisions.userKey(app: entry.appID, user: user, .lastDecision)
            decisions.argument(batch.bytes[start..<(start + length)])
            decisions.argument("PX")
            decisions.argument(ttlMilliseconds)
        }
        batch.append(decisions)
        return batch
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
