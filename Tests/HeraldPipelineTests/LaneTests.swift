import Foundation
import HeraldCore
import HeraldPipeline
import Testing

// Priority lanes in the processors: ingest picks the lane, resolve keeps unmentioned members of a mention off the
// priority lane, send drops what expired and marks the priority lane's jobs.

@Suite struct LaneTests {
    let ingest = IngestProcessor(ingestedTopic: "herald.ingested", priorityTopic: "herald.ingested.priority")

    @Test func ingestPutsCallsAndMentionsOnThePriorityLaneAndSaysWhy() async throws {
        let results = await ingest.process(
            [
                StageInput(topic: "chat.events", value: try exampleBytes("event-call.json")),
                StageInput(topic: "chat.events", value: try exampleBytes("event-group.json")),
                event(groupEvent("e-plain")),
            ], context: fixedContext)
        #expect(
            results.map { $0.outputs.first?.topic } == [
                "herald.ingested.priority", "herald.ingested.priority", "herald.ingested",
            ])
        #expect(results.map { $0.explain.first?.reason } == ["urgent:call", "high:mention", "normal:group"])
        #expect(results.allSatisfy { $0.explain.first?.decision == "classified" })
        // Each event counted under its class (herald_classified_total{stage="ingest"}).
        #expect(
            results.map(\.notes) == [
                [.classified(priorityClass: "urgent", count: 1)], [.classified(priorityClass: "high", count: 1)],
                [.classified(priorityClass: "normal", count: 1)],
            ])
    }

    @Test func ingestWithoutAPriorityTopicKeepsOneLane() async throws {
        let plain = IngestProcessor(ingestedTopic: "herald.ingested")
        let results = await plain.process(
            [StageInput(topic: "chat.events", value: try exampleBytes("event-call.json"))],
            context: fixedContext)
        #expect(results[0].outputs.map(\.topic) == ["herald.ingested"])
        #expect(results[0].explain.isEmpty)
        #expect(results[0].notes.isEmpty)
    }

    @Test func perAppPolicyMovesAClass() async throws {
        var policy = PriorityPolicy()
        policy["group"] = .high
        let apps = AppDirectory(apps: ["app1": AppConfig(appID: "app1", priority: policy)])
        let custom = IngestProcessor(
            ingestedTopic: "herald.ingested", priorityTopic: "herald.ingested.priority", apps: apps)
        let results = await custom.process([event(groupEvent("e1"))], context: fixedContext)
        #expect(results[0].outputs.map(\.topic) == ["herald.ingested.priority"])
    }

    @Test func resolveKeepsOnlyMentionedMembersOnThePriorityLane() async throws {
        let reader = FixtureStateReader(fixtures: ["app1": try exampleState()])
        let lanes = (priority: "herald.resolved.priority", bulk: "herald.resolved", apps: AppDirectory())
        let resolve = ResolveProcessor(resolvedTopic: "herald.resolved.priority", state: reader, lanes: lanes)
        let record = IngestedRecord(event: try ChatEvent.decode(try exampleBytes("event-group.json")), ingestedAt: 0)
        let results = await resolve.process(
            [StageInput(topic: "herald.ingested.priority", value: StageCodec.encode(record))],
            context: fixedContext)
        // event-group.json mentions u2; c1's members are u1 (the sender) .. u6.
        let byUser = Dictionary(uniqueKeysWithValues: results[0].outputs.map { ($0.key, $0.topic) })
        #expect(
            byUser == [
                "u2": "herald.resolved.priority", "u3": "herald.resolved", "u4": "herald.resolved",
                "u5": "herald.resolved", "u6": "herald.resolved",
            ])
        // The mentioned member's notification counts as high, the other four as normal.
        #expect(
            results[0].notes == [
                .classified(priorityClass: "high", count: 1), .classified(priorityClass: "normal", count: 4),
            ])
    }

    @Test func resolveMarksAGroupAboveTheThresholdAsBulk() async throws {
        var policy = PriorityPolicy()
        policy.bulkMemberThreshold = 3
        let apps = AppDirectory(apps: ["app1": AppConfig(appID: "app1", priority: policy)])
        let reader = FixtureStateReader(fixtures: ["app1": try exampleState()])
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: reader,
            lanes: (priority: "herald.resolved.priority", bulk: "herald.resolved", apps: apps))
        let record = IngestedRecord(event: try ChatEvent.decode(Array(groupEvent("e1").utf8)), ingestedAt: 0)
        let results = await resolve.process(
            [StageInput(topic: "herald.ingested", value: StageCodec.encode(record))],
            context: fixedContext)
        #expect(results[0].outputs.count == 5 && results[0].outputs.allSatisfy { $0.topic == "herald.resolved" })
        #expect(results[0].explain.first { $0.decision == "fanned_out" }?.reason == "bulk:members")
        #expect(results[0].notes == [.classified(priorityClass: "bulk", count: 5)])

        // A trail that keeps no routine entry: the same outputs and notes, no fan-out entry.
        var compact = fixedContext
        compact.keepsRoutineExplain = { _, _, _ in false }
        let without = await resolve.process(
            [StageInput(topic: "herald.ingested", value: StageCodec.encode(record))], context: compact)
        #expect(without[0].outputs.count == 5 && without[0].notes == results[0].notes)
        #expect(!without[0].explain.contains { $0.decision == "fanned_out" })
    }

    @Test func ingestMakesNoClassEntryTheTrailWouldNotKeep() async throws {
        var context = fixedContext
        // The trail keeps routine entries of event e-kept only.
        context.keepsRoutineExplain = { _, eventID, _ in eventID == "e-kept" }
        let results = await ingest.process(
            [event(groupEvent("e-kept")), event(groupEvent("e-other"))], context: context)
        #expect(results.map { $0.outputs.first?.topic } == ["herald.ingested", "herald.ingested"])
        #expect(results[0].explain.map(\.decision) == ["classified"])
        #expect(results[1].explain.isEmpty)
        // The class is counted either way.
        #expect(
            results.map(\.notes) == [
                [.classified(priorityClass: "normal", count: 1)], [.classified(priorityClass: "normal", count: 1)],
            ])
    }

    func groupEvent(_ id: String) -> String {
        """
        {"event_id": "\(id)", "app_id": "app1", "kind": "message", "created_at": 1732000000000,
         "sender": {"id": "u1", "name": "Cindy"}, "conversation": {"id": "c1", "type": "group"},
         "message": {"id": "m1", "type": "text", "text": "Hi"}}
        """
    }

    func outbound(_ tok: String, expiration: Int64) throws -> StageInput {
        let request = PushRequest(
            token: tok, environment: .production, pushType: .voip, topic: "com.example.chat.voip",
            priority: 10, collapseID: nil, expiration: expiration,
            apnsID: APNsID.derive(eventID: "call", token: tok), payload: Array(#"{"aps":{}}"#.utf8))
        let record = OutboundRecord(eventID: "call", appID: "app1", recipient: "u2", request: request)
        return StageInput(topic: "herald.outbound.priority", value: StageCodec.encode(record))
    }

    @Test func sendDropsWhatExpiredBeforeItCouldBeSent() async throws {
        let transport = ScriptedTransport([:])
        let ledger = MemoryLedger()
        var send = sendProcessor(transport, ledger)
        send.prioritized = true
        // fixedNow is 1_732_000_100 s.
        let results = await send.process(
            [
                try outbound(token("a"), expiration: 1_732_000_099),  // a ring that is over
                try outbound(token("b"), expiration: 1_732_000_130),  // still ringing
                try outbound(token("c"), expiration: 0),  // "try once": never expires here
            ], context: fixedContext)
        #expect(transport.sent == [token("b"), token("c")])
        #expect(results[0].outputs.isEmpty && results[0].deadLetter == nil)
        #expect(results[0].notes == [.suppressed(reason: "expired")])
        #expect(results[0].explain.map(\.decision) == ["drop"] && results[0].explain.first?.reason == "expired")
        #expect(results[1].explain.first?.decision == "delivered")
        #expect(!ledger.pairs.contains(DeliveryPair(eventID: "call", token: token("a"))))
    }
}
