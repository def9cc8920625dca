import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import Testing

// Records of an app the pipeline file does not list are dead-lettered `unknown_app` by whichever stage reads them
// (docs/behaviour.md §2); Herald's own registry records with keys it does not know are invalid.

/// A pipeline file's apps: app1 listed, nothing else.
func listedApps() throws -> AppDirectory {
    let yaml = """
        defaults:
          payload: {profile: compact}
        apps:
          app1:
            credentials:
              - {bundle_id: com.example.chat, environment: production, team_id: ABCDE12345, key_id: KEY1234567, key_file: /nonexistent.p8}
        """
    return try PipelineLoader.load(yaml: yaml).config.apps
}

/// The example group event of `app`.
func groupEvent(app: String) throws -> ChatEvent {
    var event = try ChatEvent.decode(try exampleBytes("event-group.json"))
    event.appID = app
    return event
}

@Suite struct UnknownAppTests {
    let unknown = "no-such-app"

    func expectUnknownApp(_ result: StageResult, _ id: String = "no-such-app") {
        #expect(result.deadLetter?.reason == "unknown_app")
        #expect(result.deadLetter?.detail.contains(id) == true)
        #expect(result.outputs.isEmpty)
    }

    @Test func ingestDeadLettersAnEventOfAnUnlistedAppAndForwardsAListedOne() async throws {
        let ingest = IngestProcessor(ingestedTopic: "herald.ingested", apps: try listedApps())
        var other = try JSONSerialization.jsonObject(with: Data(try exampleBytes("event-group.json"))) as! [String: Any]
        other["app_id"] = unknown
        let results = await ingest.process(
            [
                StageInput(topic: "chat.events", value: Array(try JSONSerialization.data(withJSONObject: other))),
                StageInput(topic: "chat.events", value: try exampleBytes("event-group.json")),
            ], context: fixedContext)
        expectUnknownApp(results[0])
        #expect(results[1].deadLetter == nil && results[1].outputs.count == 1)
    }

    @Test func everyLaterStageDeadLettersARecordOfAnUnlistedApp() async throws {
        let apps = try listedApps()
        let event = try groupEvent(app: unknown)
        let state = UserState(devices: [Device(token: token("a"), bundleID: "com.example.chat")])

        let reader = FixtureStateReader(fixtures: [:])
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: reader,
            lanes: (priority: "herald.resolved.priority", bulk: "herald.resolved", apps: apps))
        let ingested = StageInput(
            topic: "herald.ingested", value: StageCodec.encode(IngestedRecord(event: event, ingestedAt: 1)))
        expectUnknownApp(await resolve.process([ingested], context: fixedContext)[0])
        #expect(reader.roundTrips == 0)  // nothing of an unknown app is looked up

