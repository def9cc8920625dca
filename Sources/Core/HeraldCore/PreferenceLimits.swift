/// The bounds of one user's stored preferences: how many conversations they may hold settings for, and how large
/// their JSON may be. Resolve reads the preferences for every event, and the patch script decodes them inside
/// Redis on every patch, so both stay small. The API and heraldctl check a change against them before it is
/// published; herald-registry checks `set_preferences` before it writes and the patch script checks
/// `patch_preferences` inside Redis (`HERALD_PREFERENCES_MAX_CONVERSATIONS`, `HERALD_PREFERENCES_MAX_BYTES`).
public struct PreferenceLimits: Sendable, Hashable {
    public var maxConversations: Int
    public var maxBytes: Int

    public static let defaultMaxConversations = 2000
    public static let defaultMaxBytes = 131_072

    public init(maxConversations: Int = defaultMaxConversations, maxBytes: Int = defaultMaxBytes) {
        self.maxConversations = maxConversations
        self.maxBytes = maxBytes
    }

    /// Why `preferences` may not be stored, or nil.
    public func problem(_ preferences: Preferences) -> PreferenceLimitError? {
        if preferences.conversations.count > maxConversations {
            return PreferenceLimitError(
                field: "conversations",
                message:
                    "the stored preferences would hold \(preferences.conversations.count) conversations; at most \(maxConversations) are kept per user (remove some first)"
            )
        }
        let bytes = preferences.jsonBytes().count
        if bytes > maxBytes {
            return PreferenceLimitError(
                field: "(body)",
                message: "the stored preferences would be \(bytes) bytes; at most \(maxBytes) are kept per user")
        }
        return nil
    }
}

/// A change refused because the user's stored preferences would go beyond `PreferenceLimits`. Dead-lettered
/// `over_limit` by herald-registry; 400 in the API.
public struct PreferenceLimitError: Error, Sendable, Hashable, CustomStringConvertible {
    public var field: String
    public var message: String

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }

    public var description: String { "\(field): \(message)" }

    /// The dead-letter reason.
    public static let reason = "over_limit"
}
