import Foundation
import HeraldCore

/// suppress: `herald.resolved` -> `herald.deliverable` (keyed by recipient user id).
/// Applies the rules of docs/behaviour.md §6 (`Suppression.decide`, at the event's time); every suppression is
/// counted by reason and written to the explain trail, and so is every decision to deliver. With a `BurstLedger`,
/// a delivery that may be coalesced (§6a) is stepped through its burst, the whole batch in one round trip: the
/// first message of a burst goes on as it is, later ones as updates of its notification or held back
/// (`coalesced`). Then, for apps with a flood guard (§6b), each push still to be shown is counted against its user's
/// limit per minute, the batch in one more round trip; beyond it the push is held for the next minute's summary
/// (`flood_guard`).
public struct SuppressProcessor: StageProcessor {
    public let stage = "suppress"
    public var deliverableTopic: String
    public var apps: AppDirectory
    /// The apps as the pipeline file now says (reloaded on SIGHUP or when the file changes, docs/operations.md
    /// "Reloading"): when set, each batch takes the current directory in place of `apps`.
    public var live: LiveAppDirectory?
    /// Where bursts are kept (Redis in the stage); nil: nothing is coalesced.
    public var bursts: (any BurstLedger)?
    /// The lane this processor's input and output belong to (a held message's flush goes to its lane's topic).
    public var lane: Lane = .bulk
    /// Told when the burst ledger fails (the batch is then delivered without coalescing, never held up).
    public var onBurstFailure: @Sendable (any Error) -> Void = { _ in }
    /// Where digests are counted (docs/behaviour.md §6d; Redis in the stage); nil: none.
    public var digests: (any DigestLedger)?
    /// Told when the digest ledger fails (the batch's messages stay suppressed, without a digest).
    public var onDigestFailure: @Sendable (any Error) -> Void = { _ in }
    /// The events decoded by the last batch, for the next one (`EventReuseCarry`).
    let events = EventReuseCarry()

    public init(deliverableTopic: String, apps: AppDirectory) {
        self.deliverableTopic = deliverableTopic
        self.apps = apps
    }

    /// One input after the rules: a finished result, or a delivery still to be written.
    enum Decided {
        case done(StageResult)
        case deliver(Delivery)
        /// Suppressed by the snooze or Do Not Disturb, and counted for the user's digest.
        case counted(StageResult, DigestCount)
    }

    /// A delivery still to be written: the record as the rules read it, the devices to push and the input's parts
    /// that go on unchanged. A class, so the batch's passes over the decisions (bursts, flood guard, outputs) share
    /// it instead of copying the record.
    final class Delivery: Sendable {
        let record: ResolvedRecord
        let targets: [Device]
        let forwarded: ForwardedParts?

        init(_ read: RulesRecord, targets: [Device]) {
            self.record = read.record
            self.targets = targets
            self.forwarded = read.forwarded
        }

        /// The `herald.deliverable` record render reads: the event, the recipient, the push settings and unread
        /// counts (its devices are the targets), at burst position `burst`.
        func wireBytes(burst: Int?) -> [UInt8] {
            if let forwarded {
                return DeliverableRecord.wireBytes(forwarding: forwarded, targets: targets, burst: burst)
            }
            var state = record.state
            state.devices = []
            state.online = []
            var deliverable = DeliverableRecord(
                event: record.event, recipient: record.recipient, state: state,
                targets: targets, senderDisplayName: record.senderDisplayName)
            deliverable.burst = burst
            return deliverable.wireBytes()
        }
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.now()
        var current = self
        if let live { current.apps = live.current }
        var reuse = events.take()
        var decided: [Decided] = []
        decided.reserveCapacity(batch.count)
        for input in batch { decided.append(current.decide(input, now: now, reuse: &reuse)) }
        events.keep(reuse)
        let steps = await current.burstSteps(decided, now: now)
        let floods = await current.floodSteps(decided, steps: steps, now: now)
        let counted = await current.countDigests(decided, now: now)
        return decided.enumerated().map { index, d in
            switch d {
            case .done(let result): return result
            case .counted(var result, _):
                if let outcome = counted[index] { result.notes.append(.digest(outcome: outcome)) }
                return result
            case .deliver(let d):
                if case .held? = floods[index] { return current.floodHeld(d.record, now: now) }
                return current.deliverResult(d, step: steps[index], now: now)
            }
        }
    }

    public func process(_ input: StageInput, now: Date) -> StageResult {
        var reuse = EventReuse()
        switch decide(input, now: now, reuse: &reuse) {
        case .done(let result), .counted(let result, _): return result
        case .deliver(let d): return deliverResult(d, step: nil, now: now)
        }
    }

