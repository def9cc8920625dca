import Foundation
import HeraldCore

/// suppress: `herald.resolved` -> `herald.deliverable` (keyed by recipient user id).
/// Applies the rules of docs/behaviour.md §6 (`Suppression.decide`, at the event's time); every suppression is
/// counted by reason and written to the explain trail, and so is every decision to deliver.
public struct SuppressProcessor: StageProcessor {
    public let stage = "suppress"
    public var deliverableTopic: String
    public var apps: AppDirectory
    /// The apps as the pipeline file now says (reloaded on SIGHUP or when the file changes, docs/operations.md
    /// "Reloading"): when set, each batch takes the current directory in place of `apps`.
    public var live: LiveAppDirectory?

    public init(deliverableTopic: String, apps: AppDirectory) {
        self.deliverableTopic = deliverableTopic
        self.apps = apps
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.now()
        var current = self
        if let live { current.apps = live.current }
        var reuse = EventReuse()
        var results: [StageResult] = []
        results.reserveCapacity(batch.count)
        for input in batch { results.append(current.process(input, now: now, reuse: &reuse)) }
        return results
    }

    public func process(_ input: StageInput, now: Date) -> StageResult {
        var reuse = EventReuse()
        return process(input, now: now, reuse: &reuse)
    }

    func process(_ input: StageInput, now: Date, reuse: inout EventReuse) -> StageResult {
        let record: ResolvedRecord
        do { record = try input.decode(ResolvedRecord.self, reusing: &reuse) } catch { return error.result }
        let event = record.event
        guard apps.isKnown(event.appID) else {
            return .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID))
        }
        let at = BatchContext.millis(now)
        let decision = Suppression.decide(
            event: event, recipient: record.recipient, state: record.state,
            app: apps.app(event.appID), now: now)
        switch decision {
        case .suppress(let reason):
            return StageResult(
                notes: [.suppressed(reason: reason.rawValue)],
                explain: [
                    ExplainEntry(
                        appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                        decision: "suppress", reason: reason.rawValue, at: at)
                ])
        case .deliver(let targets):
            // Rendering reads preferences and unread counts; the devices it needs are the targets.
            var state = record.state
            state.devices = []
            state.online = []
            let deliverable = DeliverableRecord(
                event: event, recipient: record.recipient, state: state,
                targets: targets, senderDisplayName: record.senderDisplayName)
            // The event goes on as the bytes it came in (when they are in the current format), not encoded again.
            let output = StageOutput(
                topic: deliverableTopic, key: record.recipient,
                value: deliverable.wireBytes(eventBytes: reuse.lastEventBytes))
            return StageResult(
                outputs: [output],
                explain: [
                    ExplainEntry(
                        appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                        decision: "deliver", at: at, count: targets.count)
                ])
        }
    }
}
