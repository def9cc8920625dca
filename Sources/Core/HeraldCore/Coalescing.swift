// Burst coalescing (docs/behaviour.md §6a): a lively group conversation wakes a user once, then keeps one
// notification up to date instead of stacking twenty. Suppress steps a small per (user, conversation) state kept in
// Redis; render turns the step into the payload (same collapse id, no sound, "3 new messages in Hiking"). Messages
// held back between two updates are shown by a flush once the update interval has passed, so the last messages of
// a burst are never lost.

/// An app's burst settings (`coalesce:` in the pipeline file). Off by default.
public struct CoalescePolicy: Sendable, Hashable {
    /// How long a burst lasts after its last message, in milliseconds; 0 turns coalescing off.
    public var windowMilliseconds: Int64
    /// The least time between two visible pushes of one burst, in milliseconds: messages in between are held
    /// back and shown together by the next update (a flush once this interval has passed).
    public var updateMilliseconds: Int64

    /// `updateMilliseconds` defaults to half the window: 20 messages in a 10 s window give one alert and at most
    /// two updates.
    public init(windowMilliseconds: Int64 = 0, updateMilliseconds: Int64? = nil) {
        self.windowMilliseconds = max(0, windowMilliseconds)
        self.updateMilliseconds = max(0, min(updateMilliseconds ?? windowMilliseconds / 2, self.windowMilliseconds))
    }

    public var isOn: Bool { windowMilliseconds > 0 }
}

/// What is kept per active burst.
public struct BurstState: Sendable, Hashable {
    /// Messages counted since the burst began.
    public var count: Int
    /// The count the last visible push showed.
    public var shown: Int
    /// When the last visible push went out (epoch ms).
    public var shownAt: Int64
    /// When the last message arrived (epoch ms).
    public var lastAt: Int64
    /// Messages are held back and a flush is due (the latest held message is kept with the state).
    public var pending: Bool

    public init(count: Int, shown: Int, shownAt: Int64, lastAt: Int64, pending: Bool) {
        self.count = count
        self.shown = shown
        self.shownAt = shownAt
        self.lastAt = lastAt
        self.pending = pending
    }
}

/// One message's place in its burst.
public enum BurstStep: Sendable, Hashable {
    /// The first message: a normal alert with sound; it opens the burst.
    case first
    /// A later message that replaces the notification at once: `count` messages so far, no sound.
    case update(count: Int)
    /// A later message held back: too soon after the last visible push; the burst's flush shows it.
    case held(count: Int)
}

/// What the flush timer does with a burst whose due time has come.
public enum BurstFlush: Sendable, Hashable {
    /// Show the held messages: the latest held message goes out as an update of `count` messages.
    case show(count: Int)
    /// The window passed with nothing new: forget the burst.
    case end
    /// Not due yet (a message moved it on): look again at the state's due time.
    case wait
}

public enum Coalescing {
    /// The suppress reason of a held-back message.
    public static let heldReason = "coalesced"
    /// The explain reason of a delivered update that replaces the burst's notification.
    public static let updateReason = "coalesced_update"
    /// The explain reason of a flush: held messages shown together once the update interval passed.
    public static let flushReason = "coalesced_flush"

    /// Whether this push may be coalesced: a plain message in a group conversation to a recipient it does not
    /// mention, not forced, in an app with coalescing on. Direct messages, mentions, calls, reactions, group
    /// actions, edits, deletions, admin broadcasts and forced messages are never held back.
    public static func eligible(_ event: ChatEvent, recipient: String, app: AppConfig) -> Bool {
        guard app.coalesce.isOn, event.kind == .message, event.conversation.type == .group,
            !event.ext.forceNotification, let m = event.message, m.type != .admin
        else { return false }
        if m.mentionType == .channel || m.mentions.contains(recipient) { return false }
        return true
    }

