/// What a push provider's answer (or a transport failure) means, before any retry budget is applied. Each
/// provider's answer table (APNs, FCM, Web Push, webhooks) maps its statuses onto these classes.
public enum PushAnswerClass: Equatable, Sendable {
    /// The provider accepted the notification.
    case delivered
    /// Worth sending again later (429, 500, 503, connection loss).
    case retryable
    /// The device token is no longer valid; `unregisteredAt` is 410's timestamp (ms since epoch), if any.
    case tokenDead(unregisteredAt: Int64?)
    /// The provider rejected the credential as expired (an APNs JWT, an FCM access token): renew it and send again.
    case renewCredentials
    /// Sending the same request again cannot succeed (a bug on our side or a configuration error).
    case permanent
}

/// What the send stage should do with one notification after an answer.
public enum PushDisposition: Equatable, Sendable {
    case delivered
    /// Send again after `after` (exponential backoff with jitter; `attempt` is the attempt just made).
    case retry(after: Duration)
    /// Remove the token unless it was registered again after `unregisteredAt` (ms since epoch).
    case tokenDead(unregisteredAt: Int64?)
    /// Renew the provider credential (JWT, access token) and send again.
    case renewCredentials
    /// Dead-letter the notification with this reason.
    case permanentFailure(reason: String)
}

/// Failures below HTTP: the request got no answer from the provider.
public enum PushTransportFailure: Equatable, Sendable, CustomStringConvertible {
    /// Could not open a connection (DNS, TCP, TLS handshake, ALPN).
    case connectFailed(String)
    /// The connection closed or broke while the request was in flight; the provider may or may not have it.
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

extension BackoffPolicy {
    /// Turns a classified answer into what to do, given that `attempt` attempts were made (1 = first).
    public func disposition(
        for answer: PushAnswerClass, reasonText: String, attempt: Int,
        unit: Double
    ) -> PushDisposition {
        switch answer {
        case .delivered:
            return .delivered
        case .tokenDead(let at):
            return .tokenDead(unregisteredAt: at)
        case .renewCredentials:
            return attempt < maxAttempts
                ? .renewCredentials
                : .permanentFailure(reason: "\(reasonText) after \(attempt) attempts")
        case .permanent:
            return .permanentFailure(reason: reasonText)
        case .retryable:
            if attempt >= maxAttempts {
                return .permanentFailure(reason: "\(reasonText) after \(attempt) attempts")
            }
            return .retry(after: delay(afterAttempt: attempt, unit: unit))
        }
    }
}

/// A retry a provider client made of a traced request before its final answer: when it decided to retry (wall
/// clock, nanoseconds since the epoch), the answer retried (HTTP status, nil below HTTP) and its reason (APNs
/// `reason`, FCM's error code, a transport failure's kind, or `renew credentials: ...` when the token was renewed
/// for it). Send's request span shows each as an event.
public struct ProviderRetry: Sendable, Hashable {
    public var timeNanoseconds: UInt64
    public var status: Int?
    public var reason: String

    public init(timeNanoseconds: UInt64, status: Int?, reason: String) {
        self.timeNanoseconds = timeNanoseconds
        self.status = status
        self.reason = reason
    }
}
