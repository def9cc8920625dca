import Foundation
import HeraldCore

/// What an HTTP/2 provider client's connection pool is made of (APNs and FCM alike): where it connects, how many
/// connections and streams, deadlines, keepalive, retries, metric dimensions and the priority lane's share.
/// Defaults in brackets are the APNs client's; `FCMClientConfiguration` sets its own where they differ.
public struct ConnectionPoolSettings: Sendable {
    /// Host override (`host:port`) for tests; default: the provider's host on 443.
    public var endpoint: ServiceEndpoint?
    /// PEM file of CAs to trust instead of the system store (tests: the local self-signed cert).
    public var trustedCAFile: String?
    /// Persistent connections kept open [2].
    public var connections: Int
    /// Our own cap on streams per connection, below the server's SETTINGS [1000].
    public var maxStreamsPerConnection: Int
    /// Requests accepted but not yet completed, across the client; `submit` waits beyond it [10000].
    public var maxInFlight: Int
    public var connectTimeout: Duration
    /// A connection with no frame received for this long is sent a PING [60 s].
    public var pingInterval: Duration
    /// A PING not answered within this closes and replaces the connection [10 s].
    public var pingTimeout: Duration
    /// Delays between failed connection attempts (`maxAttempts` is ignored).
    public var reconnectBackoff: BackoffPolicy
    /// Retries of retryable answers inside the client; `maxAttempts: 1` hands every answer back at once.
    public var retry: BackoffPolicy
    /// Extra dimensions on every metric, e.g. `[("credential", "app1-prod")]`.
    public var metricDimensions: [(String, String)]
    /// The share (0 to 0.9) of each connection's streams and of `maxInFlight` that only prioritized requests
    /// may use, so a bulk fan-out cannot take every stream [0].
    public var priorityReserve: Double = 0
    /// Connections kept beside `connections` for prioritized requests only [0]. A prioritized request goes to one
    /// of them first and to the shared ones when they are full or not up; bulk requests never use them.
    public var priorityConnections: Int = 0

    public init(
        endpoint: ServiceEndpoint? = nil, trustedCAFile: String? = nil, connections: Int = 2,
        maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 10_000,
        connectTimeout: Duration = .seconds(10), pingInterval: Duration = .seconds(60),
        pingTimeout: Duration = .seconds(10),
        reconnectBackoff: BackoffPolicy = BackoffPolicy(
            initialDelay: .milliseconds(100), maxDelay: .seconds(30)),
        retry: BackoffPolicy = BackoffPolicy(), metricDimensions: [(String, String)] = []
    ) {
        self.endpoint = endpoint
        self.trustedCAFile = trustedCAFile
        self.connections = max(1, connections)
        self.maxStreamsPerConnection = max(1, maxStreamsPerConnection)
        self.maxInFlight = max(1, maxInFlight)
        self.connectTimeout = connectTimeout
        self.pingInterval = pingInterval
        self.pingTimeout = pingTimeout
        self.reconnectBackoff = reconnectBackoff
        self.retry = retry
        self.metricDimensions = metricDimensions
    }
}
