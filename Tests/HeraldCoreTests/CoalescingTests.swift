// Burst coalescing (docs/behaviour.md §6a): which pushes may be coalesced, the burst state machine, and what an
// update looks like on every provider.

import Foundation
import HeraldCore
import Testing

struct EligibleRow: Sendable, CustomTestStringConvertible {
    var name: String
    var json: String
    var eligible: Bool
    var testDescription: String { name }
}

let eligibleRows: [EligibleRow] = [
    EligibleRow(name: "plain group message", json: messageJSON(), eligible: true),
    EligibleRow(name: "direct message", json: messageJSON(type: "direct"), eligible: false),
    EligibleRow(name: "mention of the recipient", json: messageJSON(mentions: ["u2"]), eligible: false),
    EligibleRow(name: "mention of someone else", json: messageJSON(mentions: ["u9"]), eligible: true),
    EligibleRow(name: "channel mention", json: messageJSON(mentionType: "channel"), eligible: false),
    EligibleRow(
        name: "forced message", json: messageJSON(ext: #"{"em_force_notification":true}"#), eligible: false),
    EligibleRow(name: "admin broadcast", json: messageJSON(messageType: "admin"), eligible: false),
    EligibleRow(name: "call", json: callJSON("initiated", conversation: "group"), eligible: false),
]

let burstApp: AppConfig = {
    var app = parityApp(.compact)
    app.coalesce = CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 4_000)
    return app
}()

@Suite("Burst coalescing")
struct CoalescingTests {
    @Test("only plain group messages that do not mention the recipient are coalesced", arguments: eligibleRows)
    func eligibility(row: EligibleRow) throws {
        let e = try event(row.json)
        #expect(Coalescing.eligible(e, recipient: "u2", app: burstApp) == row.eligible)
        #expect(!Coalescing.eligible(e, recipient: "u2", app: parityApp(.compact)), "off by default")
    }

    @Test("a burst through messages and the flush timer", arguments: burstRows)
    func stateMachine(row: BurstRow) {
        #expect(runBurst(row) == row.outcome)
    }

    @Test("a flush taken before more messages were held leaves them held for the next flush")
    func flushTakenEarly() {
        let policy = CoalescePolicy(windowMilliseconds: 10_000)
        var state = BurstState(count: 1, shown: 1, shownAt: 0, lastAt: 0, pending: false)
        for at in [1_000, 2_000] as [Int64] { state = Coalescing.step(state, at: at, policy: policy).1 }
        #expect(Coalescing.flush(state, now: 5_000, policy: policy) == .show(count: 3))
        // One more message is held between the claim and the confirmation.
        state = Coalescing.step(state, at: 5_100, policy: policy).1
        #expect(state.count == 4 && state.pending)
        state = Coalescing.flushed(state, count: 3, now: 5_200)
        #expect(state == BurstState(count: 4, shown: 3, shownAt: 5_200, lastAt: 5_100, pending: true))
        #expect(Coalescing.due(state, policy: policy) == 10_200)
        // A stale confirmation (a lower count than shown) changes nothing.
        #expect(Coalescing.flushed(state, count: 2, now: 6_000) == state)
        #expect(CoalescePolicy(windowMilliseconds: 4_000).updateMilliseconds == 2_000)
        #expect(CoalescePolicy(windowMilliseconds: 4_000, updateMilliseconds: 9_000).updateMilliseconds == 4_000)
    }

    @Test("an update replaces the first notification on every provider: same collapse id, no sound, the count")
    func updatePayloads() throws {
        let e = try event(messageJSON())
        let devices = [device(), androidDevice, hookUserDevice]
        let state = user(devices: devices)
        let first = try Renderer.render(
            event: e, recipient: "u2", state: state, targets: devices, app: burstApp, burst: 1, now: now0)
        let update = try Renderer.render(
            event: e, recipient: "u2", state: state, targets: devices, app: burstApp, burst: 3, now: now0)
        let apnsFirst = try payload(first[0]), apnsUpdate = try payload(update[0])
        #expect(first[0].collapseID == "b-c1" && update[0].collapseID == "b-c1")
        #expect(apnsFirst["aps"]?["sound"] == .string("default"))
        #expect(apnsFirst["aps"]?["alert"]?["body"] == .string("Cindy: Bye!"))
        #expect(apnsUpdate["aps"]?["sound"] == nil)
        #expect(apnsUpdate["aps"]?["alert"]?["body"] == .string("3 new messages in Hiking"))
        let fcm = try payload(update[1])["message"]
        #expect(update[1].collapseID == "b-c1")
        #expect(fcm?["android"]?["collapse_key"] == .string("b-c1"))
        #expect(fcm?["android"]?["notification"]?["tag"] == .string("b-c1"))
        #expect(fcm?["android"]?["notification"]?["sound"] == nil)
        #expect(fcm?["notification"]?["body"] == .string("3 new messages in Hiking"))
        #expect(fcm?["apns"]?["payload"]?["aps"]?["sound"] == nil)
        let hook = try payload(update[2])
        #expect(hook["data"]?["notificationDetails"]?["body"] == .string("3 new messages in Hiking"))
        for r in update { #expect(duplicateKey(try payload(r)) == nil) }
    }

    @Test("the update text exists in every shipped language and says the count")
    func updateTextEverywhere() throws {
        let e = try event(messageJSON())
        for language in ["en", "zh", "ko", "fr", "de", "es", "ja"] {
            let state = user(prefs: Preferences(languages: [language]))
            let r = try Renderer.render(
                event: e, recipient: "u2", state: state, targets: [device()], app: burstApp, burst: 12, now: now0)
            let body = try payload(r[0])["aps"]?["alert"]?["body"]?.stringValue ?? ""
            #expect(body.contains("12") && body.contains("Hiking"), "\(language): \(body)")
            let unnamed = try event(messageJSON(convName: ""))
            let r2 = try Renderer.render(
                event: unnamed, recipient: "u2", state: state, targets: [device()], app: burstApp, burst: 12, now: now0)
            let text = try payload(r2[0])["aps"]?["alert"]?["body"]?.stringValue ?? ""
            #expect(text.contains("12") && !text.contains("{"), "\(language): \(text)")
        }
    }

    @Test("simulate marks a push that may be coalesced and shows the update of the Nth message with --burst")
    func simulate() throws {
        let fixture = StateFixture(users: ["u2": user(), "u3": user()])
        let apps = AppDirectory(apps: ["app1": burstApp], listedOnly: true)
        let bytes = Array(messageJSON(recipients: ["u2", "u3"], mentions: ["u3"]).utf8)
        let first = try Simulator.simulate(eventBytes: bytes, fixture: fixture, apps: apps, at: nil, now: now0)
        #expect(first.map(\.burst) == [1, nil], "u3 is mentioned: never coalesced")
        #expect(first[0].notifications.first?.collapseID == "b-c1" && first[0].reason == nil)
        #expect(json(first[0].json)["burst"] == .number("1"))
        let third = try Simulator.simulate(
            eventBytes: bytes, fixture: fixture, apps: apps, at: nil, now: now0, burst: 3)
        #expect(third.map(\.burst) == [3, nil] && third.map(\.reason) == ["coalesced_update", nil])
        let aps = try payload(third[0].notifications[0])["aps"]
        #expect(aps?["sound"] == nil && aps?["alert"]?["body"] == .string("3 new messages in Hiking"))
        #expect(try payload(third[1].notifications[0])["aps"]?["sound"] != nil)
    }

    @Test("the burst position survives the deliverable record in both forms")
    func recordRoundTrip() throws {
        var record = DeliverableRecord(
            event: try event(messageJSON()), recipient: "u2", state: user(), targets: [device()])
        record.burst = 7
        #expect(try StageCodec.decode(DeliverableRecord.self, from: StageCodec.encode(record)).burst == 7)
        #expect(try DeliverableRecord.fromJSON(record.jsonBytes()).burst == 7)
        // A version 4 record (written before bursts, during an upgrade) ends before the burst position: no burst.
        var plain = record
        plain.burst = nil
        var v4 = try version6Bytes(plain)
        #expect(v4.last == 0)
        v4[2] = 4
        v4.removeLast()
        #expect(try StageCodec.decode(DeliverableRecord.self, from: v4) == plain)
    }

    @Test(
        "a held record's shared part is exactly its event's bytes, the same in every record of the event; none for other records"
    )
    func eventRange() throws {
        let e = try event(messageJSON())
        // An ingested record at time 0 is the header, the event and one byte.
        let ingested = IngestedRecord(event: e, ingestedAt: 0).wireBytes()
        let eventBytes = Array(ingested[4..<(ingested.count - 1)])
        for recipient in ["u2", "someone-else"] {
            let record = DeliverableRecord(event: e, recipient: recipient, state: user(), targets: [device()])
            let bytes = record.wireBytes()
            let range = try #require(DeliverableRecord.eventRange(inWireBytes: bytes))
            #expect(range == 4..<(4 + eventBytes.count))
            #expect(Array(bytes[range]) == eventBytes)
            // The recipient follows.
            #expect(
                Array(bytes[range.upperBound...].prefix(1 + recipient.utf8.count)) == [UInt8(recipient.utf8.count)]
                    + Array(recipient.utf8))
            var message = BurstMessage(
                appID: "a", user: recipient, conversation: "c", at: 0, policy: CoalescePolicy(), lane: .bulk,
                record: bytes)
            #expect(message.sharedBytes == range)
            // Anything else is kept whole.
            message.record = record.jsonBytes()
            #expect(message.sharedBytes == nil)
            var older = bytes
            older[2] = BinaryRecordFormat.version - 1
            #expect(DeliverableRecord.eventRange(inWireBytes: older) == nil)
            #expect(DeliverableRecord.eventRange(inWireBytes: Array(bytes.prefix(40))) == nil)
            let resolved = ResolvedRecord(event: e, recipient: recipient, state: user()).wireBytes()
            #expect(DeliverableRecord.eventRange(inWireBytes: resolved) == nil)
        }
    }
}

/// One row of the burst table: messages (at ms) and flush-timer looks (at ms), in time order (a message before a
/// look at the same time), and what became visible.
struct BurstRow: Sendable, CustomTestStringConvertible {
    var name: String
    var policy: CoalescePolicy
    var messages: [Int64]
    /// The flush timer looks every this many ms, up to `until`.
    var tick: Int64 = 250
    var until: Int64
    /// `first`, `update N`, `held N`, `flush N`, `end`, in order.
    var outcome: [String]
    var testDescription: String { name }
}

let burstRows: [BurstRow] = [
    BurstRow(
        name: "20 messages 500 ms apart, 10 s window: one alert and two updates, the last showing all 20",
        policy: CoalescePolicy(windowMilliseconds: 10_000), messages: (0..<20).map { Int64($0) * 500 },
        until: 30_000,
        outcome: ["first"] + (2...10).map { "held \($0)" } + ["held 11", "flush 11"] + (12...20).map { "held \($0)" }
            + ["flush 20", "end"]),
    BurstRow(
        name: "20 messages at once: one alert and one update of 20",
        policy: CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 4_000),
        messages: Array(repeating: 0, count: 20), until: 20_000,
        outcome: ["first"] + (2...20).map { "held \($0)" } + ["flush 20", "end"]),
    BurstRow(
        name: "messages further apart than the window are each a first alert",
        policy: CoalescePolicy(windowMilliseconds: 10_000), messages: [0, 12_000], until: 30_000,
        outcome: ["first", "end", "first", "end"]),
    BurstRow(
        name: "a message after the update interval with nothing held is shown at once",
        policy: CoalescePolicy(windowMilliseconds: 10_000), messages: [0, 6_000], until: 30_000,
        outcome: ["first", "update 2", "end"]),
    BurstRow(
        name: "a late flush timer: later messages stay held and the flush shows them all",
        policy: CoalescePolicy(windowMilliseconds: 10_000), messages: [0, 1_000, 7_000], tick: 8_000, until: 30_000,
        outcome: ["first", "held 2", "held 3", "flush 3", "end"]),
    BurstRow(
        name: "update interval 0: every message replaces the notification at once",
        policy: CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 0), messages: [0, 100, 200],
        until: 20_000, outcome: ["first", "update 2", "update 3", "end"]),
]