        let suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: apps)
        let resolved = StageInput(
            topic: "herald.resolved",
            value: StageCodec.encode(ResolvedRecord(event: event, recipient: "u2", state: state)))
        expectUnknownApp(await suppress.process([resolved], context: fixedContext)[0])

        let render = RenderProcessor(outboundTopic: "herald.outbound", apps: apps)
        let deliverable = StageInput(
            topic: "herald.deliverable",
            value: StageCodec.encode(
                DeliverableRecord(event: event, recipient: "u2", state: state, targets: state.devices)))
        expectUnknownApp(await render.process([deliverable], context: fixedContext)[0])

        let transport = ScriptedTransport([:])
        let ledger = MemoryLedger()
        var send = sendProcessor(transport, ledger)
        send.apps = apps
        let request = PushRequest(
            token: token("a"), environment: .production, pushType: .alert, topic: "com.example.chat",
            priority: 10, collapseID: nil, expiration: 0,
            apnsID: APNsID.derive(eventID: "e1", token: token("a")), payload: Array(#"{"aps":{}}"#.utf8))
        let foreign = OutboundRecord(eventID: "e1", appID: unknown, recipient: "u2", request: request)
        let results = await send.process(
            [
                StageInput(topic: "herald.outbound", value: StageCodec.encode(foreign)),
                try outbound(token("b")),  // app1: sent
            ], context: fixedContext)
        expectUnknownApp(results[0])
        #expect(transport.sent == [token("b")])  // never sent, never claimed
        #expect(ledger.claimed.isEmpty && ledger.pairs == [DeliveryPair(eventID: "e1", token: token("b"))])
    }

    @Test func registryWritesNothingForAnUnlistedApp() async throws {
        let writer = MemoryRegistry()
        let registry = RegistryProcessor(
            tokenFeedbackTopic: "herald.token-feedback", writer: writer, apps: try listedApps())
        let results = await registry.process(
            [
                StageInput(
                    topic: "herald.registry",
                    value: Array(
                        #"{"op": "set_members", "app_id": "no-such-app", "conversation": "c1", "members": ["u1"]}"#.utf8
                    )),
                StageInput(
                    topic: "herald.token-feedback",
                    value: Array(
                        #"{"app_id": "no-such-app", "user": "u2", "token": "\#(token("a"))", "reason": "Unregistered", "dead_since": 7}"#
                            .utf8)),
                StageInput(
                    topic: "herald.registry",
                    value: Array(
                        #"{"op": "set_members", "app_id": "app1", "conversation": "c1", "members": ["u1"]}"#.utf8)),
            ], context: fixedContext)
        expectUnknownApp(results[0])
        expectUnknownApp(results[1])
        #expect(results[2].deadLetter == nil)
        #expect(writer.applied == [.setMembers] && writer.removed.isEmpty)
    }

    @Test func simulateRefusesAnEventOfAnUnlistedAppAsTheStagesDo() throws {
        var other = try JSONSerialization.jsonObject(with: Data(try exampleBytes("event-group.json"))) as! [String: Any]
        other["app_id"] = unknown
        let bytes = Array(try JSONSerialization.data(withJSONObject: other))
        #expect(throws: FieldError.self) {
            try Simulator.simulate(
                eventBytes: bytes, fixture: try exampleState(), apps: try listedApps(), at: nil, now: fixedNow)
        }
        // Without a pipeline file every app is simulated with the built-in defaults.
        #expect(
            try !Simulator.simulate(
                eventBytes: bytes, fixture: try exampleState(), apps: AppDirectory(), at: nil,
                now: fixedNow
            ).isEmpty)
    }

    @Test func aDirectoryBuiltWithoutAFileServesEveryApp() {
        #expect(AppDirectory().isKnown("anything"))
        #expect(AppDirectory(apps: ["a": AppConfig(appID: "a")], listedOnly: true).isKnown("b") == false)
    }

    @Test func registryAndFeedbackRecordsWithAnUnknownKeyAreInvalid() async throws {
        let writer = MemoryRegistry()
        let registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: writer)
        let bulk = String(repeating: "x", count: 100_000)
        let results = await registry.process(
            [
                // A valid feedback record carrying a key Herald does not write: not applied (it would remove a live token).
                StageInput(
                    topic: "herald.token-feedback",
                    value: Array(
                        #"{"app_id": "app1", "user": "u2", "token": "\#(token("a"))", "reason": "Unregistered", "dead_since": 7, "text": "\#(bulk)"}"#
                            .utf8)),
                // A misspelled flag is not silently ignored.
                StageInput(
                    topic: "herald.registry",
                    value: Array(#"{"op": "unregister_all", "app_id": "app1", "user": "u2", "uniqe": true}"#.utf8)),
            ], context: fixedContext)
        #expect(results.map { $0.deadLetter?.reason } == ["invalid", "invalid"])
        #expect(results[0].deadLetter?.detail == "TokenFeedbackRecord: unknown key text")
        #expect(results[1].deadLetter?.detail == "RegistryRecord: unknown key uniqe")
        #expect(writer.applied.isEmpty && writer.removed.isEmpty)
    }

    @Test func theKnownKeysAreEveryKeyTheRecordsHave() async throws {
        // Every field set: each key the encoder writes must be accepted back.
        let full = RegistryRecord(
            op: .registerDevice, appID: "app1", user: "u2",
            device: Device(token: token("a"), bundleID: "com.example.chat"), unique: true,
            token: token("a"), preferences: Preferences(), online: [token("a")], ttlMs: 5,
            unread: Unread(), conversation: "c1", members: ["u1"],
            patch: PreferencePatch(clear: [.snooze]))
        let feedback = TokenFeedbackRecord(
            appID: "app1", user: "u2", token: token("a"), reason: "Unregistered", deadSince: 7)
        let writer = MemoryRegistry()
        let registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: writer)
        let results = await registry.process(
            [
                StageInput(topic: "herald.registry", value: StageCodec.encode(full)),
                StageInput(topic: "herald.token-feedback", value: StageCodec.encode(feedback)),
            ], context: fixedContext)
        #expect(results.allSatisfy { $0.deadLetter == nil })
        let keys = (try JSONSerialization.jsonObject(with: Data(StageCodec.encode(full))) as! [String: Any]).keys
        #expect(keys.count == 13)
    }
}
