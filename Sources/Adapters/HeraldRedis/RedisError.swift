/// Every failure of the Redis adapter, with a stable code.
///
/// `isRetryable` tells a caller what to do next: a retryable error means the connection broke or timed out
/// (the connection has already been dropped, and the next call reconnects, with backoff); the caller should
/// retry the whole batch, since it cannot know which of its commands the server executed. Every command the
/// stages send is idempotent (HSET, SET, ZADD, SADD, DEL, SET NX) or an atomic script, so a retry is safe.
public struct RedisError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable {
        /// The TCP connection could not be opened (refused, unreachable, connect timeout).
        case connectFailed = "connect_failed"
        /// A read or write failed or the server closed the connection.
        case connectionBroken = "connection_broken"
        /// No answer within the command timeout; the connection was dropped.
        case timeout
        /// The server's bytes were not valid RESP; the connection was dropped.
        case protocolError = "protocol_error"
        /// The server answered with an error reply (`ERR`, `WRONGTYPE`, `NOAUTH`...).
        case serverError = "server_error"
        /// The reply did not have the shape the caller expected.
        case unexpectedReply = "unexpected_reply"
        /// Stored data could not be decoded (bad JSON in a device entry, for example).
        case invalidData = "invalid_data"
        /// Bad configuration (URL, port).
        case invalidConfiguration = "invalid_configuration"
        /// The connection was closed by its owner.
        case closed
        /// Redis Cluster could not serve a command for now: no node answered with the slot map, or a slot stayed
        /// redirected or unserved (a failover or a resharding under way).
        case clusterUnavailable = "cluster_unavailable"
    }

    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// True when the connection broke, timed out or could not be opened: retry the batch.
    public var isRetryable: Bool {
        switch code {
        case .connectFailed, .connectionBroken, .timeout, .protocolError, .clusterUnavailable: return true
        // A server that is still loading its data after a restart, busy with a script, or between masters
        // answers the same command correctly a moment later.
        case .serverError: return Self.transientReplies.contains { message.contains($0) }
        case .unexpectedReply, .invalidData, .invalidConfiguration, .closed: return false
        }
    }

    /// Error replies that mean "not now" rather than "never": retried like a broken connection.
    static let transientReplies = ["LOADING ", "BUSY ", "MASTERDOWN ", "TRYAGAIN ", "CLUSTERDOWN "]

    public var description: String { "RedisError.\(code.rawValue): \(message)" }
}
