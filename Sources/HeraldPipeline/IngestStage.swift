import Foundation
import HeraldCore

/// ingest: `chat.events` -> `herald.ingested` (keyed by conversation id).
/// Invalid events go to the DLQ (`invalid`); open and super-group channels are dropped, counted as
/// `channel_type` and written to the explain trail, never dead-lettered.
public struct IngestProcessor: StageProcessor {
    public let stage = "ingest"
    public var ingestedTopic: String

    public init(ingestedTopic: String) {
        self.ingestedTopic = ingestedTopic
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.nowMillis
        return batch.map { process($0, now: now) }
    }

    public func process(_ input: StageInput, now: Int64) -> StageResult {
        guard let bytes = input.value else {
            return .dlq(DropReason.invalid.rawValue, "tombstone (no value)")
        }
        let event: ChatEvent
        var warnings: [EventDecodeWarning] = []
        do {
            event = try ChatEvent.decode(bytes, warnings: &warnings)
        } catch {
            return .dlq(DropReason.invalid.rawValue, error.description)
        }
        switch Ingest.admit(event) {
        case .admit(let event):
            return StageResult(outputs: [StageOutput.record(IngestedRecord(event: event, ingestedAt: now),
                                                            topic: ingestedTopic, key: event.conversation.id)],
                               notes: warnings.map { .inputWarning(field: $0.field) })
        case .drop(.channelType, _):
            let explain = ExplainEntry(appID: event.appID, eventID: event.eventID, stage: stage, decision: "drop",
                                       reason: DropReason.channelType.rawValue, at: now)
            return StageResult(notes: [.suppressed(reason: DropReason.channelType.rawValue)], explain: [explain])
        case .drop(.invalid, let detail):
            return .dlq(DropReason.invalid.rawValue, detail)
        }
    }
}
