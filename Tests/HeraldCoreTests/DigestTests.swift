import Foundation
import Testing

@testable import HeraldCore

let digestApp: AppConfig = {
    var app = parityApp(.compact)
    app.digest = DigestPolicy(enabled: true, conversationsNamed: 2, sound: false, deadlineMilliseconds: 3_600_000)
    return app
}()

/// 2026-03-07T12:00:00Z.
let digestT0: Int64 = 1_772_884_800_000

@Suite("Digest when Do Not Disturb or a snooze ends")
struct DigestTests {
    static func clock(_ text: String) -> ClockTime { ClockTime(text)! }

    @Test("Do Not Disturb ends at its end in the user's time zone, across midnight and a daylight saving change")
    func dndEnd() {
        // Seoul 22:00-07:00; 23:30 local (14:30 UTC) ends at 07:00 local the next morning (22:00 UTC).
        let seoul = DoNotDisturb(start: Self.clock("22:00"), end: Self.clock("07:00"), timezone: "Asia/Seoul")
        let at = digestT0 + 150 * 60_000  // 14:30 UTC
        #expect(DNDClock.end(of: seoul, covering: at) == digestT0 + 10 * 3_600_000)
        // Not covered: no end.
        #expect(DNDClock.end(of: seoul, covering: digestT0) == nil)
        // New York 22:00-07:00 on the night clocks go forward (2026-03-08 02:00 -> 03:00): 22:30 EST (03:30 UTC)
        // ends at 07:00 EDT (11:00 UTC), eight and a half hours of clock but seven and a half of time.
        let ny = DoNotDisturb(start: Self.clock("22:00"), end: Self.clock("07:00"), timezone: "America/New_York")
        let evening = digestT0 + 15 * 3_600_000 + 30 * 60_000  // 2026-03-08T03:30Z
        #expect(DNDClock.end(of: ny, covering: evening) == digestT0 + 23 * 3_600_000)  // 2026-03-08T11:00Z
        // The window's end is never covered by it.
        let end = DNDClock.end(of: ny, covering: evening)!
        #expect(!DNDClock.covers(ny, millis: end) && DNDClock.covers(ny, millis: end - 60_000))
    }

