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
/// - With an `IdlePolicy`, a consumer that received nothing for `after` is idle: its
///   assignment is paused, and every `probeInterval` it is resumed for `probeWindow` (a
///   round of fetches), then paused again. The first record (`noteRecords`) ends the idle
///   state: fetching stays on. On a broker that answers an empty fetch only when its wait
///   is over (Tansu), this is what keeps idle consumers from fetching all the time.
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
        /// Idle and paused between probes: the next probe starts at this instant (the poll thread may sleep longer).
        public var idleUntil: ContinuousClock.Instant?
        public init(pause: Bool?, fetch: Fetch, idleUntil: ContinuousClock.Instant? = nil) {
            self.pause = pause
            self.fetch = fetch
            self.idleUntil = idleUntil
        }
    }

    /// When a consumer counts as idle and how it probes for records then.
    public struct IdlePolicy: Sendable, Hashable {
        public var after: Duration
        public var probeInterval: Duration
        public var probeWindow: Duration
        public init(after: Duration, probeInterval: Duration, probeWindow: Duration) {
            self.after = after
            self.probeInterval = probeInterval
            self.probeWindow = probeWindow
        }
    }

    public let capacity: Int
    public let stallPauseAfter: Duration
    public let idlePolicy: IdlePolicy?
    private var fullSince: ContinuousClock.Instant?
    private var stallPaused = false
    /// Whether the assignment is currently paused (by the caller, a stall or idleness).
    public private(set) var isPaused = false
    /// Whether nothing arrived for `idlePolicy.after` (and nothing since).
    public private(set) var isIdle = false
    private var lastActivity: ContinuousClock.Instant?
    private var nextProbe: ContinuousClock.Instant?
    private var probeEnds: ContinuousClock.Instant?

    public init(capacity: Int, stallPauseAfter: Duration = .seconds(1), idle: IdlePolicy? = nil) {
        self.capacity = max(1, capacity)
        self.stallPauseAfter = stallPauseAfter
        self.idlePolicy = idle
    }

    /// Records arrived: the consumer is busy again (fetching stays on until it is idle for `idlePolicy.after`).
    public mutating func noteRecords(now: ContinuousClock.Instant) {
        lastActivity = now
        isIdle = false
        probeEnds = nil
        nextProbe = nil
    }

    /// Forget the idle state (a new assignment): fetch continuously again until idle for `idlePolicy.after`.
    public mutating func wake(now: ContinuousClock.Instant) { noteRecords(now: now) }

    public mutating func decide(buffered: Int, userPaused: Bool, now: ContinuousClock.Instant) -> Decision {
        var idlePaused = false
        if let idle = idlePolicy {
            if buffered > 0 || lastActivity == nil { lastActivity = now }
            if isIdle {
                if let end = probeEnds {
                    if now >= end {
                        probeEnds = nil
                        nextProbe = now + idle.probeInterval
                    }
                } else if let next = nextProbe, now >= next {
                    probeEnds = now + idle.probeWindow
                }
            } else if let last = lastActivity, now - last >= idle.after {
                isIdle = true
                nextProbe = now + idle.probeInterval
            }
            idlePaused = isIdle && probeEnds == nil
        }
        let full = buffered >= capacity
        if full {
            if fullSince == nil { fullSince = now }
            if let since = fullSince, now - since >= stallPauseAfter { stallPaused = true }
        } else {
            fullSince = nil
            if buffered <= capacity / 2 { stallPaused = false }
        }
        let wantPaused = userPaused || stallPaused || idlePaused
        var change: Bool?
        if wantPaused != isPaused {
            isPaused = wantPaused
            change = wantPaused
        }
        return Decision(
            pause: change, fetch: full && !stallPaused ? .wait : .poll, idleUntil: idlePaused ? nextProbe : nil)
    }
}
