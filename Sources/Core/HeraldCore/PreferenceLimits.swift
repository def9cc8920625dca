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
            return .conversations(preferences.conversations.count, limit: maxConversations)
        }
        let bytes = preferences.jsonBytes().count
        if bytes > maxBytes {
            return .bytes(bytes, limit: maxBytes)
        }
        return nil
    }
}

/// A change refused because the user's stored preferences would go beyond `PreferenceLimits`. Dead-lettered
/// `over_limit` by herald-registry; 400 in the API.
public struct PreferenceLimitError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The field over its limit (`conversations`, or `(body)` for the stored size) and by how much.
    public var problem: FieldError

    public init(_ problem: FieldError) { self.problem = problem }

    /// More conversations than are kept per user.
    public static func conversations(_ count: some CustomStringConvertible, limit: some CustomStringConvertible) -> Self
    {
        Self(
            FieldError(
                field: "conversations",
                message:
                    "the stored preferences would hold \(count) conversations; at most \(limit) are kept per user (remove some first)"
            ))
    }

    /// More bytes of stored preferences than are kept per user.
    public static func bytes(_ count: some CustomStringConvertible, limit: some CustomStringConvertible) -> Self {
        Self(
            FieldError(
                field: "(body)",
                message: "the stored preferences would be \(count) bytes; at most \(limit) are kept per user"))
    }

    public var description: String { problem.description }

    /// The dead-letter reason.
    public static let reason = "over_limit"
}