    @Test("a record's time at the ends of Int64 gives a window end without trapping (saturated, never before it)")
    func windowEndAtTheLimits() {
        let allDay = DoNotDisturb(start: Self.clock("00:00"), end: Self.clock("24:00"), timezone: "Asia/Seoul")
        let night = DoNotDisturb(start: Self.clock("22:00"), end: Self.clock("07:00"), timezone: "America/New_York")
        for dnd in [allDay, night] {
            for millis in [Int64.max, .max - 1, .min, .min + 1] where DNDClock.covers(dnd, millis: millis) {
                let end = DNDClock.end(of: dnd, covering: millis)
                #expect(end != nil, "\(millis)")
                if millis > 0, let end { #expect(end >= millis - 60_000, "\(millis) -> \(end)") }
            }
        }
    }

    @Test("the window of a suppression: the snooze's end, or Do Not Disturb's; none for other reasons")
    func windows() {
        var prefs = Preferences()
        prefs.snooze = Snooze(start: digestT0 - 1_000, end: digestT0 + 90_000)
        prefs.dnd = DoNotDisturb(start: Self.clock("11:00"), end: Self.clock("13:00"))
        let snoozed = Digest.window(reason: .snoozed, preferences: prefs, at: digestT0)
        #expect(snoozed?.window == .snooze && snoozed?.end == digestT0 + 90_000)
        let dnd = Digest.window(reason: .dnd, preferences: prefs, at: digestT0)
        #expect(dnd?.window == .dnd && dnd?.end == digestT0 + 3_600_000)
        #expect(Digest.window(reason: .muted, preferences: prefs, at: digestT0) == nil)
    }

    @Test("only messages suppressed by the snooze or Do Not Disturb count, in an app with the digest on")
    func counts() throws {
        let message = try event(messageJSON())
        #expect(Digest.counts(message, reason: .dnd, app: digestApp))
        #expect(Digest.counts(message, reason: .snoozed, app: digestApp))
        #expect(!Digest.counts(message, reason: .muted, app: digestApp))
        #expect(!Digest.counts(message, reason: .dnd, app: parityApp(.compact)), "off by default")
        var edited = message
        edited.kind = .messageEdited
        #expect(!Digest.counts(edited, reason: .dnd, app: digestApp))
    }

    @Test("the text reads right for one message, one conversation and several, in every shipped language")
    func text() {
        let en = digestApp.strings(for: ["en"])
        func t(_ s: DigestSummary) -> String { Digest.text(s, strings: en) }
        #expect(
            t(DigestSummary(window: .dnd, messages: 12, conversations: 3, names: ["Hiking", "Work"]))
                == "12 new messages in 3 conversations while Do Not Disturb was on\nHiking, Work, and 1 more")
        #expect(
            t(DigestSummary(window: .snooze, messages: 1, conversations: 1, names: ["Hiking"]))
                == "1 new message in Hiking while notifications were snoozed")
        #expect(
            t(DigestSummary(window: .dnd, messages: 5, conversations: 1, names: ["Hiking"]))
                == "5 new messages in Hiking while Do Not Disturb was on")
        #expect(
            t(DigestSummary(window: .dnd, messages: 5, conversations: 1))
                == "5 new messages while Do Not Disturb was on")
        #expect(
            t(DigestSummary(window: .dnd, messages: 1, conversations: 1)) == "1 new message while Do Not Disturb was on"
        )
        #expect(
            t(DigestSummary(window: .dnd, messages: 300, conversations: 101, more: true, names: ["A"]))
                == "300 new messages in 101+ conversations while Do Not Disturb was on\nA, and 100+ more")
        #expect(
            t(DigestSummary(window: .dnd, messages: 4, conversations: 2))
                == "4 new messages in 2 conversations while Do Not Disturb was on")
        for language in ["en", "zh", "ko", "fr", "de", "es", "ja"] {
            let strings = digestApp.strings(for: [language])
            #expect(strings.locale == language)
            for window in DigestSummary.Window.allCases {
                for s in [
                    DigestSummary(window: window, messages: 12, conversations: 3, names: ["Hiking", "Work"]),
                    DigestSummary(window: window, messages: 1, conversations: 1, names: ["Hiking"]),
                    DigestSummary(window: window, messages: 1, conversations: 1),
                    DigestSummary(window: window, messages: 7, conversations: 1, names: ["Hiking"]),
                    DigestSummary(window: window, messages: 7, conversations: 1),
                ] {
                    let text = Digest.text(s, strings: strings)
                    #expect(text.contains(String(s.messages)) && !text.contains("{"), "\(language): \(text)")
                    if s.conversations == 3 { #expect(text.contains("3") && text.contains("Work"), "\(language)") }
                    if !s.names.isEmpty { #expect(text.contains("Hiking"), "\(language): \(text)") }
                }
            }
            // The two windows read differently.
            let dnd = Digest.text(DigestSummary(window: .dnd, messages: 2, conversations: 1), strings: strings)
            let snooze = Digest.text(DigestSummary(window: .snooze, messages: 2, conversations: 1), strings: strings)
            #expect(dnd != snooze, "\(language)")
        }
        // The English singular is never used for more than one message.
        #expect(!BuiltInCatalogs.english[.digestDNDMany]!.contains("1 new message "))
    }

    @Test("the summary names the busiest conversations, up to the app's number, skipping unnamed and read ones")
    func summary() {
        let s = Digest.summary(
            window: .dnd, messages: 9,
            conversations: [("Work", 2), ("Hiking", 5), ("", 1), ("Read", 0), ("Book club", 1)], more: false,
            policy: digestApp.digest)
        #expect(s.names == ["Hiking", "Work"] && s.conversations == 4 && s.messages == 9 && !s.sound)
    }

    @Test("at send time: sent, rescheduled when the window was extended, expired past the deadline, nothing")
    func due() {
        let end = digestT0
        var state = user(devices: [device(), androidDevice, Device(token: "v", kind: .voip)])
        #expect(
            Digest.due(messages: 3, end: end, recipient: "u2", state: state, app: digestApp, now: end + 500)
                == .send(targets: [device(), androidDevice]))
        #expect(Digest.due(messages: 0, end: end, recipient: "u2", state: state, app: digestApp, now: end) == .nothing)
        #expect(
            Digest.due(messages: 3, end: end, recipient: "u2", state: state, app: digestApp, now: end + 3_600_001)
                == .expired)
        state.preferences.snooze = Snooze(start: end - 10, end: end + 60_000)
        #expect(
            Digest.due(messages: 3, end: end, recipient: "u2", state: state, app: digestApp, now: end + 500)
                == .reschedule(window: .snooze, end: end + 60_000))
        state.preferences.snooze = nil
        state.preferences.dnd = DoNotDisturb(start: Self.clock("11:00"), end: Self.clock("13:00"))
        #expect(
            Digest.due(messages: 3, end: end - 60_000, recipient: "u2", state: state, app: digestApp, now: end)
                == .reschedule(window: .dnd, end: end + 3_600_000))
        #expect(
            Digest.due(messages: 3, end: end, recipient: "u2", state: user(devices: []), app: digestApp, now: end)
                == .noDevices)
        var off = digestApp
        off.push = false
        #expect(Digest.due(messages: 3, end: end, recipient: "u2", state: user(), app: off, now: end) == .off)
    }

    @Test("a digest's event id is the same for the same (user, window end) and differs otherwise")
    func eventID() {
        let a = Digest.eventID(user: "u1", end: digestT0)
        #expect(a == Digest.eventID(user: "u1", end: digestT0))
        #expect(a != Digest.eventID(user: "u2", end: digestT0))
        #expect(a != Digest.eventID(user: "u1", end: digestT0 + 1))
        #expect(a.utf8.count <= ChatEvent.Limits.idBytes)
        #expect(Digest.eventID(user: String(repeating: "x", count: 256), end: digestT0).utf8.count < 64)
    }

    static let summaryValue = DigestSummary(
        window: .snooze, messages: 5, conversations: 2, more: true, names: ["Hiking", "工作"], sound: true)

    @Test("the digest travels in the event: binary, the rules' reader and JSON give it back")
    func records() throws {
        let e = Digest.event(
            app: "app1", user: "u2", end: digestT0, summary: Self.summaryValue, conversation: "")
        let record = DeliverableRecord(event: e, recipient: "u2", state: user(), targets: [device()])
        let back = try StageCodec.decode(DeliverableRecord.self, from: record.wireBytes())
        #expect(back.event.digest == Self.summaryValue && back.event == e)
        let json = try StageCodec.decode(DeliverableRecord.self, from: Array(record.jsonBytes()))
        #expect(json.event.digest == Self.summaryValue)
        let resolved = ResolvedRecord(event: e, recipient: "u2", state: user())
        var reuse = EventReuse()
        let read = try ResolvedRecord.readForRules(resolved.wireBytes(), reusing: &reuse)
        #expect(read.record.event.digest == Self.summaryValue)
        // An event without a digest has none after the trip.
        let plain = try event(messageJSON())
        let plainBack = try StageCodec.decode(
            DeliverableRecord.self,
            from: DeliverableRecord(event: plain, recipient: "u2", state: user(), targets: []).wireBytes())
        #expect(plainBack.event.digest == nil)
    }

    @Test("render: an alert with the digest's text on every provider and payload profile, a sound only if asked")
    func render() throws {
        let devices = [device(), androidDevice, hookUserDevice]
        for profile in profiles {
            for sound in [false, true] {
                var app = parityApp(profile)
                app.digest = DigestPolicy(enabled: true, sound: sound)
                var summary = DigestSummary(
                    window: .dnd, messages: 12, conversations: 3, names: ["Hiking", "Work"], sound: sound)
                summary.sound = sound
                let e = Digest.event(
                    app: "app1", user: "u2", end: digestT0, summary: summary, conversation: "")
                let requests = try Renderer.render(
                    event: e, recipient: "u2", state: user(devices: devices), targets: devices, app: app, now: now0)
                #expect(requests.count == 3)
                let want = "12 new messages in 3 conversations while Do Not Disturb was on\nHiking, Work, and 1 more"
                let apns = try payload(requests[0])
                #expect(requests[0].pushType == .alert, "\(profile)")
                #expect(apns["aps"]?["alert"]?["body"] == .string(want), "\(profile)")
                #expect((apns["aps"]?["sound"] != nil) == sound, "\(profile) sound \(sound)")
                let fcm = try payload(requests[1])["message"]
                #expect(fcm?["notification"]?["body"] == .string(want), "\(profile)")
                #expect((fcm?["android"]?["notification"]?["sound"] != nil) == sound, "\(profile) sound \(sound)")
                let hook = try payload(requests[2])
                #expect(hook.serialized.contains("Do Not Disturb"), "\(profile)")
                for r in requests { #expect(duplicateKey(try payload(r)) == nil) }
            }
        }
        // In the user's language.
        let e = Digest.event(
            app: "app1", user: "u2", end: digestT0,
            summary: DigestSummary(window: .snooze, messages: 1, conversations: 1),
            conversation: "c1")
        let ja = try Renderer.render(
            event: e, recipient: "u2", state: user(prefs: Preferences(languages: ["ja"])), targets: [device()],
            app: digestApp, now: now0)
        #expect(try payload(ja[0])["aps"]?["alert"]?["body"] == .string("通知の一時停止中に1件の新着メッセージ"))
    }
}

@Suite("Digest events are Herald's own")
struct DigestAdmissionTests {
    @Test("ingest drops a chat.events event that carries a digest")
    func notAccepted() throws {
        var text = messageJSON()
        text.removeLast()
        text += #","digest":{"window":"dnd","messages":3,"conversations":1}}"#
        guard case .drop(let reason, _) = Ingest.admit(Array(text.utf8)) else {
            Issue.record("admitted an event with a digest")
            return
        }
        #expect(reason == .invalid)
        guard case .admit = Ingest.admit(Array(messageJSON().utf8)) else {
            Issue.record("dropped a plain message")
            return
        }
    }
}