/// Runs a row through `Coalescing` (what `MemoryBurstLedger` and the Redis scripts do).
func runBurst(_ row: BurstRow) -> [String] {
    var state: BurstState?
    var out: [String] = []
    var pending = row.messages[...]
    var now: Int64 = 0
    while now <= row.until {
        while let at = pending.first, at <= now {
            pending.removeFirst()
            let (step, next) = Coalescing.step(state, at: at, policy: row.policy)
            state = next
            switch step {
            case .first: out.append("first")
            case .update(let n): out.append("update \(n)")
            case .held(let n): out.append("held \(n)")
            }
        }
        if let s = state {
            switch Coalescing.flush(s, now: now, policy: row.policy) {
            case .show(let n):
                out.append("flush \(n)")
                state = Coalescing.flushed(s, count: n, now: now)
            case .end:
                out.append("end")
                state = nil
            case .wait: break
            }
        }
        now += row.tick
    }
    return out
}

/// One row of the flood guard table: visible pushes (at ms) and flush-timer looks every 250 ms up to `until`.
struct FloodRow: Sendable, CustomTestStringConvertible {
    var name: String
    var perMinute: Int
    var pushes: [Int64]
    var until: Int64
    /// `pass`, `held N`, `summary N`, `end`, in order.
    var outcome: [String]
    var testDescription: String { name }
}

