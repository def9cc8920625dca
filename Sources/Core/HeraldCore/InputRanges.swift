// The ranges of the numbers and sizes Herald takes from outside (`chat.events`, `herald.registry`, the registry
// API), in one place; and the saturating arithmetic the stages use on times and TTLs, so a value that passed
// anyway (an older record, a record of Herald's own topics) ends in a capped value, never a trap.

/// The allowed range of every number and size that enters Herald from outside. Ingest checks a chat event against
/// them (`ChatEvent.rangeError`), herald-registry every `herald.registry` record and the registry API every request
/// body (`RegistryRecord.rangeError`); a value outside is dead-lettered `out_of_range` naming the field, or answered
/// 400 naming it.
public enum InputRanges {
    /// The dead-letter reason of a value outside its range.
    public static let reason = "out_of_range"

    /// A point in time a chat service can mean, epoch milliseconds: 2000-01-01T00:00:00Z to
    /// 2200-01-01T00:00:00Z (`created_at`, `read_at`).
    public static let timestampMillis: ClosedRange<Int64> = 946_684_800_000...7_258_118_400_000
    /// `registered_at`: 0 (unknown) up to the latest timestamp; it only orders a user's devices.
    public static let registeredAtMillis: ClosedRange<Int64> = 0...timestampMillis.upperBound
    /// A presence TTL (`ttl_ms`): 1 ms to one day.
    public static let presenceTTLMillis: ClosedRange<Int64> = 1...86_400_000
    /// An unread or mention count (`set_unread`).
    public static let unreadCount: ClosedRange<Int> = 0...1_000_000_000
    /// Conversations one `set_unread` may list (each of `conversations` and `mention_conversations`): as many as a
    /// user may keep preferences for.
    public static let unreadConversations = PreferenceLimits.defaultMaxConversations
    /// Tokens in one presence update: as many as a user may have devices of all four kinds.
    public static let presenceTokens = 4 * Device.maxPerUser
    /// One presence token, in bytes (at least 1): the longest device token.
    public static let presenceTokenBytes = Device.maxTokenBytes
    /// A device's `bundle_id`, in bytes (Apple's bundle ids are at most 155 characters).
    public static let bundleIDBytes = 256
    /// A device's `provider_id`, in bytes.
    public static let providerIDBytes = 256

    /// The error for `value` outside `range` in `field`, or nil.
    public static func check<T: Comparable & CustomStringConvertible>(
        _ value: T, in range: ClosedRange<T>, field: String
    ) -> FieldError? {
        range.contains(value)
            ? nil
            : FieldError(
                field: field, message: "\(value) is outside \(range.lowerBound) to \(range.upperBound)",
                reason: reason)
    }

    /// The error for a string longer than `limit` bytes (or empty, when `allowsEmpty` is false), or nil.
    public static func check(_ value: String, bytes limit: Int, field: String, allowsEmpty: Bool = true) -> FieldError?
    {
        let count = value.utf8.count
        if count == 0 && !allowsEmpty { return FieldError(field: field, message: "empty", reason: reason) }
        return count <= limit
            ? nil : FieldError(field: field, message: "\(count) bytes, at most \(limit)", reason: reason)
    }
}

/// Saturating arithmetic on times and TTLs: a result beyond `Int64`'s range is `Int64.max` or `Int64.min`, never
/// a trap. Whatever reaches a stage, its expiry and deadline arithmetic cannot take the process down.
public enum Saturating {
    /// `a + b`, capped at `Int64.min` / `Int64.max`.
    public static func add(_ a: Int64, _ b: Int64) -> Int64 {
        let (sum, overflow) = a.addingReportingOverflow(b)
        guard overflow else { return sum }
        return b > 0 ? .max : .min
    }

    /// `a - b`, capped at `Int64.min` / `Int64.max`.
    public static func subtract(_ a: Int64, _ b: Int64) -> Int64 {
        let (difference, overflow) = a.subtractingReportingOverflow(b)
        guard overflow else { return difference }
        return b < 0 ? .max : .min
    }

    /// `a * b`, capped at `Int64.min` / `Int64.max`.
    public static func multiply(_ a: Int64, _ b: Int64) -> Int64 {
        let (product, overflow) = a.multipliedReportingOverflow(by: b)
        guard overflow else { return product }
        return (a < 0) == (b < 0) ? .max : .min
    }

    /// Seconds to milliseconds (an APNs expiry to compare with a clock in milliseconds), capped.
    public static func milliseconds(fromSeconds seconds: Int64) -> Int64 { multiply(seconds, 1000) }
}

extension ChatEvent {
    /// The first number of the event outside its `InputRanges` range, or nil (ingest dead-letters it
    /// `out_of_range`).
    public func rangeError() -> FieldError? {
        if let createdAt, let e = InputRanges.check(createdAt, in: InputRanges.timestampMillis, field: "created_at") {
            return e
        }
        return nil
    }
}

extension RegistryRecord {
    /// The first number or size of the record outside its `InputRanges` range, or nil. herald-registry
    /// dead-letters it `out_of_range`; the registry API answers 400 with it.
    public func rangeError() -> FieldError? {
        if let ttlMs, let e = InputRanges.check(ttlMs, in: InputRanges.presenceTTLMillis, field: "ttl_ms") { return e }
        if let readAt, let e = InputRanges.check(readAt, in: InputRanges.timestampMillis, field: "read_at") {
            return e
        }
        if let online {
            if online.count > InputRanges.presenceTokens {
                return FieldError(
                    field: "online", message: "\(online.count) tokens, at most \(InputRanges.presenceTokens)",
                    reason: InputRanges.reason)
            }
            for (i, token) in online.enumerated() {
                if let e = InputRanges.check(
                    token, bytes: InputRanges.presenceTokenBytes, field: "online[\(i)]", allowsEmpty: false)
                {
                    return e
                }
            }
        }
        if let device {
            if let e = InputRanges.check(
                device.registeredAt, in: InputRanges.registeredAtMillis, field: "device.registered_at")
            {
                return e
            }
            if let b = device.bundleID,
                let e = InputRanges.check(b, bytes: InputRanges.bundleIDBytes, field: "device.bundle_id")
            {
                return e
            }
            if let p = device.providerID,
                let e = InputRanges.check(p, bytes: InputRanges.providerIDBytes, field: "device.provider_id")
            {
                return e
            }
        }
        if let unread { return unread.rangeError(field: "unread") }
        return nil
    }
}

extension Unread {
    /// The first count or list of a `set_unread` outside its `InputRanges` range, or nil.
    public func rangeError(field: String) -> FieldError? {
        if let e = InputRanges.check(total, in: InputRanges.unreadCount, field: "\(field).total") { return e }
        if let e = InputRanges.check(mentionTotal, in: InputRanges.unreadCount, field: "\(field).mention_total") {
            return e
        }
        for (name, counts) in [("conversations", conversations), ("mention_conversations", mentionConversations)] {
            if counts.count > InputRanges.unreadConversations {
                return FieldError(
                    field: "\(field).\(name)",
                    message: "\(counts.count) conversations, at most \(InputRanges.unreadConversations)",
                    reason: InputRanges.reason)
            }
            for (conversation, count) in counts {
                if let e = InputRanges.check(
                    conversation, bytes: RegistryRecord.maxIDBytes, field: "\(field).\(name)", allowsEmpty: false)
                {
                    return e
                }
                if let e = InputRanges.check(
                    count, in: InputRanges.unreadCount, field: "\(field).\(name).\(conversation)")
                {
                    return e
                }
            }
        }
        return nil
    }
}
