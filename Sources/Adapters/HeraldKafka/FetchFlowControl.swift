/// The consumer's fetch decisions, one per turn of its poll loop: fetch or wait, and
/// whether the assignment must be paused or resumed. Pure; the poll thread holds it under
/// the consumer's lock and applies what it returns.
///
/// - The caller's `pause()` pauses fetching at once, until `resume()`.
/// - A full prefetch buffer (`buffered >= capacity`) first only makes the thread wait
///   instead of polling: librdkafka keeps its own bounded fetch queue, and pausing purges
///   that queue (so pausing on every full buffer would refetch the same records again
///   and again).
/// - A buffer full for `stallPauseAfter` means the caller is stalled: the assignment is
///   paused so the thread can keep polling for group events (heartbeats, rebalances)
///   without receiving records, until the buffer is half empty again.
public struct FetchFlowControl: Sendable, Hashable {
    public enum Fetch: Sendable, Hashable {
        /// Poll librdkafka (records, errors, callbacks).
        case poll
        /// Don't poll this turn (the buffer is full); sleep briefly.
        case wait
    }

    public struct Decision: Sendable, Hashable {
        /// `true`: pause the assignment now; `false`: resume it now; `nil`: leave it.
        public var pause: Bool?
        public var fetch: Fetch
        public init(pause: Bool?, fetch: Fetch) {
            self.pause = pause
            self.fetch = fetch
        }
    }

    public let capacity: Int
    public let stallPauseAfter: Duration
    private var fullSince: ContinuousClock.Instant?
    private var stallPaused = false
    /// Whether the assignment is currently paused (by the caller or by a stall).
    public private(set) var isPaused = false

    public init(capacity: Int, stallPauseAfter: Duration = .seconds(1)) {
        self.capacity = max(1, capacity)
        self.stallPauseAfter = stallPauseAfter
    }

    public mutating func decide(buffered: Int, userPaused: Bool, now: ContinuousClock.Instant) -> Decision {
        let full = buffered >= capacity
        if full {
            if fullSince == nil { fullSince = now }
            if let since = fullSince, now - since >= stallPauseAfter { stallPaused = true }
        } else {
            fullSince = nil
            if buffered <= capacity / 2 { stallPaused = false }
        }
        let wantPaused = userPaused || stallPaused
        var change: Bool?
        if wantPaused != isPaused {
            isPaused = wantPaused
            change = wantPaused
        }
        return Decision(pause: change, fetch: full && !stallPaused ? .wait : .poll)
    }
}
