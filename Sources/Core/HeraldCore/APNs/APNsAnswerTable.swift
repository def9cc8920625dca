/// The single table from APNs status + reason (and transport failures) to a class of answer.
/// Source: Apple's "Handling notification responses from APNs" status and reason lists.
public enum APNsAnswerTable {
    /// One row: a status, optionally narrowed to one reason, and what it means.
    public struct Row: Sendable {
        public let status: Int
        public let reason: APNsReason?
        public let answer: PushAnswerClass
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
    public static func classify(status: Int, reason: APNsReason?, timestamp: Int64?) -> PushAnswerClass {
        let row =
            rows.first { $0.status == status && $0.reason != nil && $0.reason == reason }
            ?? rows.first { $0.status == status && $0.reason == nil }
        var answer: PushAnswerClass
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
    public static func classify(_ failure: PushTransportFailure) -> PushAnswerClass {
        switch failure {
        case .connectFailed, .connectionLost, .streamReset, .protocolViolation: .retryable
        case .deadlineExceeded, .credentialUnusable, .clientShutdown: .permanent
        }
    }
}
