import HeraldCore
import Synchronization

/// A Lua script run with EVALSHA, so its text is not sent and hashed again with every call: loaded with
/// `SCRIPT LOAD` on first use, and again when the server answers NOSCRIPT (it restarted, or its script cache was
/// flushed), after which the batch is sent once more.
final class LoadedScript: Sendable {
    let body: String
    private let sha = Mutex<String?>(nil)

    init(_ body: String) { self.body = body }

    /// Sends the batch `build` makes with the script's SHA1 and returns its replies.
    func run(
        on connection: RedisConnection, what: String, _ build: (String) -> RedisBatch
    ) async throws -> [RedisValue] {
        for attempt in 0..<2 {
            let known = try await load(on: connection)
            let batch = build(known)
            let replies = try await connection.pipeline(batch)
            guard replies.count == batch.count else {
                throw RedisError(.unexpectedReply, "\(what): expected \(batch.count) replies, got \(replies.count)")
            }
            let unknown = replies.contains {
                if case .error(let message) = $0 { return message.hasPrefix("NOSCRIPT") }
                return false
            }
            if !unknown || attempt == 1 { return replies }
            sha.withLock { $0 = nil }
        }
        return []
    }

    /// The script's SHA1, loading the script first when this process has not yet, or, with `again`, in any case (a
    /// node answered NOSCRIPT: another caller may have loaded it meanwhile, on another server).
    func load(on connection: RedisConnection, again: Bool = false) async throws -> String {
        if !again, let known = sha.withLock({ $0 }) { return known }
        let reply = try await connection.send(RedisCommand("SCRIPT", "LOAD", body)).orThrow("SCRIPT LOAD")
        guard let text = reply.text else { throw RedisError(.unexpectedReply, "SCRIPT LOAD answered \(reply)") }
        sha.withLock { $0 = text }
        return text
    }
}
