import Foundation
import HeraldCore

extension APNsEnvironment {
    /// Apple's gateway for this environment.
    public var host: String {
        switch self {
        case .production: "api.push.apple.com"
        case .sandbox: "api.sandbox.push.apple.com"
        }
    }
}

/// Where to connect: the environment's host on 443, or an override (`host:port`) for tests.
public struct APNsEndpoint: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int = 443) {
        self.host = host
        self.port = port
    }

    public init(_ environment: APNsEnvironment) {
        self.init(host: environment.host, port: 443)
    }

    /// Parses `host:port`, `[v6]:port` or a bare host (port 443).
    public init?(parsing text: String) {
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            let host = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            if rest.isEmpty { self.init(host: host); return }
            guard rest.hasPrefix(":"), let port = Int(rest.dropFirst()), (1...65535).contains(port) else { return nil }
            self.init(host: host, port: port)
            return
        }
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        switch parts.count {
        case 1 where !text.isEmpty: self.init(host: text)
        case 2:
            guard !parts[0].isEmpty, let port = Int(parts[1]), (1...65535).contains(port) else { return nil }
            self.init(host: String(parts[0]), port: port)
        default: return nil
        }
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// `apns-priority`: 10 sends at once, 5 considers the device's power, 1 is lowest.
public enum APNsPriority: Int, Sendable, CaseIterable {
    case immediately = 10
    case considerPower = 5
    case low = 1
}

/// How the client proves who it is to APNs.
public enum APNsClientCredential: Sendable {
    /// Token auth: a .p8 key (PKCS#8 PEM text) with its key id and team id.
    case token(keyID: String, teamID: String, p8PEM: String)
    /// Certificate auth: PEM certificate (chain) file and PEM private key file.
    case certificateFiles(certificatePath: String, privateKeyPath: String)
    /// Certificate auth: a PKCS#12 (.p12) file and its password.
    case pkcs12File(path: String, password: String)

    /// Loads a token credential from a .p8 file.
    public static func token(keyID: String, teamID: String, p8Path: String) throws(APNsError) -> APNsClientCredential {
        do {
            return .token(keyID: keyID, teamID: teamID, p8PEM: try String(contentsOfFile: p8Path, encoding: .utf8))
        } catch {
            throw APNsError(.credential, "cannot read .p8 key \(p8Path): \(error.localizedDescription)")
        }
    }

    var isToken: Bool { if case .token = self { true } else { false } }

    /// The client credential for a pipeline file's credential entry: loads the .p8 key, or
    /// resolves the .p12 password from `p12_password_env` (in `environment`) or the inline one.
    public init(
        _ entry: APNsCredential, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(APNsError) {
        switch entry.auth {
        case .token(let teamID, let keyID, let keyFile)?:
            self = try .token(keyID: keyID, teamID: teamID, p8Path: keyFile)
        case .certificate(let certificateFile, let privateKeyFile)?:
            // A PEM file may hold the certificate and its key together.
            self = .certificateFiles(
                certificatePath: certificateFile, privateKeyPath: privateKeyFile ?? certificateFile)
        case .p12(let file, let passwordEnv, let password)?:
            if let passwordEnv {
                guard let value = environment[passwordEnv] else {
                    throw APNsError(
                        .credential,
                        "environment variable \(passwordEnv) (the .p12 password of \(entry.bundleID)) is not set")
                }
                self = .pkcs12File(path: file, password: value)
            } else {
                self = .pkcs12File(path: file, password: password ?? "")
            }
        case nil:
            throw APNsError(.credential, "credential of \(entry.bundleID) has neither token nor certificate settings")
        }
    }
}

/// One notification to one device.
public struct APNsDelivery: Sendable {
    /// The delivery's values, behind one reference (`CopyOnWrite`): a delivery is copied between the send loop, the
    /// client's queues and its connections, and a copy is then one retain.
    struct Values: Sendable, Hashable {
        var deviceToken: String
        var topic: String
        var pushType: APNsPushType
        var priority: APNsPriority?
        var expiration: Int64?
        var collapseID: String?
        var apnsID: String?
        var payload: [UInt8]
        var deadline: ContinuousClock.Instant
        var tag: UInt64
        var prioritized = false
    }

    private var values: CopyOnWrite<Values>