    /// The burst step of each delivery that may be coalesced, by input index (one round trip). Bursts are timed on
    /// the stage's clock, like their flushes: a backlog of a conversation's messages read at once is one burst.
    func burstSteps(_ decided: [Decided], now: Date) async -> [Int: BurstStep] {
        guard let bursts else { return [:] }
        let nowMillis = BatchContext.millis(now)
        var asks: [(index: Int, message: BurstMessage)] = []
        for (index, d) in decided.enumerated() {
            guard case .deliver(let delivery) = d else { continue }
            // Most apps coalesce nothing: look at the app before taking copies of the record.
            let app = apps.app(delivery.record.event.appID)
            guard app.coalesce.isOn else { continue }
            let record = delivery.record
            let event = record.event
            guard Coalescing.eligible(event, recipient: record.recipient, app: app) else { continue }
            let held = delivery.wireBytes(burst: nil)
            asks.append(
                (
                    index,
                    BurstMessage(
                        appID: event.appID, user: record.recipient, conversation: event.conversation.id,
                        at: nowMillis, policy: app.coalesce, lane: lane, record: held)
                ))
        }
        return await step(asks, on: bursts)
    }

    /// The flood guard's step of each push still to be shown (not held by its burst) in an app with the guard on,
    /// by input index (one more round trip; docs/behaviour.md §6b). Calls, forced messages and deletions pass.
    func floodSteps(_ decided: [Decided], steps: [Int: BurstStep], now: Date) async -> [Int: BurstStep] {
        guard let bursts else { return [:] }
        let nowMillis = BatchContext.millis(now)
        var asks: [(index: Int, message: BurstMessage)] = []
        for (index, d) in decided.enumerated() {
            guard case .deliver(let delivery) = d else { continue }
            if case .held? = steps[index] { continue }
            let app = apps.app(delivery.record.event.appID)
            guard app.floodGuard.isOn else { continue }
            let record = delivery.record
            let event = record.event
            guard !FloodGuard.exempt(event) else { continue }
            var message = BurstMessage(
                appID: event.appID, user: record.recipient, conversation: "", at: nowMillis, policy: app.coalesce,
                lane: lane,
                record: delivery.wireBytes(burst: nil))
            message.flood = app.floodGuard
            asks.append((index, message))
        }
        return await step(asks, on: bursts)
    }

    /// The steps of `asks` in one ledger round trip, by input index; none when the ledger fails (the batch is then
    /// delivered as it is, never held up).
    func step(_ asks: [(index: Int, message: BurstMessage)], on ledger: any BurstLedger) async -> [Int: BurstStep] {
        if asks.isEmpty { return [:] }
        do {
            let steps = try await ledger.step(asks.map(\.message))
            guard steps.count == asks.count else { return [:] }
            var out: [Int: BurstStep] = [:]
            for (ask, step) in zip(asks, steps) { out[ask.index] = step }
            return out
        } catch {
            onBurstFailure(error)
            return [:]
        }
    }

    /// A push held back by the flood guard: the summary at the next minute shows it.
    func floodHeld(_ record: ResolvedRecord, now: Date) -> StageResult {
        var held = suppressed(record, reason: FloodGuard.heldReason, now: now)
        held.notes.append(.coalesced(outcome: "flood_held"))
        return held
    }

    func decide(_ input: StageInput, now: Date, reuse: inout EventReuse) -> Decided {
        let read: RulesRecord
        do { read = try input.readForRules(reusing: &reuse) } catch { return .done(error.result) }
        let record = read.record
        let event = record.event
        guard apps.isKnown(event.appID) else {
            return .done(.dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID)))
        }
        let decision = Suppression.decide(
            event: event, recipient: record.recipient, state: record.state,
            app: apps.app(event.appID), now: now)
        switch decision {
        case .suppress(let reason):
            let result = suppressed(record, reason: reason.rawValue, now: now)
            if digests != nil, let count = digestCount(read, reason: reason, now: now) {
                return .counted(result, count)
            }
            return .done(result)
        case .deliver(let targets):
            return .deliver(Delivery(read, targets: targets))
        }
    }

    func suppressed(_ record: ResolvedRecord, reason: String, now: Date) -> StageResult {
        let event = record.event
        return StageResult(
            notes: [.suppressed(reason: reason)],
            explain: [
                ExplainEntry(
                    appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                    decision: "suppress", reason: reason, at: BatchContext.millis(now))
            ])
    }

    func deliverResult(_ delivery: Delivery, step: BurstStep?, now: Date) -> StageResult {
        let record = delivery.record
        let event = record.event
        var burst: Int?
        var reason: String?
        switch step {
        case .held?:
            var held = suppressed(record, reason: Coalescing.heldReason, now: now)
            held.notes.append(.coalesced(outcome: "held"))
            return held
        case .first?: burst = 1
        case .update(let count)?:
            burst = count
            reason = Coalescing.updateReason
        case nil: break
        }
        // What the rules did not read goes on as the bytes it came in (when they are in the current format).
        let output = StageOutput(
            topic: deliverableTopic, key: record.recipient, value: delivery.wireBytes(burst: burst))
        return StageResult(
            outputs: [output],
            notes: reason == nil ? [] : [.coalesced(outcome: "update")],
            explain: [
                ExplainEntry(
                    appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                    decision: "deliver", reason: reason, at: BatchContext.millis(now), count: delivery.targets.count)
            ])
    }
}
