// Web Push delivery (RFC 8030) to one push service origin over the nghttp2 connection pool: the payload encrypted
// for the subscription (RFC 8291, `WebPushCrypto`), a VAPID token for the origin (RFC 8292, `WebPushVAPID`).
import Foundation
import HeraldCore
import Logging
import Synchronization

/// Tunables of one Web Push client: the push service's origin, the app's VAPID identity and the connection pool.
@dynamicMemberLookup
public struct WebPushClientConfiguration: Sendable {
    /// `https://host[:port]`: where the client connects, and the VAPID token's `aud`.
    public var origin: String
    public var vapid: WebPushVAPID
    /// The connection pool: `endpoint` overrides the origin's host and port (tests); [1] connection, [100] streams,
    /// [1000] in flight.
    public var pool: ConnectionPoolSettings
    /// How long each VAPID token lives [12 h]; a new one is signed when half of that has passed.
    public var tokenLifetime: TimeInterval
    /// Wall clock for the token's `exp` and the `TTL` header.
    public var now: @Sendable () -> Date

    public init(
        origin: String, vapid: WebPushVAPID, endpoint: ServiceEndpoint? = nil, trustedCAFile: String? = nil,
        connections: Int = 1, maxStreamsPerConnection: Int = 100, maxInFlight: Int = 1000,
        connectTimeout: Duration = .seconds(10), retry: BackoffPolicy = BackoffPolicy(),
        tokenLifetime: TimeInterval = WebPushVAPID.defaultLifetime, metricDimensions: [(String, String)] = [],
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.origin = origin
        self.vapid = vapid
        self.pool = ConnectionPoolSettings(
            endpoint: endpoint, trustedCAFile: trustedCAFile, connections: connections,
            maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight,
            connectTimeout: connectTimeout, retry: retry, metricDimensions: metricDimensions)
        self.tokenLifetime = min(tokenLifetime, WebPushVAPID.maxLifetime)
        self.now = now
    }

    public subscript<T>(dynamicMember keyPath: WritableKeyPath<ConnectionPoolSettings, T>) -> T {
        get { pool[keyPath: keyPath] }
        set { pool[keyPath: keyPath] = newValue }
    }
}

/// The VAPID `authorization` of one origin: `vapid t=<jwt>, k=<public key>`, signed again when half of its
/// lifetime has passed. A 401 or 403 is not answered with a new token (the key or the subject is wrong, which a
/// new signature does not fix).
final class WebPushVAPIDTokens: BearerSource, Sendable {
    private let vapid: WebPushVAPID
    private let audience: String
    private let lifetime: TimeInterval
    private let now: @Sendable () -> Date
    private let state = Mutex<(current: (token: String, issuedAt: Date)?, renewals: Int)>((nil, 0))

    init(vapid: WebPushVAPID, audience: String, lifetime: TimeInterval, now: @escaping @Sendable () -> Date) {
        self.vapid = vapid
        self.audience = audience
        self.lifetime = lifetime
        self.now = now
    }

    func currentBearer() throws(PushError) -> (token: String, issuedAt: Date)? {
        let at = now()
        if let current = state.withLock({ $0.current }), at.timeIntervalSince(current.issuedAt) < lifetime / 2,
            at >= current.issuedAt
        {
            return current
        }
        let jwt: String
        do {
            jwt = try vapid.token(audience: audience, expiresAt: at.addingTimeInterval(lifetime))
        } catch {
            throw PushError(.credential, error.reason)
        }
        let made = (token: "t=\(jwt), k=\(vapid.publicKey)", issuedAt: at)
        state.withLock {
            $0.current = made
            $0.renewals += 1
        }
        return made
    }

    func rejected(issuedAt: Date) throws(PushError) -> Bool { false }

    var renewalCount: Int { state.withLock { $0.renewals } }

    var scheme: String { "vapid " }
}

