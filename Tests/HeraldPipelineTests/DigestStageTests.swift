// suppress with a digest ledger (docs/behaviour.md §6d): messages suppressed by Do Not Disturb or a snooze are
// counted once per (event, user), and the timer sends one digest per user when the window ends, naming the
// conversations not read meanwhile.

import Foundation
import HeraldCore
import HeraldPipeline
import Synchronization
import Testing

/// A digest ledger that always fails (Redis down).
struct BrokenDigestLedger: DigestLedger {
    func count(_ counts: [DigestCount], now: Int64) async throws -> [Bool] { throw TransientFailure("down") }
    func claimDue(app: String, now: Int64) async throws -> [DueDigest] { throw TransientFailure("down") }
    func confirm(app: String, _ digest: DueDigest) async throws { throw TransientFailure("down") }
    func reschedule(
        app: String, _ digest: DueDigest, window: DigestSummary.Window, end: Int64, deadlineMilliseconds: Int64,
        now: Int64
    ) async throws { throw TransientFailure("down") }
    func users(app: String, _ users: [String], now: Int64) async throws -> [String: UserState] {
        throw TransientFailure("down")
    }
}

@Suite("Digest in suppress")
struct DigestStageTests {
    /// 2024-11-19T07:06:40Z.
    static let t0: Int64 = 1_732_000_000_000
    /// Do Not Disturb 07:00-07:10 UTC ends 200 s after `t0`.
    static let end = t0 + 200_000

    static func app(_ policy: DigestPolicy = DigestPolicy(enabled: true)) -> AppDirectory {
        var app = AppConfig(appID: "app1", credentials: [APNsCredential(bundleID: "com.example.chat")])
        app.digest = policy
        return AppDirectory(apps: ["app1": app], listedOnly: true)
    }

    static func state(dnd: Bool = true, snooze: Snooze? = nil) -> UserState {
        var prefs = Preferences()
        if dnd { prefs.dnd = DoNotDisturb(start: ClockTime("07:00")!, end: ClockTime("07:10")!) }
        prefs.snooze = snooze
        return UserState(devices: [Device(token: String(repeating: "a", count: 64))], preferences: prefs)
    }

    /// Five messages in two conversations (three in Hiking, two in Work) to each of `users`.
    static func inputs(to users: [String], state: UserState = state()) throws -> [StageInput] {
        let conversations = [
            ("hike", "Hiking"), ("hike", "Hiking"), ("work", "Work"), ("hike", "Hiking"), ("work", "Work"),
        ]
        return try conversations.enumerated().flatMap { n, c in
            let text = """
                {"event_id":"d\(n)","app_id":"app1","kind":"message","created_at":\(t0 + Int64(n) * 1_000),
                 "sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"\(c.0)","type":"group","name":"\(c.1)"},
                 "message":{"id":"m\(n)","type":"text","text":"secret \(n)"}}
                """
            let event = try ChatEvent.decode(Array(text.utf8))
            return users.map { user in
                StageInput(
                    topic: "herald.resolved",
                    value: StageCodec.encode(ResolvedRecord(event: event, recipient: user, state: state)))
            }
        }
    }

    @Test(
        "5 messages in 2 conversations in DND: counted once, one digest at the window's end; a read conversation is left out"
    )
    func digest() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryDigestLedger()
        suppress.digests = ledger
        let inputs = try Self.inputs(to: ["u2", "u3"])
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(results.allSatisfy { $0.outputs.isEmpty })
        #expect(results.allSatisfy { $0.notes == [.suppressed(reason: "dnd"), .digest(outcome: "counted")] })
        // A replay of the batch counts nothing twice.
        let replay = await suppress.process(inputs, context: fixedContext)
        #expect(replay.allSatisfy { $0.notes == [.suppressed(reason: "dnd"), .digest(outcome: "replayed")] })
        // u3 read Hiking meanwhile.
        ledger.markRead(app: "app1", user: "u3", conversation: "hike")
        ledger.states.withLock { $0 = ["u2": Self.state(), "u3": Self.state()] }

