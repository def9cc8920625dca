// suppress with a burst ledger: the first message of a burst goes on as it is, later ones as updates or held back
// (`coalesced`), in one ledger round trip per batch; a failing ledger never holds notifications up.

import Foundation
import HeraldCore
import HeraldPipeline
import Synchronization
import Testing

/// A ledger that always fails (Redis down).
struct BrokenBurstLedger: BurstLedger {
    func step(_ messages: [BurstMessage]) async throws -> [BurstStep] { throw TransientFailure("down") }
    func claimDue(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        throw TransientFailure("down")
    }
    func confirm(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        throw TransientFailure("down")
    }
}

/// What a flush pass produced.
final class Produced: Sendable {
    private let list = Mutex<[FlushOutput]>([])
    var outputs: [StageOutput] { list.withLock { $0.map(\.output) } }
    /// The trace context each output carries (nil: no trace header).
    var traces: [TracePropagation?] { list.withLock { $0.map(\.trace) } }
    @Sendable func add(_ outputs: [FlushOutput]) async throws { list.withLock { $0 += outputs } }
}

/// A memory ledger that keeps the messages it is asked to step.
final class SpyBurstLedger: BurstLedger {
    let inner = MemoryBurstLedger()
    private let seen = Mutex<[BurstMessage]>([])
    var messages: [BurstMessage] { seen.withLock { $0 } }

    func step(_ messages: [BurstMessage]) async throws -> [BurstStep] {
        seen.withLock { $0 += messages }
        return try await inner.step(messages)
    }
    func claimDue(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        try await inner.claimDue(app: app, policy: policy, now: now)
    }
    func confirm(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        try await inner.confirm(app: app, policy: policy, flushed: flushed, now: now)
    }
}

/// A ledger whose one due flush lost its held message's event (its shared copy expired in Redis).
final class LostEventLedger: BurstLedger {
    private let confirmedFlushes = Mutex<[HeldBurst]>([])
    var confirmed: [HeldBurst] { confirmedFlushes.withLock { $0 } }

    func step(_ messages: [BurstMessage]) async throws -> [BurstStep] { messages.map { _ in .first } }
    func claimDue(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        [HeldBurst(user: "u2", conversation: "hike", count: 4, lane: .bulk, record: [], eventMissing: true)]
    }
    func confirm(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        confirmedFlushes.withLock { $0 += flushed }
    }
}

