import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import Testing

// Push on and off per app (`push: off` in the pipeline file, docs/pipeline-config.md): an app that is off keeps its
// place in the file, so its events are admitted (never dead-lettered `unknown_app`) and every recipient is
// suppressed with `app_off`, in the explain trail too; a reloaded file turns it on and off from the next batch.

/// app1 of `listedApps()` with `push:` as given (nil: the key left out).
func appsWithPush(_ push: String?) throws -> AppDirectory {
    let yaml = """
        defaults:
          payload: {profile: compact}
        apps:
          app1:
        \(push.map { "    push: \($0)\n" } ?? "")    credentials:
              - {bundle_id: com.example.chat, environment: production, team_id: ABCDE12345, key_id: KEY1234567, key_file: /nonexistent.p8}
        """
    return try PipelineLoader.load(yaml: yaml).config.apps
}

@Suite struct AppOffTests {
    func resolved(force: Bool = false) throws -> StageInput {
        var event = try groupEvent(app: "app1")
        event.ext.forceNotification = force
        let state = UserState(devices: [Device(token: token("a"), bundleID: "com.example.chat")])
        return StageInput(
            topic: "herald.resolved",
            value: StageCodec.encode(ResolvedRecord(event: event, recipient: "u2", state: state)))
    }

    @Test func thePipelineFileSwitchesPushPerApp() throws {
        #expect(try appsWithPush(nil).app("app1").push)
        #expect(try appsWithPush("on").app("app1").push)
        #expect(try appsWithPush("true").app("app1").push)
        #expect(try !appsWithPush("off").app("app1").push)
        #expect(try !appsWithPush("false").app("app1").push)
        #expect(try appsWithPush("off").isKnown("app1"))
        #expect(throws: ConfigError.self) { try appsWithPush("sometimes") }
    }

    @Test func ingestAdmitsTheEventsOfAnAppThatIsOff() async throws {
        let ingest = IngestProcessor(ingestedTopic: "herald.ingested", apps: try appsWithPush("off"))
        let chat = StageInput(topic: "chat.events", value: try groupEvent(app: "app1").jsonBytes)
        let result = try #require(await ingest.process([chat], context: fixedContext).first)
        #expect(result.deadLetter == nil)
        #expect(result.outputs.count == 1)
    }

    @Test func suppressSuppressesEveryRecipientWithAppOffAndExplainsIt() async throws {
        let suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: try appsWithPush("off"))
        // Not even a forced message gets through.
        for input in [try resolved(), try resolved(force: true)] {
            let result = try #require(await suppress.process([input], context: fixedContext).first)
            #expect(result.deadLetter == nil)
            #expect(result.outputs.isEmpty)
            #expect(result.notes == [.suppressed(reason: "app_off")])
            #expect(result.explain.map(\.reason) == ["app_off"])
            #expect(result.explain.map(\.user) == ["u2"])
        }
    }

    @Test func aReloadedFileTurnsPushOffAndOnAgainFromTheNextBatch() async throws {
        let live = LiveAppDirectory(try appsWithPush(nil))
        var suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: try appsWithPush(nil))
        suppress.live = live
        let input = try resolved()
        #expect(await suppress.process([input], context: fixedContext)[0].outputs.count == 1)
        live.replace(with: try appsWithPush("off"))
        let off = await suppress.process([input], context: fixedContext)[0]
        #expect(off.outputs.isEmpty && off.notes == [.suppressed(reason: "app_off")])
        live.replace(with: try appsWithPush("on"))
        #expect(await suppress.process([input], context: fixedContext)[0].outputs.count == 1)
    }

    @Test func aMarkReadOfAnAppThatIsOffResetsTheCountsAndSendsNoClear() async throws {
        let store = ReadSyncStageTests().store()
        var registry = RegistryProcessor(
            tokenFeedbackTopic: "herald.token-feedback", writer: MemoryRegistry(), apps: try appsWithPush("off"))
        registry.readSync = store
        registry.deliverableTopic = "herald.deliverable"
        let result = try #require(
            await registry.process([ReadSyncStageTests().markRead("u2", at: 1)], context: fixedContext).first)
        #expect(result.notes == [.registry(op: "mark_read", outcome: "applied"), .readSync(outcome: "app_off")])
        #expect(result.outputs.isEmpty)
        #expect(store.asked == 0)
    }
}