let floodRows: [FloodRow] = [
    FloodRow(
        name: "5 a minute: the first 5 pass, the next 7 are held, the next minute opens with a summary of 7",
        perMinute: 5, pushes: (0..<12).map { Int64($0) * 1_000 }, until: 200_000,
        outcome: Array(repeating: "pass", count: 5) + (1...7).map { "held \($0)" } + ["summary 7", "end"]),
    FloodRow(
        name: "pushes spread over minutes never reach the limit",
        perMinute: 2, pushes: [0, 30_000, 60_000, 90_000, 120_000], until: 250_000,
        outcome: ["pass", "pass", "pass", "pass", "pass", "end"]),
    FloodRow(
        name: "held pushes stay held until the summary, even in the next minute; the summary counts in its minute",
        perMinute: 1, pushes: [0, 1_000, 59_999, 60_100, 60_200], until: 200_000,
        outcome: ["pass", "held 1", "held 2", "summary 2", "held 1", "held 2", "summary 2", "end"]),
]

@Suite("Flood guard")
struct FloodGuardTests {
    @Test("a user's visible pushes per minute, through pushes and the flush timer", arguments: floodRows)
    func table(row: FloodRow) {
        var state: BurstState?
        var out: [String] = []
        var pending = row.pushes[...]
        var now: Int64 = 0
        let policy = FloodPolicy(perMinute: row.perMinute)
        while now <= row.until {
            while let at = pending.first, at <= now {
                pending.removeFirst()
                let (step, next) = FloodGuard.step(state, at: at, policy: policy)
                state = next
                if case .held(let n) = step { out.append("held \(n)") } else { out.append("pass") }
            }
            if let s = state {
                switch Coalescing.flush(s, now: now, policy: FloodGuard.timing) {
                case .show(let n):
                    out.append("summary \(n)")
                    state = FloodGuard.flushed(s, count: n, now: now)
                case .end:
                    out.append("end")
                    state = nil
                case .wait: break
                }
            }
            now += 250
        }
        #expect(out == row.outcome)
    }

    @Test("calls, forced messages and deletions are exempt; a summary says the count, silently, under one collapse id")
    func summary() throws {
        #expect(FloodGuard.exempt(try event(callJSON("initiated", conversation: "group"))))
        #expect(FloodGuard.exempt(try event(messageJSON(ext: #"{"em_force_notification":true}"#))))
        #expect(!FloodGuard.exempt(try event(messageJSON(type: "direct"))))
        let e = try event(messageJSON(type: "direct"))
        let devices = [device(), androidDevice]
        let r = try Renderer.render(
            event: e, recipient: "u2", state: user(devices: devices), targets: devices, app: burstApp, burst: -7,
            now: now0)
        #expect(r.map(\.collapseID) == ["herald-summary", "herald-summary"])
        let aps = try payload(r[0])["aps"]
        #expect(aps?["sound"] == nil && aps?["alert"]?["body"] == .string("7 new messages"))
        #expect(try payload(r[1])["message"]?["android"]?["notification"]?["tag"] == .string("herald-summary"))
    }
}
