import Synchronization

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
/// - With an `IdlePolicy`, a consumer that received nothing (and was not paused by its caller)
///   for `after` is idle: its assignment is paused, and at once and then every `probeInterval`
///   the decision asks for a probe (`Decision.probe`): the poll thread asks the broker for the
///   partitions' end offsets, which also keeps the lag current. A probe that finds records
///   waiting (`wake`), or a record (`noteRecords`), ends the idle state: fetching resumes at
///   once and stays on. On a broker that answers an empty fetch only when its wait is over
///   (Tansu), this is what keeps idle consumers from fetching all the time.
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
        /// Idle: ask the broker now whether records are waiting (end offsets beyond the positions).
        public var probe: Bool
        /// Idle: the next probe is due at this instant (the poll thread may sleep until then).
        public var idleUntil: ContinuousClock.Instant?
        public init(pause: Bool?, fetch: Fetch, probe: Bool = false, idleUntil: ContinuousClock.Instant? = nil) {
            self.pause = pause
            self.fetch = fetch
            self.probe = probe
            self.idleUntil = idleUntil
        }
    }

    /// When a consumer counts as idle and how often it asks the broker for records then.
    public struct IdlePolicy: Sendable, Hashable {
        public var after: Duration
        public var probeInterval: Duration
        public init(after: Duration, probeInterval: Duration) {
            self.after = after
            self.probeInterval = probeInterval
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
    private var wasUserPaused = false
    private var awaitingRecords = false

    public init(capacity: Int, stallPauseAfter: Duration = .seconds(1), idle: IdlePolicy? = nil) {
        self.capacity = max(1, capacity)
        self.stallPauseAfter = stallPauseAfter
        self.idlePolicy = idle
    }

    /// Records arrived: the consumer is busy again (fetching stays on until it is idle for `idlePolicy.after`).
    public mutating func noteRecords(now: ContinuousClock.Instant) {
        lastActivity = now
        isIdle = false
        nextProbe = nil
        awaitingRecords = false
    }

    /// End the idle state (a new assignment, or a probe that found records waiting: `expectRecords`): the next
    /// decision resumes fetching, which then stays on until the consumer is idle for `idlePolicy.after` again. When
    /// records are expected it stays on until one arrives, however long the broker takes to deliver it (a slow fetch
    /// must not send the consumer back to idle, to find the same records waiting, again and again).
    public mutating func wake(now: ContinuousClock.Instant, expectRecords: Bool = false) {
        noteRecords(now: now)
        awaitingRecords = expectRecords
    }

    /// - Parameter shared: the last time a consumer sharing this one's `ConsumerActivity` received records; newer
    ///   than this consumer's own activity, it counts as its own (and ends its idle state).
    public mutating func decide(
        buffered: Int, userPaused: Bool, now: ContinuousClock.Instant, shared: ContinuousClock.Instant? = nil
    ) -> Decision {
        var probe = false
        if let idle = idlePolicy {
            if let shared, let last = lastActivity, shared > last {
                lastActivity = shared
                isIdle = false
                nextProbe = nil
            }
            // Records waiting for the caller, or a caller that paused fetching (its lag is measured the paused way),
            // are not idleness.
            if buffered > 0 || userPaused || wasUserPaused || awaitingRecords || lastActivity == nil {
                lastActivity = now
            }
            wasUserPaused = userPaused
            if !isIdle, let last = lastActivity, now - last >= idle.after {
                isIdle = true
                nextProbe = now
            }
            if isIdle, let next = nextProbe, now >= next {
                probe = true
                nextProbe = now + idle.probeInterval
            }
        }
        let idlePaused = isIdle
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
            pause: change, fetch: full && !stallPaused ? .wait : .poll, probe: probe,
            idleUntil: idlePaused ? nextProbe : nil)
    }
}

/// When the consumers of one process last received records (`KafkaConsumerConfiguration.activity`).
public final class ConsumerActivity: Sendable, Hashable {
    private let last = Mutex<ContinuousClock.Instant?>(nil)

    public init() {}

    /// The last time a consumer sharing this activity received records.
    public var lastRecords: ContinuousClock.Instant? { last.withLock { $0 } }

    func noteRecords(now: ContinuousClock.Instant) {
        last.withLock { previous in
            if previous.map({ now > $0 }) ?? true { previous = now }
        }
    }

    public static func == (lhs: ConsumerActivity, rhs: ConsumerActivity) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}
