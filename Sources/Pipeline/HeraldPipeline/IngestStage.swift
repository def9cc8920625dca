import Foundation
import HeraldCore

/// ingest: `chat.events` -> `herald.ingested` (keyed by conversation id).
/// Invalid events go to the DLQ (`invalid`), events with a number outside its range too (`out_of_range`), events of an app the pipeline file does not list too
/// (`unknown_app`); open and super-group channels are dropped, counted as `channel_type` and written to the
/// explain trail, never dead-lettered.
public struct IngestProcessor: StageProcessor {
    public let stage = "ingest"
    public var ingestedTopic: String
    /// The priority lane's `herald.ingested.priority`; nil puts every event on `ingestedTopic`.
    public var priorityTopic: String?
    /// Each app's priority policy.
    public var apps: AppDirectory
    /// The apps as the pipeline file now says (reloaded on SIGHUP or when the file changes, docs/operations.md
    /// "Reloading"): when set, each batch takes the current directory in place of `apps`.
    public var live: LiveAppDirectory?

    public init(ingestedTopic: String, priorityTopic: String? = nil, apps: AppDirectory = AppDirectory()) {
        self.ingestedTopic = ingestedTopic
        self.priorityTopic = priorityTopic
        self.apps = apps
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.nowMillis
        var current = self
        if let live { current.apps = live.current }
        return batch.map { current.process($0, now: now, context: context) }
    }

    /// One input's result. `context` says whether the explain trail keeps an event's `classified` entry (routine:
    /// only `explain.full_trail` keeps it).
    public func process(_ input: StageInput, now: Int64, context: BatchContext) -> StageResult {
        guard let bytes = input.value else {
            return .dlq(DropReason.invalid.rawValue, "tombstone (no value)")
        }
        let event: ChatEvent
        var warnings: [EventDecodeWarning] = []
        do {
            event = try ChatEvent.decode(bytes, warnings: &warnings)
        } catch {
            return .dlq(error.reason, error.description)
        }
        guard apps.isKnown(event.appID) else {
            return .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID))
        }
        switch Ingest.admit(event) {
        case .admit(let event):
            // The class is decided here, once; it picks the lane every later stage keeps.
            let decision = Priority.classify(event, policy: apps.app(event.appID).priority)
            let topic = decision.lane == .priority ? priorityTopic ?? ingestedTopic : ingestedTopic
            let explained =
                priorityTopic != nil && context.keepsRoutine(appID: event.appID, eventID: event.eventID, user: nil)
            return StageResult(
                outputs: [
                    StageOutput.record(
                        IngestedRecord(event: event, ingestedAt: now),
                        topic: topic, key: event.conversation.id)
                ],
                notes: warnings.map { .inputWarning(field: $0.field) }
                    + (priorityTopic == nil
                        ? [] : [.classified(priorityClass: decision.priorityClass.rawValue, count: 1)]),
                explain: explained
                    ? [
                        ExplainEntry(
                            appID: event.appID, eventID: event.eventID, stage: stage, decision: "classified",
                            reason: "\(decision.priorityClass.rawValue):\(decision.rule)", at: now)
                    ] : [])
        case .drop(.channelType, _):
            let explain = ExplainEntry(
                appID: event.appID, eventID: event.eventID, stage: stage, decision: "drop",
                reason: DropReason.channelType.rawValue, at: now)
            return StageResult(notes: [.suppressed(reason: DropReason.channelType.rawValue)], explain: [explain])
        case .drop(let reason, let detail):
            return .dlq(reason.rawValue, detail)
        }
    }
}
