/// One (event, device token) pair: the unit herald-send's idempotency records are kept for (docs/redis-keys.md).
/// A pair is claimed before its notification is sent, confirmed once the provider accepted it, and released when
/// the send failed; a pair already confirmed is not sent again.
///
/// `eventTime` is the event's `created_at` when the record carries it: every copy of a pair then carries the same
/// time, so its record is filed under the replay window that time falls in, whenever a copy is sent. Without it
/// the record is filed under the window of the send, and the window before is read too. Two pairs are equal when
/// their event and token are: `eventTime` does not take part.
public struct DeliveryPair: Sendable, Hashable {
    public let eventID: String
    public let token: String
    public var eventTime: Int64?
    /// The event's and token's hash, taken once: send looks each pair up in several sets and tables (the pairs in
    /// flight, the held claim numbers), and hashing the two strings again for each cost more than the lookups.
    private let hashCode: Int

    public init(eventID: String, token: String, eventTime: Int64? = nil) {
        self.eventID = eventID
        self.token = token
        self.eventTime = eventTime
        var hasher = Hasher()
        hasher.combine(eventID)
        hasher.combine(token)
        hashCode = hasher.finalize()
    }

    public static func == (a: DeliveryPair, b: DeliveryPair) -> Bool {
        a.hashCode == b.hashCode && a.eventID == b.eventID && a.token == b.token
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(hashCode) }
}
