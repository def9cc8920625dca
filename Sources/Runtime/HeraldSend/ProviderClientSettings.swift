import HeraldCore
import HeraldPushProviders
import Logging

/// What herald-send configures alike for every credential's client of one provider (APNs, FCM): where the
/// clients connect and whom they trust, their connections and in-flight bound, the priority lane's share and the
/// request deadline.
package struct ProviderClientSettings: Sendable {
    /// Host override (`host:port`); nil: the provider's own host.
    package var endpoint: ServiceEndpoint?
    /// PEM file of CAs to trust instead of the system store.
    package var caFile: String?
    package var connections: Int
    package var maxInFlight: Int
    /// The share of streams and of the in-flight bound kept for the priority lane (0 to 0.9).
    package var priorityReserve: Double
    /// Connections kept for the priority lane only, beside `connections`.
    package var priorityConnections: Int
    /// A request's deadline; also how long a retired client may finish its requests.
    package var timeout: Duration

    package init(
        endpoint: ServiceEndpoint? = nil, caFile: String? = nil, connections: Int, maxInFlight: Int,
        priorityReserve: Double = 0, priorityConnections: Int = 0, timeout: Duration
    ) {
        self.endpoint = endpoint
        self.caFile = caFile
        self.connections = connections
        self.maxInFlight = maxInFlight
        self.priorityReserve = priorityReserve
        self.priorityConnections = priorityConnections
        self.timeout = timeout
    }

    /// One in-process retry (it also renews an expired JWT or access token); further retries go through
    /// herald.retry.
    static let retry = BackoffPolicy(initialDelay: .milliseconds(100), maxDelay: .seconds(1), maxAttempts: 2)

    /// `pool` with send's connect timeout and the priority lane's reserved streams and connections (the priority
    /// lane's calls and direct messages get them on every provider: docs/pipeline.md, "Priority lanes").
    func apply(to pool: inout ConnectionPoolSettings) {
        pool.connectTimeout = .seconds(5)
        pool.priorityReserve = priorityReserve
        pool.priorityConnections = priorityConnections
    }
}

/// Makes one credential's client and logs it ready: `provider` is "APNs" or "FCM", `names` the credential's
/// names (never a secret).
func readyClient<Client>(
    _ provider: String, _ names: Logger.Metadata, logger: Logger, _ make: () throws -> Client
) rethrows -> Client {
    let client = try make()
    logger.info("\(provider) client ready", metadata: names)
    return client
}

/// Logs a credential whose client cannot be made: its notifications are dead-lettered (`no_credential`).
func logUnusable(_ provider: String, _ names: Logger.Metadata, _ error: any Error, logger: Logger) {
    var metadata = names
    metadata["error"] = "\(error)"
    logger.error("\(provider) credential unusable; its notifications go to the DLQ", metadata: metadata)
}
