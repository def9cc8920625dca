/// The trace context of a traced message kept with state that outlives its batch (a held burst, a flood guard's held
/// pushes, a user's digest; docs/operations.md "Tracing"): the raw `traceparent` and `tracestate` header values the
/// record made later from that state carries. Only a traced message has one, so untraced traffic keeps nothing.
public struct HeldTrace: Sendable, Hashable {
    public var traceparent: [UInt8]
    public var tracestate: [UInt8]?

    public init(traceparent: [UInt8], tracestate: [UInt8]? = nil) {
        self.traceparent = traceparent
        self.tracestate = tracestate
    }

    /// The context as one value to store: the `traceparent`, then a space and the `tracestate` when there is one (a
    /// `traceparent` has no space, so the first one parts them).
    public var stored: [UInt8] {
        guard let tracestate else { return traceparent }
        return traceparent + [UInt8(ascii: " ")] + tracestate
    }

    /// Reads `stored`; nil for an empty value.
    public init?(stored: some Collection<UInt8>) {
        guard !stored.isEmpty else { return nil }
        if let space = stored.firstIndex(of: UInt8(ascii: " ")) {
            self.init(
                traceparent: Array(stored[..<space]), tracestate: Array(stored[stored.index(after: space)...]))
        } else {
            self.init(traceparent: Array(stored))
        }
    }
}
