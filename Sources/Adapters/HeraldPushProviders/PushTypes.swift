import Foundation
import HeraldCore

/// One notification to one device.
public struct PushDelivery: Sendable {
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
        var traced = false
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
    /// Its notification is traced: the client keeps FCM's message name from the 200 (`PushResponse.messageName`),
    /// which it does not read for the others.
    public var traced: Bool {
        get { values.value.traced }
        set { values.modify { $0.traced = newValue } }
        _modify { yield &values.value.traced }
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

extension PushDelivery {
    /// The transport request for a rendered notification (HeraldCore's `PushRequest`, as the
    /// render stage writes it to Kafka).
    public init(
        _ rendered: PushRequest, deadline: ContinuousClock.Instant? = nil, timeout: Duration = .seconds(30),
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
public struct PushResponse: Sendable {
    public var tag: UInt64
    /// HTTP status of the last answer; nil when the last attempt failed below HTTP.
    public var status: Int?
    public var reason: APNsReason?
    /// `apns-id` answered by the server (or the one sent).
    public var apnsID: String?
    /// 410's `timestamp` (ms since the epoch).
    public var unregisteredAt: Int64?
    /// Set when the last attempt got no HTTP answer.
    public var transportFailure: PushTransportFailure?
    /// What to do next, from HeraldCore's answer table and the retry budget.
    public var disposition: PushDisposition
    /// Attempts made, counting the first; transparent resends (REFUSED_STREAM, streams above a
    /// GOAWAY's last-stream-id, requests never written) do not count.
    public var attempts: Int
    /// The answer's reason as text (APNs `reason`; FCM `errorCode`, else its status name).
    public var reasonText: String? = nil
    /// The class of the last answer per the provider's table (FCM clients set it).
    public var answer: PushAnswerClass? = nil
    /// FCM's `Retry-After`, when the last answer carried one.
    public var retryAfter: Duration? = nil
    /// The message name of FCM's 200 (`projects/<project>/messages/<id>`), for a traced request only.
    public var messageName: String? = nil
    /// The client's own retries of a traced request before its last answer, in order; empty for the others.
    public var retries: [ProviderRetry] = []

    public var isDelivered: Bool { disposition == .delivered }
}

/// Error type of the push provider clients (APNs, FCM, Web Push, webhooks): a stable code and what went wrong.
public struct PushError: Error, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case credential, tls, configuration, io
    }
    public let code: Code
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "push provider \(code.rawValue) error: \(message)" }
}

/// Counters of one client, for metrics and tests.
public struct PushClientStats: Sendable, Equatable {
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