        let flusher = DigestFlusher(ledger: ledger) { lane in "deliverable.\(lane.rawValue)" }
        let produced = Produced()
        let early = try await flusher.pass(apps: Self.app(), now: Self.end - 1, produce: produced.add)
        #expect(early.sent == 0 && produced.outputs.isEmpty)
        let pass = try await flusher.pass(apps: Self.app(), now: Self.end, produce: produced.add)
        #expect(pass.sent == 2 && pass.outcomes == ["sent": 2])
        let records = try produced.outputs.map { try StageCodec.decode(DeliverableRecord.self, from: $0.value) }
        #expect(produced.outputs.map(\.topic) == ["deliverable.bulk", "deliverable.bulk"])
        let u2 = try #require(records.first { $0.recipient == "u2" })
        #expect(
            u2.event.digest
                == DigestSummary(window: .dnd, messages: 5, conversations: 2, names: ["Hiking", "Work"], sound: false))
        #expect(u2.event.eventID == Digest.eventID(user: "u2", end: Self.end) && u2.targets.count == 1)
        let u3 = try #require(records.first { $0.recipient == "u3" })
        #expect(u3.event.digest == DigestSummary(window: .dnd, messages: 2, conversations: 1, names: ["Work"]))
        #expect(u3.event.conversation.id == "work")
        #expect(
            pass.explain.map(\.reason) == ["digest", "digest"] && pass.explain.allSatisfy { $0.decision == "deliver" })
        // Rendered: the text, no message text.
        let requests = try Renderer.render(
            event: u3.event, recipient: "u3", state: u3.state, targets: u3.targets,
            app: Self.app().app("app1"), now: fixedNow)
        #expect(requests[0].payloadString.contains("2 new messages in Work while Do Not Disturb was on"))
        #expect(!requests[0].payloadString.contains("secret"))
        // Confirmed: never sent twice.
        let again = try await flusher.pass(apps: Self.app(), now: Self.end + 60_000, produce: produced.add)
        #expect(again.sent == 0 && produced.outputs.count == 2)
    }

    @Test("read everything, or the digest off: nothing is sent")
    func nothing() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryDigestLedger()
        suppress.digests = ledger
        _ = await suppress.process(try Self.inputs(to: ["u2"]), context: fixedContext)
        ledger.markRead(app: "app1", user: "u2", conversation: nil)
        let produced = Produced()
        let flusher = DigestFlusher(ledger: ledger) { _ in "d" }
        let pass = try await flusher.pass(apps: Self.app(), now: Self.end, produce: produced.add)
        #expect(pass.outcomes == ["nothing": 1] && produced.outputs.isEmpty)
        // An app without the digest counts nothing.
        var off = SuppressProcessor(deliverableTopic: "d", apps: Self.app(DigestPolicy()))
        off.digests = ledger
        let results = await off.process(try Self.inputs(to: ["u4"]), context: fixedContext)
        #expect(results.allSatisfy { $0.notes == [.suppressed(reason: "dnd")] })
        #expect(try await ledger.claimDue(app: "app1", now: Self.end + 3_600_000).isEmpty)
    }

    @Test("a snooze extended before its end: the digest waits for the new end; past the deadline it is dropped")
    func rescheduleAndDeadline() async throws {
        let snooze = Snooze(start: Self.t0 - 1_000, end: Self.t0 + 60_000)
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryDigestLedger()
        suppress.digests = ledger
        let results = await suppress.process(
            try Self.inputs(to: ["u2"], state: Self.state(dnd: false, snooze: snooze)), context: fixedContext)
        #expect(results.allSatisfy { $0.notes == [.suppressed(reason: "snoozed"), .digest(outcome: "counted")] })
        // The user extended the snooze by an hour.
        let extended = Snooze(start: Self.t0 - 1_000, end: Self.t0 + 3_660_000)
        ledger.states.withLock { $0 = ["u2": Self.state(dnd: false, snooze: extended)] }
        let flusher = DigestFlusher(ledger: ledger) { _ in "d" }
        let produced = Produced()
        let first = try await flusher.pass(apps: Self.app(), now: Self.t0 + 60_000, produce: produced.add)
        #expect(first.outcomes == ["rescheduled": 1] && produced.outputs.isEmpty)
        #expect(try await flusher.pass(apps: Self.app(), now: Self.t0 + 3_659_999, produce: produced.add).sent == 0)
        // Found more than `deadline_seconds` after the new end (no suppress ran meanwhile): dropped and explained.
        let late = try await flusher.pass(
            apps: Self.app(DigestPolicy(enabled: true, deadlineMilliseconds: 60_000)), now: Self.t0 + 3_720_001,
            produce: produced.add)
        #expect(late.outcomes == ["expired": 1] && produced.outputs.isEmpty)
        #expect(late.explain.map(\.reason) == [Digest.expiredReason])
    }

    @Test("a failing ledger: the messages stay suppressed, counted as count_failed")
    func brokenLedger() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        suppress.digests = BrokenDigestLedger()
        let failures = Mutex(0)
        suppress.onDigestFailure = { _ in failures.withLock { $0 += 1 } }
        let results = await suppress.process(try Self.inputs(to: ["u2"]), context: fixedContext)
        #expect(results.allSatisfy { $0.outputs.isEmpty })
        #expect(results.allSatisfy { $0.notes == [.suppressed(reason: "dnd"), .digest(outcome: "count_failed")] })
        #expect(failures.withLock { $0 } == 1)
    }

    @Test("a digest whose produce failed (a crash) is taken again after its lease, as the same event, byte for byte")
    func takenAgain() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryDigestLedger()
        suppress.digests = ledger
        _ = await suppress.process(try Self.inputs(to: ["u2"]), context: fixedContext)
        ledger.states.withLock { $0 = ["u2": Self.state()] }
        let flusher = DigestFlusher(ledger: ledger) { _ in "d" }
        let lost = Produced()
        await #expect(throws: TransientFailure.self) {
            _ = try await flusher.pass(apps: Self.app(), now: Self.end) { outputs in
                try await lost.add(outputs)
                throw TransientFailure("the broker did not answer")
            }
        }
        // Leased: another process does not take it before the lease passes.
        let produced = Produced()
        #expect(try await flusher.pass(apps: Self.app(), now: Self.end + 5_000, produce: produced.add).sent == 0)
        let again = try await flusher.pass(apps: Self.app(), now: Self.end + 10_001, produce: produced.add)
        #expect(again.sent == 1)
        // The same event id and bytes: send's delivery records skip whichever copy comes second.
        #expect(lost.outputs.count == 1 && produced.outputs.map(\.value) == lost.outputs.map(\.value))
        let record = try StageCodec.decode(DeliverableRecord.self, from: produced.outputs[0].value)
        #expect(record.event.eventID == Digest.eventID(user: "u2", end: Self.end))
        #expect(record.event.createdAt == Self.end)
        #expect(try await flusher.pass(apps: Self.app(), now: Self.end + 30_000, produce: produced.add).sent == 0)
    }
}