/// A Web Push client for one push service origin (one app's VAPID key): persistent HTTP/2 over TLS with many
/// streams, deadlines, GOAWAY, PING keepalive and a bounded number of requests in flight (the APNs and FCM
/// clients' pool). Answers are classified by HeraldCore's `WebPushAnswerTable`; the response carries the class
/// (`answer`), the reason (`reasonText`) and `Retry-After`.
public final class WebPushClient: Sendable {
    public let configuration: WebPushClientConfiguration
    private let loop: ClientLoop
    private let tokens: WebPushVAPIDTokens

    /// The process must ignore SIGPIPE, as for `APNsClient`.
    public init(
        configuration: WebPushClientConfiguration, logger: Logger = Logger(label: "herald.webpush")
    )
        throws(PushError)
    {
        self.configuration = configuration
        guard let components = URLComponents(string: configuration.origin), let host = components.host,
            WebPushSubscription.origin(ofEndpoint: configuration.origin) == configuration.origin
        else {
            throw PushError(.configuration, "\(configuration.origin) is not an https origin")
        }
        tokens = WebPushVAPIDTokens(
            vapid: configuration.vapid, audience: configuration.origin, lifetime: configuration.tokenLifetime,
            now: configuration.now)
        let bare = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        loop = try ClientLoop(
            config: configuration.pool,
            endpoint: configuration.pool.endpoint ?? ServiceEndpoint(host: bare, port: components.port ?? 443),
            tls: TLSContext(trustedCAFile: configuration.pool.trustedCAFile), logger: logger, dialect: .webpush,
            bearer: tokens)
        loop.start()
    }

    deinit { loop.requestStop() }

    /// The request for a rendered Web Push notification: the payload encrypted for the subscription the token
    /// holds; the device token of the delivery is the endpoint's path at its origin. Throws when the subscription
    /// is malformed or its key is not a P-256 point.
    public static func delivery(
        _ rendered: PushRequest, timeout: Duration = .seconds(30), tag: UInt64 = 0
    ) throws(WebPushError) -> PushDelivery {
        guard let subscription = WebPushSubscription(token: rendered.token) else {
            throw WebPushError("the device token is not a Web Push subscription")
        }
        if let problem = subscription.problem { throw WebPushError(problem) }
        guard let key = WebPushSubscription.base64URLDecode(subscription.p256dh),
            let auth = WebPushSubscription.base64URLDecode(subscription.auth),
            let components = URLComponents(string: subscription.endpoint)
        else {
            throw WebPushError("the subscription does not decode")
        }
        var path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        if let query = components.percentEncodedQuery { path += "?" + query }
        let body = try WebPushCrypto.encrypt(rendered.payload, uaPublic: key, authSecret: auth)
        return PushDelivery(
            deviceToken: path, topic: subscription.origin ?? "", pushType: rendered.pushType,
            priority: APNsPriority(rawValue: rendered.priority), expiration: rendered.expiration,
            collapseID: rendered.collapseID, apnsID: nil, payload: body, timeout: timeout, tag: tag)
    }

    /// Sends one message and waits for its final outcome.
    public func send(_ request: PushDelivery) async -> PushResponse { await loop.send(request) }

    /// Accepts a batch; `onComplete` runs once per request on the client's I/O thread.
    public func submit(_ requests: [PushDelivery], onComplete: @escaping @Sendable (PushResponse) -> Void) async {
        await loop.submit(requests, path: nil, onComplete: onComplete)
    }

    public var stats: PushClientStats { loop.stats }

    /// Whether `response` failed because the push service did not agree to HTTP/2 in ALPN (it speaks HTTP/1.1 only;
    /// `WebPushHTTP1Sender` reaches it).
    public static func refusedHTTP2(_ response: PushResponse) -> Bool {
        guard case .connectFailed(let why)? = response.transportFailure else { return false }
        return why.contains("did not agree to HTTP/2") || why.lowercased().contains("no application protocol")
    }

    /// VAPID tokens signed so far.
    public var tokenRenewals: Int { tokens.renewalCount }

    public func shutdown(grace: Duration = .seconds(5)) async {
        await loop.stop(drainFor: grace)
    }
}

extension WebPushClient: BatchPushClient {}