    /// Hex device token (the path is `/3/device/<token>`).
    public var deviceToken: String {
        get { values.value.deviceToken }
        set { values.modify { $0.deviceToken = newValue } }
        _modify { yield &values.value.deviceToken }
    }
    /// `apns-topic`: the bundle id (with `.voip` etc. suffix where the push type needs it).
    public var topic: String {
        get { values.value.topic }
        set { values.modify { $0.topic = newValue } }
        _modify { yield &values.value.topic }
    }
    public var pushType: APNsPushType {
        get { values.value.pushType }
        set { values.modify { $0.pushType = newValue } }
        _modify { yield &values.value.pushType }
    }
    public var priority: APNsPriority? {
        get { values.value.priority }
        set { values.modify { $0.priority = newValue } }
        _modify { yield &values.value.priority }
    }
    /// `apns-expiration` in seconds since the epoch; 0 means deliver once or drop. Nil omits the header.
    public var expiration: Int64? {
        get { values.value.expiration }
        set { values.modify { $0.expiration = newValue } }
        _modify { yield &values.value.expiration }
    }
    public var collapseID: String? {
        get { values.value.collapseID }
        set { values.modify { $0.collapseID = newValue } }
        _modify { yield &values.value.collapseID }
    }
    /// `apns-id` (a canonical UUID); nil lets APNs pick one and answer it.
    public var apnsID: String? {
        get { values.value.apnsID }
        set { values.modify { $0.apnsID = newValue } }
        _modify { yield &values.value.apnsID }
    }
    /// The JSON payload bytes.
    public var payload: [UInt8] {
        get { values.value.payload }
        set { values.modify { $0.payload = newValue } }
        _modify { yield &values.value.payload }
    }
    /// The latest time an answer is useful; after it the request completes with `deadlineExceeded`.
    public var deadline: ContinuousClock.Instant {
        get { values.value.deadline }
        set { values.modify { $0.deadline = newValue } }
        _modify { yield &values.value.deadline }
    }
    /// Caller's own identifier, echoed in the response so batch completions can be matched.
    public var tag: UInt64 {
        get { values.value.tag }
        set { values.modify { $0.tag = newValue } }
        _modify { yield &values.value.tag }
    }
    /// Started before every queued request that is not, and may use the streams and in-flight slots
    /// `APNsClientConfiguration.priorityReserve` keeps from the others (calls, direct messages).
    public var prioritized: Bool {
        get { values.value.prioritized }
        set { values.modify { $0.prioritized = newValue } }
        _modify { yield &values.value.prioritized }
    }

    public init(
        deviceToken: String, topic: String, pushType: APNsPushType = .alert,
        priority: APNsPriority? = nil, expiration: Int64? = nil, collapseID: String? = nil,
        apnsID: String? = nil, payload: [UInt8], deadline: ContinuousClock.Instant? = nil,
        timeout: Duration = .seconds(30), tag: UInt64 = 0
    ) {
        values = CopyOnWrite(
            Values(
                deviceToken: deviceToken, topic: topic, pushType: pushType, priority: priority,
                expiration: expiration, collapseID: collapseID, apnsID: apnsID, payload: payload,
                deadline: deadline ?? (ContinuousClock.now + timeout), tag: tag))
    }
}

extension APNsDelivery {
    /// The transport request for a rendered notification (HeraldCore's `APNsRequest`, as the
    /// render stage writes it to Kafka).
    public init(
        _ rendered: APNsRequest, deadline: ContinuousClock.Instant? = nil, timeout: Duration = .seconds(30),
        tag: UInt64 = 0
    ) {
        self.init(
            deviceToken: rendered.token, topic: rendered.topic,
            pushType: rendered.pushType,
            priority: APNsPriority(rawValue: rendered.priority), expiration: rendered.expiration,
            collapseID: rendered.collapseID, apnsID: rendered.apnsID.isEmpty ? nil : rendered.apnsID,
            payload: rendered.payload, deadline: deadline, timeout: timeout, tag: tag)
    }
}

/// The final outcome of one request (after the client's own retries, if enabled).
public struct APNsResponse: Sendable {
    public var tag: UInt64
    /// HTTP status of the last answer; nil when the last attempt failed below HTTP.
    public var status: Int?
    public var reason: APNsReason?
    /// `apns-id` answered by the server (or the one sent).
    public var apnsID: String?
    /// 410's `timestamp` (ms since the epoch).
    public var unregisteredAt: Int64?
    /// Set when the last attempt got no HTTP answer.
    public var transportFailure: APNsTransportFailure?
    /// What to do next, from HeraldCore's answer table and the retry budget.
    public var disposition: APNsDisposition
    /// Attempts made, counting the first; transparent resends (REFUSED_STREAM, streams above a
    /// GOAWAY's last-stream-id, requests never written) do not count.
    public var attempts: Int
    /// The answer's reason as text (APNs `reason`; FCM `errorCode`, else its status name).
    public var reasonText: String? = nil
    /// The class of the last answer per the provider's table (FCM clients set it).
    public var answer: APNsAnswerClass? = nil
    /// FCM's `Retry-After`, when the last answer carried one.
    public var retryAfter: Duration? = nil

    public var isDelivered: Bool { disposition == .delivered }
}

/// Error type of this module: a stable code and what went wrong.
public struct APNsError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case credential, tls, configuration, io
    }
    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "APNs \(code.rawValue) error: \(message)" }
}

