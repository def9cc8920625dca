/// Every `reason` string APNs documents in its error answers, plus `unknown(String)` so a
/// reason Apple adds later is kept as text instead of being lost or crashing anything.
public enum APNsReason: Hashable, Sendable, CustomStringConvertible {
    // 400
    case badCollapseId
    case badDeviceToken
    case badExpirationDate
    case badMessageId
    case badPriority
    case badTopic
    case deviceTokenNotForTopic
    case duplicateHeaders
    case idleTimeout
    case invalidPushType
    case missingDeviceToken
    case missingTopic
    case payloadEmpty
    case topicDisallowed
    // 403
    case badCertificate
    case badCertificateEnvironment
    case expiredProviderToken
    case forbidden
    case invalidProviderToken
    case missingProviderToken
    case unrelatedKeyIdInToken
    case badEnvironmentKeyIdInToken
    // 404
    case badPath
    // 405
    case methodNotAllowed
    // 410
    case expiredToken
    case unregistered
    // 413
    case payloadTooLarge
    // 429
    case tooManyProviderTokenUpdates
    case tooManyRequests
    // 500
    case internalServerError
    // 503
    case serviceUnavailable
    case shutdown
    /// A reason this table does not know, kept verbatim.
    case unknown(String)

    /// The wire spelling of every known reason, in one place.
    static let known: [(String, APNsReason)] = [
        ("BadCollapseId", .badCollapseId), ("BadDeviceToken", .badDeviceToken),
        ("BadExpirationDate", .badExpirationDate), ("BadMessageId", .badMessageId),
        ("BadPriority", .badPriority), ("BadTopic", .badTopic),
        ("DeviceTokenNotForTopic", .deviceTokenNotForTopic), ("DuplicateHeaders", .duplicateHeaders),
        ("IdleTimeout", .idleTimeout), ("InvalidPushType", .invalidPushType),
        ("MissingDeviceToken", .missingDeviceToken), ("MissingTopic", .missingTopic),
        ("PayloadEmpty", .payloadEmpty), ("TopicDisallowed", .topicDisallowed),
        ("BadCertificate", .badCertificate), ("BadCertificateEnvironment", .badCertificateEnvironment),
        ("ExpiredProviderToken", .expiredProviderToken), ("Forbidden", .forbidden),
        ("InvalidProviderToken", .invalidProviderToken), ("MissingProviderToken", .missingProviderToken),
        ("UnrelatedKeyIdInToken", .unrelatedKeyIdInToken),
        ("BadEnvironmentKeyIdInToken", .badEnvironmentKeyIdInToken),
        ("BadPath", .badPath), ("MethodNotAllowed", .methodNotAllowed),
        ("ExpiredToken", .expiredToken), ("Unregistered", .unregistered),
        ("PayloadTooLarge", .payloadTooLarge),
        ("TooManyProviderTokenUpdates", .tooManyProviderTokenUpdates), ("TooManyRequests", .tooManyRequests),
        ("InternalServerError", .internalServerError),
        ("ServiceUnavailable", .serviceUnavailable), ("Shutdown", .shutdown),
    ]
    private static let byWire: [String: APNsReason] = Dictionary(uniqueKeysWithValues: known)

    /// Parses the `reason` field of an APNs error body.
    public init(wire: String) {
        self = APNsReason.byWire[wire] ?? .unknown(wire)
    }

    /// The spelling APNs uses on the wire.
    public var wire: String {
        if case .unknown(let text) = self { return text }
        for (text, reason) in APNsReason.known where reason == self { return text }
        return "\(self)"
    }

    public var description: String { wire }
}
