/// What an APNs answer (or a transport failure) means, before any retry budget is applied.
public enum APNsAnswerClass: Equatable, Sendable {
    /// 200: Apple accepted the notification.
    case delivered
    /// Worth sending again later (429, 500, 503, connection loss).
    case retryable
    /// The device token is no longer valid; `unregisteredAt` is 410's timestamp (ms since epoch), if any.
    case tokenDead(unregisteredAt: Int64?)
    /// The provider token was rejected as expired: make a new JWT and send again.
    case renewCredentials
    /// Sending the same request again cannot succeed (a bug on our side or a configuration error).
    case permanent
}

/// What the send stage should do with one notification after an answer.
public enum APNsDisposition: Equatable, Sendable {
    case delivered
    /// Send again after `after` (exponential backoff with jitter; `attempt` is the attempt just made).
    case retry(after: Duration)
    /// Remove the token unless it was registered again after `unregisteredAt` (ms since epoch).
    case tokenDead(unregisteredAt: Int64?)
    /// Renew the provider credential (JWT) and send again.
    case renewCredentials
    /// Dead-letter the notification with this reason.
    case permanentFailure(reason: String)
}

/// Failures below HTTP: the request got no APNs answer.
public enum APNsTransportFailure: Equatable, Sendable, CustomStringConvertible {
    /// Could not open a connection (DNS, TCP, TLS handshake, ALPN).
    case connectFailed(String)
    /// The connection closed or broke while the request was in flight; APNs may or may not have it.
    case connectionLost
    /// The server reset the stream with an HTTP/2 error code other than REFUSED_STREAM.
    case streamReset(errorCode: UInt32)
    /// The request's deadline passed before an answer came.
    case deadlineExceeded
    /// The credential could not be loaded or a JWT could not be signed.
    case credentialUnusable(String)
    /// The client was shut down before the request completed.
    case clientShutdown
    /// The response could not be understood (e.g. no `:status`).
    case protocolViolation(String)

    /// A short stable name (metric label, log field).
    public var kind: String {
        switch self {
        case .connectFailed: "ConnectFailed"
        case .connectionLost: "ConnectionLost"
        case .streamReset: "StreamReset"
        case .deadlineExceeded: "DeadlineExceeded"
        case .credentialUnusable: "CredentialUnusable"
        case .clientShutdown: "ClientShutdown"
        case .protocolViolation: "ProtocolViolation"
        }
    }

    public var description: String {
        switch self {
        case .connectFailed(let why): "ConnectFailed(\(why))"
        case .connectionLost: "ConnectionLost"
        case .streamReset(let code): "StreamReset(\(code))"
        case .deadlineExceeded: "DeadlineExceeded"
        case .credentialUnusable(let why): "CredentialUnusable(\(why))"
        case .clientShutdown: "ClientShutdown"
        case .protocolViolation(let why): "ProtocolViolation(\(why))"
        }
    }
}

/// The single table from APNs status + reason (and transport failures) to a class of answer.
/// Source: Apple's "Handling notification responses from APNs" status and reason lists.
public enum APNsAnswerTable {
    /// One row: a status, optionally narrowed to one reason, and what it means.
    public struct Row: Sendable {
        public let status: Int
        public let reason: APNsReason?
        public let answer: APNsAnswerClass
    }

    /// Exact (status, reason) rows first; rows with `reason == nil` apply to any other reason of that status.
    public static let rows: [Row] = [
        Row(status: 200, reason: nil, answer: .delivered),
        // 400: the token rows mean the device token is dead; the rest are bugs in our request.
        Row(status: 400, reason: .badDeviceToken, answer: .tokenDead(unregisteredAt: nil)),
        Row(status: 400, reason: .deviceTokenNotForTopic, answer: .tokenDead(unregisteredAt: nil)),
        Row(status: 400, reason: .idleTimeout, answer: .retryable),
        Row(status: 400, reason: nil, answer: .permanent),
        // 403: an expired provider token is renewed; every other 403 is a credential misconfiguration.
        Row(status: 403, reason: .expiredProviderToken, answer: .renewCredentials),
        Row(status: 403, reason: nil, answer: .permanent),
        Row(status: 404, reason: nil, answer: .permanent),
        Row(status: 405, reason: nil, answer: .permanent),
        // 410: Unregistered / ExpiredToken; the timestamp is attached by `classify`.
        Row(status: 410, reason: nil, answer: .tokenDead(unregisteredAt: nil)),
        Row(status: 413, reason: nil, answer: .permanent),
        Row(status: 429, reason: .tooManyRequests, answer: .retryable),
        Row(status: 429, reason: .tooManyProviderTokenUpdates, answer: .retryable),
        Row(status: 429, reason: nil, answer: .retryable),
        Row(status: 500, reason: nil, answer: .retryable),
        Row(status: 503, reason: .serviceUnavailable, answer: .retryable),
        Row(status: 503, reason: .shutdown, answer: .retryable),
        Row(status: 503, reason: nil, answer: .retryable),
    ]

    /// Classifies an HTTP answer. `timestamp` is the 410 body's `timestamp` (ms since epoch).
    public static func classify(status: Int, reason: APNsReason?, timestamp: Int64?) -> APNsAnswerClass {
        let row =
            rows.first { $0.status == status && $0.reason != nil && $0.reason == reason }
            ?? rows.first { $0.status == status && $0.reason == nil }
        var answer: APNsAnswerClass
        if let row {
            answer = row.answer
        } else if (500..<600).contains(status) {
            answer = .retryable
        } else {
            answer = .permanent
        }
        if case .tokenDead = answer, status == 410 {
            answer = .tokenDead(unregisteredAt: timestamp)
        }
        return answer
    }

    /// Classifies a failure below HTTP.
    public static func classify(_ failure: APNsTransportFailure) -> APNsAnswerClass {
        switch failure {
        case .connectFailed, .connectionLost, .streamReset, .protocolViolation: .retryable
        case .deadlineExceeded, .credentialUnusable, .clientShutdown: .permanent
        }
    }
}
