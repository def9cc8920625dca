import HeraldCore

/// A record one of suppress's timers produces (a burst's flush, a flood guard's summary, a digest), with the trace
/// context it carries as its `traceparent`/`tracestate` headers: the one kept with the held state of a traced message
/// (docs/operations.md "Tracing"); nil (no header) when none was traced.
public struct FlushOutput: Sendable, Hashable {
    public var output: StageOutput
    public var trace: TracePropagation?

    public init(_ output: StageOutput, trace: TracePropagation? = nil) {
        self.output = output
        self.trace = trace
    }
}

extension TracePropagation {
    /// The context as kept with held state (a burst, a digest).
    public var held: HeldTrace { HeldTrace(traceparent: traceparent, tracestate: tracestate) }

    /// A context kept with held state, as it travels again.
    public init(_ held: HeldTrace) {
        self.init(traceparent: held.traceparent, tracestate: held.tracestate)
    }
}

/// The flush timer of burst coalescing (docs/behaviour.md §6a): messages held back inside a burst are shown once the
/// update interval has passed since its last visible push, as one update of the burst's notification with the
/// count of every message so far. Suppress runs a pass every `interval` in each process; a pass claims the due
/// flushes of every app with coalescing on (leased, so several processes share the work and a flush claimed by a
/// process that dies is taken again when its lease passes), produces each held message's deliverable record with
/// the count, and confirms the flushes once the broker acknowledged them. A flush produced twice (a crash between
/// the broker's answer and the confirmation) is the same event to the same devices: send's delivery records skip
/// the second. The flood guard's summaries (§6b) go the same way, a minute after the guard began holding. A flush
/// carries the trace context of the latest traced message its burst (or guard) held since it last showed
/// (`HeldBurst.trace`), so that message's trace goes on through render and send with the notification that shows it.
public struct BurstFlusher: Sendable {
    public let stage = "suppress"
    public var ledger: any BurstLedger
    /// The `herald.deliverable` topic of each lane.
    public var deliverableTopic: @Sendable (Lane) -> String
    /// How often a process looks for due flushes while a message it held back may still wait for its flush.
    public static let interval: Duration = .milliseconds(250)
    /// How often it looks otherwise. The messages another process held wait for that process's own timer; this
    /// one takes them (at most this much late) only when that process is gone.
    public static let idleInterval: Duration = .seconds(2)

    /// The wait before the next pass: `interval` while the last pass found flushes due, or while a message this
    /// process held back at `lastHeldAt` (epoch ms; nil: none) may still wait for its flush (the longest an app's
    /// coalescing update interval or flood guard minute holds one, and a margin); `idleInterval` otherwise, so an
    /// idle suppress does not ask Redis for every app's shards four times a second.
    public static func nextWait(lastHeldAt: Int64?, foundDue: Bool, now: Int64, apps: AppDirectory) -> Duration {
        if foundDue { return interval }
        guard let lastHeldAt else { return idleInterval }
        var horizon: Int64 = 0
        for app in apps.apps.values {
            if app.coalesce.isOn { horizon = max(horizon, app.coalesce.updateMilliseconds) }
            if app.floodGuard.isOn { horizon = max(horizon, FloodGuard.minuteMilliseconds) }
        }
        // The margin: two passes, and the stages' clocks apart.
        return now - lastHeldAt <= horizon + 1_000 ? interval : idleInterval
    }

    public init(ledger: any BurstLedger, deliverableTopic: @escaping @Sendable (Lane) -> String) {
        self.ledger = ledger
        self.deliverableTopic = deliverableTopic
    }

    /// What one pass did.
    public struct Pass: Sendable {
        /// Flushes produced and confirmed (flood guard summaries included).
        public var flushed = 0
        /// Of those, flood guard summaries (docs/behaviour.md §6b).
        public var summaries = 0
        /// Held records that did not decode (written by another Herald version): dropped with their burst.
        public var invalid: [String] = []
        /// Held messages whose event was gone from the burst state (`HeldBurst.eventMissing`): nothing is sent for
        /// them, and their bursts are confirmed as if the flush had gone out, so they go on (the next update shows
        /// the right count again).
        public var missing: [Missing] = []
        public var explain: [ExplainEntry] = []
    }

    /// A flush that could not be sent because its held message's event was gone.
    public struct Missing: Sendable, Hashable {
        public var app: String
        public var user: String
        public var conversation: String
        /// The count the flush would have shown.
        public var count: Int

        public init(app: String, user: String, conversation: String, count: Int) {
            self.app = app
            self.user = user
            self.conversation = conversation
            self.count = count
        }
    }

    /// One pass at `now` (epoch ms): claim, produce (`produce` returns once the broker acknowledged every output,
    /// and throws otherwise: the flushes stay leased and are taken again), confirm.
    public func pass(
        apps: AppDirectory, now: Int64, produce: @Sendable ([FlushOutput]) async throws -> Void
    ) async throws -> Pass {
        var result = Pass()
        for (appID, app) in apps.apps.sorted(by: { $0.key < $1.key }) where app.coalesce.isOn || app.floodGuard.isOn {
            let due = try await ledger.claimDue(app: appID, policy: app.coalesce, now: now)
            if due.isEmpty { continue }
            var outputs: [FlushOutput] = []
            var entries: [ExplainEntry] = []
            for held in due {
                if held.eventMissing {
                    result.missing.append(
                        Missing(app: appID, user: held.user, conversation: held.conversation, count: held.count))
                    continue
                }
                var record: DeliverableRecord
                do {
                    record = try StageCodec.decode(DeliverableRecord.self, from: held.record)
                } catch {
                    result.invalid.append("\(error.detail)")
                    continue
                }
                // Push turned off (`push: off`) while messages were held: they are dropped with the flush.
                if !app.push {
                    entries.append(
                        ExplainEntry(
                            appID: appID, eventID: record.event.eventID, user: record.recipient, stage: stage,
                            decision: "suppress", reason: SuppressionReason.appOff.rawValue, at: now))
                    continue
                }
                let summary = held.conversation.isEmpty
                record.burst = summary ? -held.count : held.count
                if summary { result.summaries += 1 }
                outputs.append(
                    FlushOutput(
                        StageOutput(
                            topic: deliverableTopic(held.lane), key: record.recipient, value: StageCodec.encode(record)),
                        trace: held.trace.map(TracePropagation.init)))
                entries.append(
                    ExplainEntry(
                        appID: appID, eventID: record.event.eventID, user: record.recipient, stage: stage,
                        decision: "deliver", reason: summary ? FloodGuard.summaryReason : Coalescing.flushReason,
                        at: now,
                        count: record.targets.count))
            }
            try await produce(outputs)
            try await ledger.confirm(app: appID, policy: app.coalesce, flushed: due, now: now)
            result.flushed += outputs.count
            result.explain += entries
        }
        return result
    }
}