    /// The step of a message arriving at `at` (epoch ms), from the burst's state (nil: no burst), and the state to
    /// keep. A burst ends when the window passes with nothing new and nothing held. While messages are held, later
    /// ones are held too (the flush shows them all, in order); otherwise a message at least the update interval
    /// after the last visible push is shown at once. The Redis script (HeraldRedis `BurstScripts.step`) does
    /// exactly this.
    public static func step(_ previous: BurstState?, at: Int64, policy: CoalescePolicy) -> (BurstStep, BurstState) {
        guard let p = previous, p.count > 0, p.pending || at - p.lastAt < policy.windowMilliseconds else {
            return (.first, BurstState(count: 1, shown: 1, shownAt: at, lastAt: at, pending: false))
        }
        var next = p
        next.count += 1
        next.lastAt = max(p.lastAt, at)
        if !p.pending && Saturating.subtract(at, p.shownAt) >= policy.updateMilliseconds {
            next.shown = next.count
            next.shownAt = at
            return (.update(count: next.count), next)
        }
        next.pending = true
        return (.held(count: next.count), next)
    }

    /// When the flush timer should look at a burst next: the end of the update interval while messages are held,
    /// else the end of the window.
    public static func due(_ state: BurstState, policy: CoalescePolicy) -> Int64 {
        state.pending
            ? Saturating.add(state.shownAt, policy.updateMilliseconds)
            : Saturating.add(state.lastAt, policy.windowMilliseconds)
    }

    /// What the flush timer does at `now` with a burst.
    public static func flush(_ state: BurstState, now: Int64, policy: CoalescePolicy) -> BurstFlush {
        if state.pending {
            return now >= Saturating.add(state.shownAt, policy.updateMilliseconds) ? .show(count: state.count) : .wait
        }
        return now >= Saturating.add(state.lastAt, policy.windowMilliseconds) ? .end : .wait
    }

    /// The state after a flush that showed `count` messages at `now` went out. Messages held after the flush was
    /// taken stay held for the next one.
    public static func flushed(_ state: BurstState, count: Int, now: Int64) -> BurstState {
        guard count > state.shown else { return state }
        var next = state
        next.shown = count
        next.shownAt = now
        next.pending = state.count > count
        return next
    }

    /// The `apns-collapse-id` / FCM `collapse_key` and `tag` of every push of a burst: `b-<conversation>`, hashed
    /// when longer than 64 bytes; a flood guard's summary (`burst` < 0) has the user's `herald-summary`.
    public static func collapseID(_ event: ChatEvent, burst: Int) -> String {
        if burst < 0 { return FloodGuard.collapseID }
        let id = "b-" + event.conversation.id
        return id.utf8.count <= 64 ? id : "b-" + APNsID.derive(eventID: id, token: "")
    }
}

/// One message to step through its burst.
public struct BurstMessage: Sendable, Hashable {
    public var appID: String
    public var user: String
    public var conversation: String
    /// When suppress decided it, epoch milliseconds (bursts are timed on the stages' clock, like their flushes).
    public var at: Int64
    public var policy: CoalescePolicy
    /// The lane whose `herald.deliverable` topic a flush of this message goes to.
    public var lane: Lane
    /// For a user's flood guard (`conversation` empty): the most visible pushes per minute.
    public var flood = FloodPolicy()
    /// The message's deliverable record (wire bytes), kept with the burst while it is held.
    public var record: [UInt8]
    /// A traced message's context (`StageInput.trace`), kept with the burst when the message is held: the burst's
    /// flush carries the context of the latest traced message it holds. nil for an untraced one.
    public var trace: HeldTrace?

    /// The part of `record` a held message keeps once per event, shared by every burst that holds it: the event's
    /// bytes (`DeliverableRecord.eventRange(inWireBytes:)`); nil for a record of another kind, which is kept whole.
    public var sharedBytes: Range<Int>? { DeliverableRecord.eventRange(inWireBytes: record) }

    public init(
        appID: String, user: String, conversation: String, at: Int64, policy: CoalescePolicy, lane: Lane,
        record: [UInt8], trace: HeldTrace? = nil
    ) {
        self.trace = trace
        self.appID = appID
        self.user = user
        self.conversation = conversation
        self.at = at
        self.policy = policy
        self.lane = lane
        self.record = record
    }
}