/// What an HTTP/2 provider client's connection pool is made of (APNs and FCM alike): where it connects, how many
/// connections and streams, deadlines, keepalive, retries, metric dimensions and the priority lane's share.
/// Defaults in brackets are the APNs client's; `FCMClientConfiguration` sets its own where they differ.
public struct ConnectionPoolSettings: Sendable {
    /// Host override (`host:port`) for tests; default: the provider's host on 443.
    public var endpoint: APNsEndpoint?
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
    public var reconnectBackoff: APNsBackoffPolicy
    /// Retries of retryable answers inside the client; `maxAttempts: 1` hands every answer back at once.
    public var retry: APNsBackoffPolicy
    /// Extra dimensions on every metric, e.g. `[("credential", "app1-prod")]`.
    public var metricDimensions: [(String, String)]
    /// The share (0 to 0.9) of each connection's streams and of `maxInFlight` that only prioritized requests
    /// may use, so a bulk fan-out cannot take every stream [0].
    public var priorityReserve: Double = 0
    /// Connections kept beside `connections` for prioritized requests only [0]. A prioritized request goes to one
    /// of them first and to the shared ones when they are full or not up; bulk requests never use them.
    public var priorityConnections: Int = 0

    public init(
        endpoint: APNsEndpoint? = nil, trustedCAFile: String? = nil, connections: Int = 2,
        maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 10_000,
        connectTimeout: Duration = .seconds(10), pingInterval: Duration = .seconds(60),
        pingTimeout: Duration = .seconds(10),
        reconnectBackoff: APNsBackoffPolicy = APNsBackoffPolicy(
            initialDelay: .milliseconds(100), maxDelay: .seconds(30)),
        retry: APNsBackoffPolicy = APNsBackoffPolicy(), metricDimensions: [(String, String)] = []
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

/// Tunables of one client (one credential + environment): the credential, the JWT renewal and the connection pool
/// (`pool`, whose settings read and write as the configuration's own: `configuration.maxInFlight`).
@dynamicMemberLookup
public struct APNsClientConfiguration: Sendable {
    public var credential: APNsClientCredential
    public var environment: APNsEnvironment
    public var pool: ConnectionPoolSettings
    public var tokenRenewal: APNsTokenRenewalPolicy
    /// Wall clock for JWT `iat` and renewal (inject to test renewal).
    public var now: @Sendable () -> Date

    public init(
        credential: APNsClientCredential, environment: APNsEnvironment = .production,
        endpoint: APNsEndpoint? = nil, trustedCAFile: String? = nil, connections: Int = 2,
        maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 10_000,
        connectTimeout: Duration = .seconds(10), pingInterval: Duration = .seconds(60),
        pingTimeout: Duration = .seconds(10),
        reconnectBackoff: APNsBackoffPolicy = APNsBackoffPolicy(
            initialDelay: .milliseconds(100), maxDelay: .seconds(30)),
        retry: APNsBackoffPolicy = APNsBackoffPolicy(),
        tokenRenewal: APNsTokenRenewalPolicy = APNsTokenRenewalPolicy(),
        now: @escaping @Sendable () -> Date = { Date() }, metricDimensions: [(String, String)] = []
    ) {
        self.init(
            credential: credential, environment: environment,
            pool: ConnectionPoolSettings(
                endpoint: endpoint, trustedCAFile: trustedCAFile, connections: connections,
                maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight,
                connectTimeout: connectTimeout, pingInterval: pingInterval, pingTimeout: pingTimeout,
                reconnectBackoff: reconnectBackoff, retry: retry, metricDimensions: metricDimensions),
            tokenRenewal: tokenRenewal, now: now)
    }

    public init(
        credential: APNsClientCredential, environment: APNsEnvironment = .production, pool: ConnectionPoolSettings,
        tokenRenewal: APNsTokenRenewalPolicy = APNsTokenRenewalPolicy(),
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.credential = credential
        self.environment = environment
        self.pool = pool
        self.tokenRenewal = tokenRenewal
        self.now = now
    }

    public subscript<T>(dynamicMember keyPath: WritableKeyPath<ConnectionPoolSettings, T>) -> T {
        get { pool[keyPath: keyPath] }
        set { pool[keyPath: keyPath] = newValue }
    }

    var resolvedEndpoint: APNsEndpoint { pool.endpoint ?? APNsEndpoint(environment) }
}

/// Counters of one client, for metrics and tests.
public struct APNsClientStats: Sendable, Equatable {
    public var submitted = 0
    public var completed = 0
    /// HTTP requests written (first sends plus resends).
    public var streamsOpened = 0
    /// Requests written on the connections kept for prioritized requests (`priorityConnections`).
    public var streamsOnPriorityConnections = 0
    public var answersByStatus: [Int: Int] = [:]
    public var transportFailures = 0
    /// Retries scheduled by the retry policy.
    public var retries = 0
    /// Transparent resends: REFUSED_STREAM, above a GOAWAY's last-stream-id, never written.
    public var resends = 0
    public var deadlinesExceeded = 0
    public var connectionsOpened = 0
    public var connectFailures = 0
    public var goawaysReceived = 0
    public var pingsSent = 0
    public var connectionsReplacedAfterPing = 0
    public var jwtRenewals = 0
    /// Highest SETTINGS_MAX_CONCURRENT_STREAMS seen and the current sum over ready connections.
    public var maxConcurrentStreamsSeen = 0
    public init() {}
}
