import Foundation

/// One rendered request to a push provider: headers and the JSON payload; `provider` says which service it is
/// for. The header fields are APNs's; for FCM and webhook requests `topic` and
/// `providerID` name the credential, `priority` is 10 (FCM `high`) or 5 (`normal`), `collapseID` is
/// FCM's `collapse_key`, `apnsID` is the same derived trace id, and `payload` is the complete HTTP body
/// (FCM: `{"message":{...}}`; webhook: CometChat's `push-notification-payload-generated` object).
public struct PushRequest: Sendable, Hashable {
    /// Render writes `alert` (chat) or `voip` (calls).
    public typealias PushType = APNsPushType

    /// The request's values, behind one reference (`CopyOnWrite`): a request is copied into the outbound
    /// record, the send loop's jobs and the provider client's deliveries, and a copy is then one retain.
    struct Values: Sendable, Hashable {
        var token: String
        var environment: APNsEnvironment
        var pushType: PushType
        var topic: String
        var priority: Int
        var collapseID: String?
        var expiration: Int64
        var apnsID: String
        var payload: [UInt8]
        var provider: PushProvider
        var providerID: String?
        var guesses: Guesses
    }

    /// What render guessed in an APNs request (the device did not say it, nor did a credential its provider id
    /// names), and whether this is the one retry on the other environment. Send removes a token only for an answer
    /// about what the device was registered with (docs/providers.md, "Dead tokens").
    public struct Guesses: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// The environment is Herald's default, production.
        public static let environment = Guesses(rawValue: 1)
        /// The topic is the app's first credential's bundle id.
        public static let topic = Guesses(rawValue: 2)
        /// The request is the retry of a guessed environment on the other one.
        public static let otherEnvironment = Guesses(rawValue: 4)
        static let all: Guesses = [.environment, .topic, .otherEnvironment]
    }

    private var values: CopyOnWrite<Values>

    /// Full device token (never log it whole).
    public var token: String {
        get { values.value.token }
        set { values.modify { $0.token = newValue } }
        _modify { yield &values.value.token }
    }
    public var environment: APNsEnvironment {
        get { values.value.environment }
        set { values.modify { $0.environment = newValue } }
        _modify { yield &values.value.environment }
    }
    public var pushType: PushType {
        get { values.value.pushType }
        set { values.modify { $0.pushType = newValue } }
        _modify { yield &values.value.pushType }
    }
    /// `apns-topic`: the bundle id, `<bundle>.voip` for VoIP.
    public var topic: String {
        get { values.value.topic }
        set { values.modify { $0.topic = newValue } }
        _modify { yield &values.value.topic }
    }
    /// `apns-priority`: 10 to alert now, 5 for background.
    public var priority: Int {
        get { values.value.priority }
        set { values.modify { $0.priority = newValue } }
        _modify { yield &values.value.priority }
    }
    /// `apns-collapse-id` (at most 64 bytes), or nil.
    public var collapseID: String? {
        get { values.value.collapseID }
        set { values.modify { $0.collapseID = newValue } }
        _modify { yield &values.value.collapseID }
    }
    /// `apns-expiration`, epoch seconds; 0 means "try once".
    public var expiration: Int64 {
        get { values.value.expiration }
        set { values.modify { $0.expiration = newValue } }
        _modify { yield &values.value.expiration }
    }
    /// `apns-id`, derived from (event id, token): see `APNsID`.
    public var apnsID: String {
        get { values.value.apnsID }
        set { values.modify { $0.apnsID = newValue } }
        _modify { yield &values.value.apnsID }
    }
    /// The payload: UTF-8 JSON, within `pushType.payloadLimit` (FCM: `FCMMessage.payloadLimit`).
    public var payload: [UInt8] {
        get { values.value.payload }
        set { values.modify { $0.payload = newValue } }
        _modify { yield &values.value.payload }
    }
    /// Which service this request is for (`apns` when absent on the wire).
    public var provider: PushProvider {
        get { values.value.provider }
        set { values.modify { $0.provider = newValue } }
        _modify { yield &values.value.provider }
    }
    /// The FCM or webhook credential's provider id; nil for APNs.
    public var providerID: String? {
        get { values.value.providerID }
        set { values.modify { $0.providerID = newValue } }
        _modify { yield &values.value.providerID }
    }
    /// What render guessed (APNs only).
    public var guesses: Guesses {
        get { values.value.guesses }
        set { values.modify { $0.guesses = newValue } }
        _modify { yield &values.value.guesses }
    }

    public init(
        token: String, environment: APNsEnvironment, pushType: PushType, topic: String, priority: Int,
        collapseID: String?, expiration: Int64, apnsID: String, payload: [UInt8],
        provider: PushProvider = .apns, providerID: String? = nil, guesses: Guesses = []
    ) {
        values = CopyOnWrite(
            Values(
                token: token, environment: environment, pushType: pushType, topic: topic, priority: priority,
                collapseID: collapseID, expiration: expiration, apnsID: apnsID, payload: payload, provider: provider,
                providerID: providerID, guesses: guesses))
    }

    /// The payload as text.
    public var payloadString: String { String(decoding: payload, as: UTF8.self) }
}