/// A burst whose flush is due: its latest held message, to go out as an update of `count` messages.
public struct HeldBurst: Sendable, Hashable {
    public var user: String
    public var conversation: String
    public var count: Int
    public var lane: Lane
    /// The deliverable record of the latest held message (wire bytes, as suppress wrote it).
    public var record: [UInt8]
    /// The held message's event was gone from the burst state (its shared copy expired or was evicted): `record` is
    /// empty and no flush can be produced. The flush timer confirms the burst without output and counts it
    /// (docs/behaviour.md §6a).
    public var eventMissing: Bool
    /// The context of the latest traced message the burst held since it last showed (`BurstMessage.trace`), which
    /// its flush carries; nil when none of them was traced.
    public var trace: HeldTrace?

    public init(
        user: String, conversation: String, count: Int, lane: Lane, record: [UInt8], eventMissing: Bool = false,
        trace: HeldTrace? = nil
    ) {
        self.trace = trace
        self.user = user
        self.conversation = conversation
        self.count = count
        self.lane = lane
        self.record = record
        self.eventMissing = eventMissing
    }
}

// A flood guard per user (docs/behaviour.md §6b): at most `perMinute` visible pushes per user in each minute of the
// clock; beyond that, pushes are held back and the next minute opens with one silent summary ("12 new messages")
// instead of the user losing them. It keeps its state with the user's bursts (the conversation left empty) and
// shares their flush timer: `BurstState.count` is the held pushes, `shown` the visible pushes of the minute that
// starts at `shownAt`.

/// An app's flood guard (`flood_guard:` in the pipeline file). Off by default.
public struct FloodPolicy: Sendable, Hashable {
    /// The most visible pushes per user per minute; 0 turns the guard off.
    public var perMinute: Int

    public init(perMinute: Int = 0) { self.perMinute = max(0, perMinute) }

    public var isOn: Bool { perMinute > 0 }
}

public enum FloodGuard {
    /// The suppress reason of a push held back by the flood guard.
    public static let heldReason = "flood_guard"
    /// The explain reason of the summary that shows the held pushes.
    public static let summaryReason = "flood_summary"
    /// The guard counts by minutes of the clock.
    public static let minuteMilliseconds: Int64 = 60_000
    /// The flush timing of the guard's state: flushed and ended a minute after its minute began.
    public static let timing = CoalescePolicy(
        windowMilliseconds: minuteMilliseconds, updateMilliseconds: minuteMilliseconds)
    /// The collapse id of a summary: one per user, whatever the conversations.
    public static let collapseID = "herald-summary"

    /// Calls and forced messages are never held back, and a deleted message's background push shows nothing: none
    /// of them is held or counted.
    public static func exempt(_ event: ChatEvent) -> Bool {
        event.kind == .call || event.kind == .messageDeleted || event.ext.forceNotification
    }

    /// The step of a visible push at `at` (epoch ms) for a user's guard state (nil: none): `.first` lets it go, `.held`
    /// holds it (the count of held pushes). While pushes are held, later ones are held too, until the summary.
    public static func step(_ previous: BurstState?, at: Int64, policy: FloodPolicy) -> (BurstStep, BurstState) {
        let minute = at - at % minuteMilliseconds
        var state = previous ?? BurstState(count: 0, shown: 0, shownAt: minute, lastAt: at, pending: false)
        if !state.pending && state.shownAt < minute {
            state = BurstState(count: 0, shown: 0, shownAt: minute, lastAt: at, pending: false)
        }
        state.lastAt = max(state.lastAt, at)
        if state.pending || state.shown >= policy.perMinute {
            state.count += 1
            state.pending = true
            return (.held(count: state.count), state)
        }
        state.shown += 1
        return (.first, state)
    }

    /// The state after a summary of `count` held pushes went out at `now`: it is the first visible push of `now`'s
    /// minute; pushes held after the summary was taken stay held.
    public static func flushed(_ state: BurstState, count: Int, now: Int64) -> BurstState {
        guard state.pending, count > 0, state.count >= count else { return state }
        let left = state.count - count
        return BurstState(
            count: left, shown: 1, shownAt: now - now % minuteMilliseconds, lastAt: state.lastAt, pending: left > 0)
    }
}
