// The statuses and reasons APNs answers with, as Apple documents them in
// "Handling notification responses from APNs". The stand-in only ever answers with these.

/// One APNs error reason and the HTTP status it comes with.
public enum MockReason: String, Sendable, CaseIterable {
    // 400
    case badCollapseId = "BadCollapseId"
    case badDeviceToken = "BadDeviceToken"
    case badExpirationDate = "BadExpirationDate"
    case badMessageId = "BadMessageId"
    case badPriority = "BadPriority"
    case badTopic = "BadTopic"
    case deviceTokenNotForTopic = "DeviceTokenNotForTopic"
    case duplicateHeaders = "DuplicateHeaders"
    case idleTimeout = "IdleTimeout"
    case invalidPushType = "InvalidPushType"
    case missingDeviceToken = "MissingDeviceToken"
    case missingTopic = "MissingTopic"
    case payloadEmpty = "PayloadEmpty"
    case topicDisallowed = "TopicDisallowed"
    // 403
    case badCertificate = "BadCertificate"
    case badCertificateEnvironment = "BadCertificateEnvironment"
    case expiredProviderToken = "ExpiredProviderToken"
    case forbidden = "Forbidden"
    case invalidProviderToken = "InvalidProviderToken"
    case missingProviderToken = "MissingProviderToken"
    // 404
    case badPath = "BadPath"
    // 405
    case methodNotAllowed = "MethodNotAllowed"
    // 410
    case unregistered = "Unregistered"
    // 413
    case payloadTooLarge = "PayloadTooLarge"
    // 429
    case tooManyProviderTokenUpdates = "TooManyProviderTokenUpdates"
    case tooManyRequests = "TooManyRequests"
    // 500
    case internalServerError = "InternalServerError"
    // 503
    case serviceUnavailable = "ServiceUnavailable"
    case shutdown = "Shutdown"

    /// The HTTP status APNs sends with this reason.
    public var status: Int {
        switch self {
        case .badCollapseId, .badDeviceToken, .badExpirationDate, .badMessageId, .badPriority, .badTopic,
            .deviceTokenNotForTopic, .duplicateHeaders, .idleTimeout, .invalidPushType,
            .missingDeviceToken, .missingTopic, .payloadEmpty, .topicDisallowed:
            return 400
        case .badCertificate, .badCertificateEnvironment, .expiredProviderToken, .forbidden,
            .invalidProviderToken, .missingProviderToken:
            return 403
        case .badPath: return 404
        case .methodNotAllowed: return 405
        case .unregistered: return 410
        case .payloadTooLarge: return 413
        case .tooManyProviderTokenUpdates, .tooManyRequests: return 429
        case .internalServerError: return 500
        case .serviceUnavailable, .shutdown: return 503
        }
    }
}

/// What the stand-in answers to one request.
public struct MockVerdict: Sendable, Equatable {
    public var status: Int
    public var reason: MockReason?
    /// Milliseconds since the epoch; only for 410.
    public var timestamp: Int64?

    public static let ok = MockVerdict(status: 200, reason: nil, timestamp: nil)

    public init(status: Int, reason: MockReason?, timestamp: Int64? = nil) {
        self.status = status
        self.reason = reason
        self.timestamp = timestamp
    }

    public init(_ reason: MockReason, timestamp: Int64? = nil) {
        self.init(status: reason.status, reason: reason, timestamp: timestamp)
    }
}

extension MockReason {
    /// Answers that reject the request's provider token; APNs lowers a token-auth connection's
    /// SETTINGS_MAX_CONCURRENT_STREAMS back to its initial value after one.
    public var rejectsProviderToken: Bool {
        switch self {
        case .invalidProviderToken, .expiredProviderToken, .missingProviderToken, .tooManyProviderTokenUpdates: true
        default: false
        }
    }
}
