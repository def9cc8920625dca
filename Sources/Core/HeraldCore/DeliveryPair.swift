/// One (event, device token) pair: the unit herald-send's idempotency records are kept for (docs/redis-keys.md).
/// A pair is claimed before its notification is sent, confirmed once the provider accepted it, and released when
/// the send failed; a pair already confirmed is not sent again.
public struct DeliveryPair: Sendable, Hashable {
    public var eventID: String
    public var token: String

    public init(eventID: String, token: String) {
        self.eventID = eventID
        self.token = token
    }
}