@Suite("Burst coalescing in suppress")
struct BurstStageTests {
    static func app() -> AppDirectory {
        var app = AppConfig(appID: "app1", credentials: [APNsCredential(bundleID: "com.example.chat")])
        app.coalesce = CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 4_000)
        return AppDirectory(apps: ["app1": app], listedOnly: true)
    }

    static func inputs(_ count: Int, mentions: [String] = []) throws -> [StageInput] {
        try (0..<count).map { n in
            let text = """
                {"event_id":"b\(n)","app_id":"app1","kind":"message","created_at":\(1_732_000_000_000 + Int64(n) * 500),
                 "sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"hike","type":"group","name":"Hiking"},
                 "message":{"id":"m\(n)","type":"text","text":"hi \(n)","mentions":\(mentions)}}
                """
            let event = try ChatEvent.decode(Array(text.utf8))
            let record = ResolvedRecord(
                event: event, recipient: "u2",
                state: UserState(devices: [Device(token: String(repeating: "a", count: 64))]))
            return StageInput(topic: "herald.resolved", value: StageCodec.encode(record))
        }
    }

    @Test("20 messages in one batch: the first goes on, 19 are held; the flush shows all 20 once the interval passed")
    func burst() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryBurstLedger()
        suppress.bursts = ledger
        let results = await suppress.process(try Self.inputs(20), context: fixedContext)
        let delivered = try results.enumerated().compactMap { n, r in
            try r.outputs.first.map { (n, try StageCodec.decode(DeliverableRecord.self, from: $0.value)) }
        }
        #expect(delivered.map(\.0) == [0])
        #expect(delivered.map(\.1.burst) == [1])
        #expect(results[1].notes == [.suppressed(reason: "coalesced"), .coalesced(outcome: "held")])
        #expect(results[1].explain.first?.decision == "suppress" && results[1].explain.first?.reason == "coalesced")

        let flusher = BurstFlusher(ledger: ledger) { lane in "deliverable.\(lane.rawValue)" }
        let produced = Produced()
        let start = BatchContext.millis(fixedNow)
        // Not due before the update interval (4 s) has passed.
        let early = try await flusher.pass(apps: Self.app(), now: start + 3_999, produce: produced.add)
        #expect(early.flushed == 0 && produced.outputs.isEmpty)
        let pass = try await flusher.pass(apps: Self.app(), now: start + 4_000, produce: produced.add)
        #expect(pass.flushed == 1)
        let outputs = produced.outputs
        #expect(outputs.map(\.topic) == ["deliverable.bulk"] && outputs.map(\.key) == ["u2"])
        let flushed = try StageCodec.decode(DeliverableRecord.self, from: outputs[0].value)
        #expect(flushed.burst == 20 && flushed.event.eventID == "b19" && flushed.targets.count == 1)
        #expect(pass.explain.map(\.reason) == ["coalesced_flush"] && pass.explain.map(\.eventID) == ["b19"])
        // Confirmed: nothing is flushed twice; the burst ends when the window passes.
        #expect(try await flusher.pass(apps: Self.app(), now: start + 8_000, produce: produced.add).flushed == 0)
        #expect(
            try await ledger.claimDue(app: "app1", policy: Self.app().app("app1").coalesce, now: start + 20_000).isEmpty
        )
        let next = await suppress.process(
            try Self.inputs(1), context: BatchContext(now: { fixedNow.addingTimeInterval(21) }))
        #expect(try StageCodec.decode(DeliverableRecord.self, from: next[0].outputs[0].value).burst == 1)
    }

    @Test("messages held when push is turned off are dropped with their flush, explained app_off")
    func flushOfAnAppTurnedOff() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryBurstLedger()
        suppress.bursts = ledger
        _ = await suppress.process(try Self.inputs(3), context: fixedContext)
        var off = Self.app()
        off.apps["app1"]?.push = false
        let flusher = BurstFlusher(ledger: ledger) { _ in "d" }
        let produced = Produced()
        let start = BatchContext.millis(fixedNow)
        let pass = try await flusher.pass(apps: off, now: start + 4_000, produce: produced.add)
        #expect(pass.flushed == 0 && produced.outputs.isEmpty)
        #expect(pass.explain.map(\.reason) == ["app_off"] && pass.explain.map(\.decision) == ["suppress"])
        // Confirmed: not taken again once push is back on.
        #expect(try await flusher.pass(apps: Self.app(), now: start + 14_000, produce: produced.add).flushed == 0)
    }

    @Test("a flush whose produce fails stays leased and is taken again after the lease")
    func failedProduce() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryBurstLedger()
        suppress.bursts = ledger
        _ = await suppress.process(try Self.inputs(3), context: fixedContext)
        let flusher = BurstFlusher(ledger: ledger) { _ in "d" }
        let start = BatchContext.millis(fixedNow)
        await #expect(throws: TransientFailure.self) {
            _ = try await flusher.pass(apps: Self.app(), now: start + 4_000) { _ in throw TransientFailure("broker") }
        }
        let produced = Produced()
        #expect(try await flusher.pass(apps: Self.app(), now: start + 5_000, produce: produced.add).flushed == 0)
        #expect(try await flusher.pass(apps: Self.app(), now: start + 14_000, produce: produced.add).flushed == 1)
        #expect(try StageCodec.decode(DeliverableRecord.self, from: produced.outputs[0].value).burst == 3)
    }

    @Test("mentions are never held back; without a ledger nothing is coalesced; a failing ledger delivers all")
    func neverHeld() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        suppress.bursts = MemoryBurstLedger()
        let mentioned = await suppress.process(try Self.inputs(5, mentions: ["u2"]), context: fixedContext)
        #expect(mentioned.allSatisfy { $0.outputs.count == 1 })
        let plain = await SuppressProcessor(deliverableTopic: "d", apps: Self.app()).process(
            try Self.inputs(5), context: fixedContext)
        #expect(
            try plain.allSatisfy {
                try StageCodec.decode(DeliverableRecord.self, from: $0.outputs[0].value).burst == nil
            })
        suppress.bursts = BrokenBurstLedger()
        let broken = await suppress.process(try Self.inputs(5), context: fixedContext)
        #expect(broken.allSatisfy { $0.outputs.count == 1 })
    }

    @Test(
        "a record suppress holds shares its event's bytes with every recipient of the event; the rest is the recipient's own"
    )
    func sharedBytes() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = SpyBurstLedger()
        suppress.bursts = ledger
        // Two messages to three recipients, as resolve writes them (binary: suppress forwards what it did not read).
        let recipients = ["u2", "u3", "u4"]
        let events = try Self.inputs(2).map {
            try StageCodec.decode(ResolvedRecord.self, from: $0.value ?? []).event
        }
        let inputs = events.flatMap { event in
            recipients.enumerated().map { n, user in
                let record = ResolvedRecord(
                    event: event, recipient: user,
                    state: UserState(devices: [Device(token: String(repeating: "\(n + 1)", count: 64))]))
                return StageInput(topic: "herald.resolved", value: StageCodec.encode(record))
            }
        }
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(results.map(\.outputs.count) == [1, 1, 1, 0, 0, 0])
        let messages = ledger.messages
        #expect(messages.count == 6)
        for (event, group) in zip(events, [messages[0..<3], messages[3..<6]]) {
            let shared = try group.map { m in Array(m.record[try #require(m.sharedBytes)]) }
            #expect(Set(shared).count == 1, "one event, one set of bytes")
            #expect(group.allSatisfy { $0.sharedBytes?.lowerBound == 4 })
            let rest = group.map { m in Array(m.record[..<4]) + Array(m.record[m.sharedBytes!.upperBound...]) }
            #expect(Set(rest).count == 3, "each recipient's own")
            // Put together again, a record is what it was: its event and the recipient's part.
            for (m, user) in zip(group, recipients) {
                let record = try StageCodec.decode(DeliverableRecord.self, from: m.record)
                #expect(record.event == event && record.recipient == user)
            }
        }
    }

    @Test("a flush whose held event is gone is not produced: counted as missing and confirmed, so its burst goes on")
    func missingEvent() async throws {
        let ledger = LostEventLedger()
        let flusher = BurstFlusher(ledger: ledger) { _ in "d" }
        let produced = Produced()
        let pass = try await flusher.pass(apps: Self.app(), now: 1_732_000_000_000, produce: produced.add)
        #expect(pass.flushed == 0 && produced.outputs.isEmpty && pass.explain.isEmpty && pass.invalid.isEmpty)
        #expect(pass.missing == [BurstFlusher.Missing(app: "app1", user: "u2", conversation: "hike", count: 4)])
        #expect(ledger.confirmed.map(\.count) == [4] && ledger.confirmed.map(\.user) == ["u2"])
    }
}

@Suite("Flood guard in suppress")
struct FloodStageTests {
    static func app() -> AppDirectory {
        var app = AppConfig(appID: "app1", credentials: [APNsCredential(bundleID: "com.example.chat")])
        app.floodGuard = FloodPolicy(perMinute: 3)
        return AppDirectory(apps: ["app1": app], listedOnly: true)
    }

    /// Direct messages from different senders to u2, then a call.
    static func inputs(_ count: Int) throws -> [StageInput] {
        let messages = try (0..<count).map { n in
            let text = """
                {"event_id":"d\(n)","app_id":"app1","kind":"message","created_at":1732000000000,
                 "sender":{"id":"s\(n)","name":"Sender \(n)"},"conversation":{"id":"dm\(n)","type":"direct"},
                 "message":{"id":"m\(n)","type":"text","text":"hi \(n)"}}
                """
            return try ChatEvent.decode(Array(text.utf8))
        }
        let call = try ChatEvent.decode(
            Array(
                #"""
                {"event_id":"call1","app_id":"app1","kind":"call","created_at":1732000000000,
                 "sender":{"id":"s9","name":"Dana"},"conversation":{"id":"dm9","type":"direct"},
                 "call":{"action":"initiated","session_id":"x1","type":"audio"}}
                """#.utf8))
        return (messages + [call]).map { event in
            let record = ResolvedRecord(
                event: event, recipient: "u2",
                state: UserState(devices: [Device(token: String(repeating: "a", count: 64))]))
            return StageInput(topic: "herald.resolved", value: StageCodec.encode(record))
        }
    }

    @Test(
        "3 a minute: 3 go on, the rest are held (flood_guard), a call still rings; a summary of the held opens the next minute"
    )
    func flood() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.app())
        let ledger = MemoryBurstLedger()
        suppress.bursts = ledger
        let results = await suppress.process(try Self.inputs(7), context: fixedContext)
        #expect(results.map(\.outputs.count) == [1, 1, 1, 0, 0, 0, 0, 1], "the call (last) is never held")
        #expect(results[3].notes == [.suppressed(reason: "flood_guard"), .coalesced(outcome: "flood_held")])
        #expect(results[6].explain.first?.decision == "suppress" && results[6].explain.first?.reason == "flood_guard")

        let produced = Produced()
        let flusher = BurstFlusher(ledger: ledger) { _ in "d" }
        let now = BatchContext.millis(fixedNow)
        let nextMinute = now - now % 60_000 + 60_000
        #expect(try await flusher.pass(apps: Self.app(), now: nextMinute - 1, produce: produced.add).flushed == 0)
        let pass = try await flusher.pass(apps: Self.app(), now: nextMinute, produce: produced.add)
        #expect(pass.flushed == 1 && pass.summaries == 1)
        #expect(pass.explain.map(\.reason) == ["flood_summary"])
        let summary = try StageCodec.decode(DeliverableRecord.self, from: produced.outputs[0].value)
        #expect(summary.burst == -4 && summary.event.eventID == "d6")
        #expect(try await flusher.pass(apps: Self.app(), now: nextMinute + 1_000, produce: produced.add).flushed == 0)
    }
}

@Suite("The flush timer's pace")
struct FlushPaceTests {
    @Test(
        "fast while a held message may wait for its flush or flushes were due, slow otherwise",
        arguments: [
            // (coalescing update ms, flood guard, last hold ms before now (nil: never), found due, fast)
            (4_000, false, nil, false, false),
            (4_000, false, nil, true, true),
            (4_000, false, 100, false, true),
            (4_000, false, 4_900, false, true),
            (4_000, false, 5_100, false, false),
            (4_000, false, 60_000, true, true),
            (0, true, 30_000, false, true),
            (0, true, 61_500, false, false),
            (2_000, true, 45_000, false, true),
        ] as [(Int64, Bool, Int64?, Bool, Bool)])
    func pace(update: Int64, flood: Bool, heldAgo: Int64?, foundDue: Bool, fast: Bool) {
        var app = AppConfig(appID: "app1")
        if update > 0 { app.coalesce = CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: update) }
        if flood { app.floodGuard = FloodPolicy(perMinute: 3) }
        let now: Int64 = 1_732_000_000_000
        let wait = BurstFlusher.nextWait(
            lastHeldAt: heldAgo.map { now - $0 }, foundDue: foundDue, now: now,
            apps: AppDirectory(apps: ["app1": app], listedOnly: true))
        #expect(wait == (fast ? BurstFlusher.interval : BurstFlusher.idleInterval))
    }
}
