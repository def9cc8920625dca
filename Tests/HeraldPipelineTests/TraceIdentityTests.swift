import Foundation
import HeraldCore
import HeraldPipeline
import Testing

/// Each stage tells the event and app of its input, for its span's `herald.event_id` and `herald.app_id`.
@Suite struct TraceIdentityTests {
    @Test func everyEventStageTellsTheEventAndAppOfItsInputAndNothingOfBytesThatDoNotDecode() async throws {
        let bytes = try exampleBytes("event-group.json")
        let event = try ChatEvent.decode(bytes)
        let apps = try exampleApps()
        let resolved = ResolvedRecord(event: event, recipient: "u2", state: try exampleState().user("u2"))
        let deliverable = DeliverableRecord(event: event, recipient: "u2", state: UserState(), targets: [])
        let expected = (event.eventID, event.appID)
        let cases: [(any StageProcessor, StageInput)] = [
            (IngestProcessor(ingestedTopic: "herald.ingested"), StageInput(topic: "chat.events", value: bytes)),
            (
                ResolveProcessor(
                    resolvedTopic: "herald.resolved", state: FixtureStateReader(fixtures: ["app1": try exampleState()])),
                StageInput(
                    topic: "herald.ingested", value: StageCodec.encode(IngestedRecord(event: event, ingestedAt: 1)))
            ),
            (
                SuppressProcessor(deliverableTopic: "herald.deliverable", apps: apps),
                StageInput(topic: "herald.resolved", value: StageCodec.encode(resolved))
            ),
            (
                SuppressProcessor(deliverableTopic: "herald.deliverable", apps: apps),
                StageInput(topic: "herald.resolved", value: resolved.jsonBytes())
            ),
            (
                RenderProcessor(outboundTopic: "herald.outbound", apps: apps),
                StageInput(topic: "herald.deliverable", value: StageCodec.encode(deliverable))
            ),
            (sendProcessor(ScriptedTransport([:]), MemoryLedger()), try outbound(token("a"), event: event.eventID)),
        ]
        for (processor, input) in cases {
            let identity = try #require(processor.traceIdentity(of: input), "\(processor.stage)")
            #expect(identity.eventID == expected.0 && identity.appID == expected.1, "\(processor.stage)")
            var garbage = input
            garbage.value = Array("not a record".utf8)
            #expect(processor.traceIdentity(of: garbage) == nil, "\(processor.stage)")
            garbage.value = nil
            #expect(processor.traceIdentity(of: garbage) == nil, "\(processor.stage): a tombstone")
        }
    }
}
