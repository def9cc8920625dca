import Foundation

/// What the HTTP/2 server at the other end of a client speaks. The connection pool, deadlines,
/// GOAWAY handling, flow control and backpressure are the same for all; the request path and
/// headers, the bearer token and the answer table differ.
enum H2Dialect: Sendable {
    /// APNs: `/3/device/<token>`, `apns-*` headers, provider JWT, APNs reasons.
    case apns
    /// FCM HTTP v1: `/v1/projects/<project>/messages:send`, JSON body, OAuth2 access token, FCM error codes.
    case fcm(projectID: String)
    /// Web Push (RFC 8030) to one push service origin: the endpoint's path, an `aes128gcm` body, `TTL`, `Urgency`
    /// and `Topic`, a VAPID `authorization` (RFC 8292), Web Push answers (`WebPushAnswerTable`).
    case webpush

    var metricPrefix: String {
        switch self {
        case .apns: "herald_apns"
        case .fcm: "herald_fcm"
        case .webpush: "herald_webpush"
        }
    }
}

/// Where a client's `authorization` header comes from.
protocol BearerSource: AnyObject, Sendable {
    /// The token to send now, or nil while none is available yet (requests then wait).
    func currentBearer() throws(PushError) -> (token: String, issuedAt: Date)?
    /// The server rejected the token issued at `issuedAt` as expired or invalid. Returns true when a
    /// different token is, or is about to be, current.
    func rejected(issuedAt: Date) throws(PushError) -> Bool
    /// Tokens made or fetched so far.
    var renewalCount: Int { get }
    /// The scheme written before the token, with its space.
    var scheme: String { get }
}

extension APNsTokenProvider: BearerSource {
    func currentBearer() throws(PushError) -> (token: String, issuedAt: Date)? { try bearer() }
    func rejected(issuedAt: Date) throws(PushError) -> Bool { try rejectedAsExpired(issuedAt: issuedAt) }
    var scheme: String { "bearer " }
}
