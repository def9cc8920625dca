// Custom webhook answers, classified into the same classes as APNs answers.

/// What a webhook's HTTP status means: 2xx delivered; 408, 429 and 5xx retried with backoff;
/// every other status is permanent (dead-lettered with `HTTP <status>`). A webhook has no token
/// to declare dead. Failures below HTTP (connect, TLS, the 2-second answer deadline) are retried.
public enum WebhookAnswerTable {
    public struct Row: Sendable {
        public let statuses: ClosedRange<Int>
        public let answer: PushAnswerClass
    }

    public static let rows: [Row] = [
        Row(statuses: 200...299, answer: .delivered),
        Row(statuses: 408...408, answer: .retryable),
        Row(statuses: 429...429, answer: .retryable),
        Row(statuses: 500...599, answer: .retryable),
    ]

    public static func classify(status: Int) -> PushAnswerClass {
        rows.first { $0.statuses.contains(status) }?.answer ?? .permanent
    }

    /// Below HTTP every failure may be transient (including the answer deadline).
    public static func classify(_ failure: PushTransportFailure) -> PushAnswerClass {
        failure == .clientShutdown ? .permanent : .retryable
    }

    /// The reason text for metrics, logs and the DLQ.
    public static func reasonText(status: Int) -> String { (200..<300).contains(status) ? "" : "HTTP\(status)" }
}
