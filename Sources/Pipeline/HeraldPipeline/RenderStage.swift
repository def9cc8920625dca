import Foundation
import HeraldCore

/// render: `herald.deliverable` -> `herald.outbound`, one record per target device (keyed by device token).
/// A render error (no topic for a device, ...) dead-letters the input with the error's code.
public struct RenderProcessor: StageProcessor {
    public let stage = "render"
    public var outboundTopic: String
    /// The apps (templates, catalogs, payload options): replaced when the pipeline file is reloaded.
    public let live: LiveAppDirectory
    public var apps: AppDirectory { live.current }
    /// The events decoded by the last batch, for the next one (`EventReuseCarry`).
    let events = EventReuseCarry()

    public init(outboundTopic: String, apps: AppDirectory) {
        self.init(outboundTopic: outboundTopic, live: LiveAppDirectory(apps))
    }

    public init(outboundTopic: String, live: LiveAppDirectory) {
        self.outboundTopic = outboundTopic
        self.live = live
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.now()
        // One configuration for the whole batch, even when a reload swaps it meanwhile.
        let apps = live.current
        var reuse = events.take()
        var results: [StageResult] = []
        results.reserveCapacity(batch.count)
        for input in batch { results.append(process(input, now: now, apps: apps, reuse: &reuse)) }
        events.keep(reuse)
        return results
    }

    public func process(_ input: StageInput, now: Date) -> StageResult {
        var reuse = EventReuse()
        return process(input, now: now, apps: live.current, reuse: &reuse)
    }

    func process(_ input: StageInput, now: Date, apps: AppDirectory, reuse: inout EventReuse) -> StageResult {
        let record: DeliverableRecord
        do { record = try input.decode(DeliverableRecord.self, reusing: &reuse) } catch { return error.result }
        let event = record.event
        guard apps.isKnown(event.appID) else {
            return .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID))
        }
        do {
            let requests = try Renderer.render(
                event: event, recipient: record.recipient, state: record.state,
                targets: record.targets, app: apps.app(event.appID),
                senderDisplayName: record.senderDisplayName, burst: record.burst, now: now)
            var outputs: [StageOutput] = []
            outputs.reserveCapacity(requests.count)
            for request in requests {
                let outbound = OutboundRecord(
                    eventID: event.eventID, appID: event.appID, recipient: record.recipient,
                    request: request, eventCreatedAt: event.createdAt)
                outputs.append(StageOutput.record(outbound, topic: outboundTopic, key: request.token))
            }
            return StageResult(outputs: outputs)
        } catch {
            return .dlq(
                error.code.rawValue, error.detail,
                explain: [
                    ExplainEntry(
                        appID: event.appID, eventID: event.eventID, user: record.recipient, stage: stage,
                        decision: "error", reason: error.code.rawValue, at: BatchContext.millis(now))
                ])
        }
    }
}
