import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import Testing

// A reloaded pipeline file reaches ingest, resolve, suppress and send from their next batch (docs/operations.md
// "Reloading"): an app added to the file is served without a restart, and suppress takes the new user defaults.

@Suite struct ReloadTests {
    /// The listed apps plus `app`, whose user defaults are `trigger: off`.
    func withApp(_ app: String) throws -> AppDirectory {
        var apps = try listedApps()
        apps.apps[app] = AppConfig(
            appID: app, credentials: [APNsCredential(bundleID: "com.example.chat")],
            userDefaults: Preferences(trigger: .off))
        return apps
    }

    @Test func ingestResolveSuppressAndSendTakeTheReloadedApps() async throws {
        let live = LiveAppDirectory(try listedApps())
        let event = try groupEvent(app: "app9")
        let state = UserState(devices: [Device(token: token("a"), bundleID: "com.example.chat")])

        var ingest = IngestProcessor(ingestedTopic: "herald.ingested", apps: try listedApps())
        ingest.live = live
        var resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: FixtureStateReader(fixtures: [:]),
            lanes: (priority: "herald.resolved.priority", bulk: "herald.resolved", apps: try listedApps()))
        resolve.live = live
        var suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: try listedApps())
        suppress.live = live
        var send = sendProcessor(ScriptedTransport([:]), MemoryLedger())
        send.apps = try listedApps()
        send.live = live

        let chat = StageInput(topic: "chat.events", value: event.jsonBytes)
        let ingested = StageInput(
            topic: "herald.ingested", value: StageCodec.encode(IngestedRecord(event: event, ingestedAt: 1)))
        let resolved = StageInput(
            topic: "herald.resolved",
            value: StageCodec.encode(ResolvedRecord(event: event, recipient: "u2", state: state)))
        let request = PushRequest(
            token: token("a"), environment: .production, pushType: .alert, topic: "com.example.chat",
            priority: 10, collapseID: nil, expiration: 0,
            apnsID: APNsID.derive(eventID: "e1", token: token("a")), payload: Array(#"{"aps":{}}"#.utf8))
        let outbound = StageInput(
            topic: "herald.outbound",
            value: StageCodec.encode(
                OutboundRecord(eventID: "e1", appID: "app9", recipient: "u2", request: request)))

        // Before the reload app9 is unknown everywhere.
        #expect(await ingest.process([chat], context: fixedContext)[0].deadLetter?.reason == "unknown_app")
        #expect(await resolve.process([ingested], context: fixedContext)[0].deadLetter?.reason == "unknown_app")
        #expect(await suppress.process([resolved], context: fixedContext)[0].deadLetter?.reason == "unknown_app")
        #expect(await send.process([outbound], context: fixedContext)[0].deadLetter?.reason == "unknown_app")

        live.replace(with: try withApp("app9"))
        #expect(await ingest.process([chat], context: fixedContext)[0].outputs.count == 1)
        #expect(await resolve.process([ingested], context: fixedContext)[0].deadLetter == nil)
        // The reloaded user defaults apply: trigger off for a user who never set one.
        #expect(
            await suppress.process([resolved], context: fixedContext)[0].notes == [.suppressed(reason: "trigger_off")])
        #expect(await send.process([outbound], context: fixedContext)[0].deadLetter == nil)
    }
}
