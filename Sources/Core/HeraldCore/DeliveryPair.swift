/// One (event, device token) pair: the unit herald-send's idempotency records are kept for (docs/redis-keys.md).
/// A pair is claimed before its notification is sent, confirmed once the provider accepted it, and released when
/// the send failed; a pair already confirmed is not sent again.
///
/// `eventTime` is the event's `created_at` when the record carries it: every copy of a pair then carries the same
/// time, so its record is filed under the replay window that time falls in, whenever a copy is sent. Without it
/// the record is filed under the window of the send, and the window before is read too. Two pairs are equal when
/// their event and token are: `eventTime` does not take part.
public struct DeliveryPair: Sendable, Hashable {
    public var eventID: String
    public var token: String
    public var eventTime: Int64?

    public init(eventID: String, token: String, eventTime: Int64? = nil) {
        self.eventID = eventID
        self.token = token
        self.eventTime = eventTime
    }

    public static func == (a: DeliveryPair, b: DeliveryPair) -> Bool { a.eventID == b.eventID && a.token == b.token }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(eventID)
        hasher.combine(token)
    }
}
