import Foundation
import HeraldCore
import HeraldHTTP
import Logging

/// Tunables of one FCM client (one service account, i.e. one Firebase project): the account, the access token's
/// renewal and the connection pool (`pool`, whose settings read and write as the configuration's own). Defaults in
/// brackets.
@dynamicMemberLookup
public struct FCMClientConfiguration: Sendable {
    public var account: FCMServiceAccount
    /// The connection pool: `endpoint` overrides `fcm.googleapis.com:443` (tests), `trustedCAFile` also serves
    /// the token endpoint; [2] connections, [100] streams per connection, [2000] in flight.
    public var pool: ConnectionPoolSettings
    /// Renew the access token this long before it expires [5 min].
    public var renewBefore: Duration

    public init(
        account: FCMServiceAccount, endpoint: ServiceEndpoint? = nil, trustedCAFile: String? = nil,
        connections: Int = 2, maxStreamsPerConnection: Int = 100, maxInFlight: Int = 2000,
        connectTimeout: Duration = .seconds(10), pingInterval: Duration = .seconds(60),
        pingTimeout: Duration = .seconds(10), retry: BackoffPolicy = BackoffPolicy(),
        renewBefore: Duration = .seconds(300), metricDimensions: [(String, String)] = []
    ) {
        self.account = account
        self.pool = ConnectionPoolSettings(
            endpoint: endpoint, trustedCAFile: trustedCAFile, connections: connections,
            maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight,
            connectTimeout: connectTimeout, pingInterval: pingInterval, pingTimeout: pingTimeout, retry: retry,
            metricDimensions: metricDimensions)
        self.renewBefore = renewBefore
    }

    public subscript<T>(dynamicMember keyPath: WritableKeyPath<ConnectionPoolSettings, T>) -> T {
        get { pool[keyPath: keyPath] }
        set { pool[keyPath: keyPath] = newValue }
    }
}

/// An FCM HTTP v1 client: `POST /v1/projects/{project}/messages:send` over the same nghttp2
/// connection pool as `APNsClient` (persistent HTTP/2 over TLS, many streams, deadlines, GOAWAY,
/// REFUSED_STREAM resends, PING keepalive, bounded in-flight), with an OAuth2 access token from the
/// service account's token endpoint (`FCMAccessTokens`, HTTP/1.1 through libcurl) in `authorization`.
///
/// Answers are classified by HeraldCore's `FCMAnswerTable`; the response carries the class
/// (`answer`), FCM's error code (`reasonText`) and `Retry-After`.
public final class FCMClient: Sendable {
    public let configuration: FCMClientConfiguration
    public let tokens: FCMAccessTokens
    private let loop: ClientLoop
    private let http: HTTP1Client
    private let path: [UInt8]

    /// The process must ignore SIGPIPE, as for `APNsClient` (executables do it at start-up, docs/architecture.md).
    public init(configuration: FCMClientConfiguration, logger: Logger = Logger(label: "herald.fcm")) throws(PushError) {
        self.configuration = configuration
        do {
            http = try HTTP1Client(
                configuration: HTTP1ClientConfiguration(
                    trustedCAFile: configuration.trustedCAFile,
                    maxInFlight: 4, maxConnectionsPerHost: 1,
                    connectTimeout: .seconds(5)))
        } catch {
            throw PushError(.io, error.message)
        }
        tokens = try FCMAccessTokens(
            account: configuration.account, http: http, renewBefore: configuration.renewBefore,
            logger: logger)
        loop = try ClientLoop(
            config: configuration.pool,
            endpoint: configuration.endpoint ?? ServiceEndpoint(host: "fcm.googleapis.com"),
            tls: TLSContext(trustedCAFile: configuration.trustedCAFile), logger: logger,
            dialect: .fcm(projectID: configuration.account.projectID), bearer: tokens)
        path = Array("/v1/projects/\(configuration.account.projectID)/messages:send".utf8)
        tokens.start()
        loop.start()
    }

    deinit {
        tokens.stop()
        loop.requestStop()
    }

    /// The request for a rendered FCM notification (its payload is the whole `{"message":...}` body).
    public static func delivery(
        _ rendered: PushRequest, timeout: Duration = .seconds(30), tag: UInt64 = 0
    ) -> PushDelivery {
        PushDelivery(
            deviceToken: rendered.token, topic: rendered.topic, apnsID: rendered.apnsID, payload: rendered.payload,
            timeout: timeout, tag: tag)
    }

    /// Sends one message and waits for its final outcome.
    public func send(_ request: PushDelivery) async -> PushResponse { await loop.send(request, path: path) }

    /// Accepts a batch; `onComplete` runs once per request on the client's I/O thread.
    public func submit(_ requests: [PushDelivery], onComplete: @escaping @Sendable (PushResponse) -> Void) async {
        await loop.submit(requests, path: path, onComplete: onComplete)
    }

    public var stats: PushClientStats { loop.stats }

    public func shutdown(grace: Duration = .seconds(5)) async {
        tokens.stop()
        await loop.stop(drainFor: grace)
        await http.shutdown()
    }
}

extension FCMClient: BatchPushClient {}
