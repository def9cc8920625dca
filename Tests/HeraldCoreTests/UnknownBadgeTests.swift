// The badge when Herald does not know the unread count (docs/behaviour.md §7): left out, never 0, since a badge of
// 0 clears the app icon's badge.

import Foundation
import HeraldConfig
import HeraldCore
import Testing

@Suite("Badge: left out when the count is unknown")
struct UnknownBadgeTests {
    /// A state whose unread counts nothing ever set.
    func unknownState(_ devices: [Device] = [device()]) -> UserState {
        UserState(devices: devices, unread: Unread())
    }

    func app(counts: Bool, badge: Bool = true) -> AppConfig {
        var app = AppConfig(appID: "app1", badge: badge, credentials: sendbirdApp.credentials)
        app.counts = counts
        return app
    }

    @Test("APNs: no set_unread and no counts: no badge; set_unread 0: badge 0; set_unread 4: badge 4")
    func apns() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let unknown = try payload(
            try #require(try run(e, to: "u2", state: unknownState(), app: app(counts: false)).1.first))
        #expect(unknown["aps"]?["badge"] == nil)
        #expect(unknown["aps"]?["alert"] != nil)
        for total in [0, 4] {
            let known = try payload(
                try #require(try run(e, to: "u2", state: user(unread: total), app: app(counts: false)).1.first))
            #expect(known["aps"]?["badge"] == .number("\(total)"))
        }
        // Badges turned off stay off whatever is known.
        let off = try payload(
            try #require(try run(e, to: "u2", state: user(unread: 4), app: app(counts: false, badge: false)).1.first))
        #expect(off["aps"]?["badge"] == nil)
    }

    @Test("an app that keeps counts knows the count: 0 before anything was counted is a badge of 0")
    func countingAppKnows() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let p = try payload(try #require(try run(e, to: "u2", state: unknownState(), app: app(counts: true)).1.first))
        #expect(p["aps"]?["badge"] == .number("0"))
    }

    @Test("FCM: neither notification_count nor the apns badge when the count is unknown")
    func fcm() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let requests = try run(
            e, to: "u2", state: unknownState([fcmDevice()]), app: providerApp(.compact)
        ).1
        let m = try fcmMessage(try #require(requests.first))
        #expect(m["android"]?["notification"] != nil)
        #expect(m["android"]?["notification"]?["notification_count"] == nil)
        #expect(m["apns"]?["payload"]?["aps"]?["badge"] == nil)
        #expect(m["apns"]?["payload"]?["aps"]?["thread-id"] == .string("c1"))
    }

    @Test("Sendbird's unread_message_count stays 0 when the count is unknown; only the badge is left out")
    func sendbirdCount() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let sb = AppConfig(
            appID: "sb", payloadProfile: .sendbird(key: "sendbird"), credentials: sendbirdApp.credentials)
        let p = try payload(try #require(try run(e, to: "u2", state: unknownState(), app: sb).1.first))
        #expect(p["aps"]?["badge"] == nil)
        #expect(p["sendbird"]?["unread_message_count"] == .number("0"))
    }

    @Test("a read of one conversation with an unknown total sends no badge; a read of everything sends 0")
    func readSync() throws {
        let read = ReadSync.event(
            app: "app1", user: "u2", conversation: "c1", readAt: t0)
        let all = ReadSync.event(app: "app1", user: "u2", conversation: nil, readAt: t0)
        let a = app(counts: false)
        let one = try Renderer.render(
            event: read, recipient: "u2", state: unknownState(), targets: [device()], app: a,
            senderDisplayName: nil, now: now0)
        #expect(try payload(try #require(one.first))["read"]?["badge"] == nil)
        let every = try Renderer.render(
            event: all, recipient: "u2", state: unknownState(), targets: [device()], app: a,
            senderDisplayName: nil, now: now0)
        #expect(try payload(try #require(every.first))["read"]?["badge"] == .number("0"))
    }

    @Test("an unknown total survives the records between stages in both forms; a version 6 record reads as known")
    func records() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let record = ResolvedRecord(event: e, recipient: "u2", state: unknownState())
        let binary = try StageCodec.decode(ResolvedRecord.self, from: record.wireBytes())
        #expect(binary == record && !binary.state.unread.totalKnown)
        let fromJSON = try StageCodec.decode(ResolvedRecord.self, from: record.jsonBytes())
        #expect(fromJSON == record && !fromJSON.state.unread.totalKnown)
        let known = ResolvedRecord(event: e, recipient: "u2", state: user(unread: 0))
        #expect(try StageCodec.decode(ResolvedRecord.self, from: known.wireBytes()).state.unread.totalKnown)
        #expect(try StageCodec.decode(ResolvedRecord.self, from: known.jsonBytes()).state.unread.totalKnown)
        // Written by version 6 (during an upgrade): the total was always known there.
        let v6 = try StageCodec.decode(ResolvedRecord.self, from: try version6Bytes(known))
        #expect(v6 == known)
        // A state fixture that names no total leaves it unknown.
        let fixture = try StageCodec.decode(
            StateFixture.self, from: Array(#"{"users":{"u2":{"devices":[],"unread":{"conversations":{"c1":2}}}}}"#.utf8)
        )
        #expect(fixture.user("u2").unread.totalKnown == false)
        #expect(fixture.user("u2").unread.conversations == ["c1": 2])
    }

    @Test("simulate: a direct message of an app that keeps no counts to a user with no set_unread has no badge")
    func simulateFixture() throws {
        let pipeline = try PipelineLoader.load(path: repoRoot.appendingPathComponent("pipelines/example.yaml").path)
        let fixture = try StageCodec.decode(
            StateFixture.self,
            from: Array(try Data(contentsOf: repoRoot.appendingPathComponent("pipelines/examples/state.json"))))
        let bytes = Array(try Data(contentsOf: repoRoot.appendingPathComponent("pipelines/examples/event-direct.json")))
        let out = try Simulator.simulate(
            eventBytes: bytes, fixture: fixture, apps: pipeline.config.apps, at: nil, now: now0)
        let u1 = try #require(out.first { $0.user == "u1" })
        #expect(u1.decision == .deliver)
        let p = try payload(try #require(u1.notifications.first))
        #expect(p["aps"]?["alert"] != nil)
        #expect(p["aps"]?["badge"] == nil)
    }
}

@Suite("Easemob em_push_sound: null")
struct SilencedSoundTests {
    let silent = #"{"em_apns_ext":{"em_push_sound":null}}"#

    @Test("em_push_sound: null sends no sound in APNs, even with the app's or the conversation's sound set")
    func apns() throws {
        let e = try event(messageJSON(recipients: ["u2"], ext: silent))
        #expect(e.ext.apns.soundSilenced && e.ext.apns.sound == nil)
        var options = PayloadOptions()
        options.sound = "chime.caf"
        let app = AppConfig(appID: "app1", credentials: sendbirdApp.credentials, payloadOptions: options)
        let p = try payload(try #require(try run(e, to: "u2", state: user(unread: 2), app: app).1.first))
        #expect(p["aps"]?["alert"] != nil)
        #expect(p["aps"]?["sound"] == nil)
        #expect(p["aps"]?["badge"] == .number("2"))
        // Absent: the app's sound; a name: that sound.
        let plain = try event(messageJSON(recipients: ["u2"]))
        let q = try payload(try #require(try run(plain, to: "u2", state: user(), app: app).1.first))
        #expect(q["aps"]?["sound"] == .string("chime.caf"))
        let named = try event(messageJSON(recipients: ["u2"], ext: #"{"em_apns_ext":{"em_push_sound":"custom.caf"}}"#))
        #expect(!named.ext.apns.soundSilenced)
        let r = try payload(try #require(try run(named, to: "u2", state: user(), app: app).1.first))
        #expect(r["aps"]?["sound"] == .string("custom.caf"))
    }

    @Test("em_push_sound: null sends no sound in FCM's android notification nor its apns block")
    func fcm() throws {
        let e = try event(messageJSON(recipients: ["u2"], ext: silent))
        let requests = try run(e, to: "u2", state: user(devices: [fcmDevice()], unread: 3), app: providerApp(.compact))
            .1
        let m = try fcmMessage(try #require(requests.first))
        let android = try #require(m["android"]?["notification"])
        #expect(android["sound"] == nil)
        #expect(android["notification_count"] == .number("3"))
        #expect(m["apns"]?["payload"]?["aps"]?["sound"] == nil)
        #expect(m["apns"]?["payload"]?["aps"]?["thread-id"] == .string("c1"))
        // With neither sound nor badge the android notification is still a valid object.
        var noBadge = user(devices: [fcmDevice()])
        noBadge.unread = Unread()
        let bare = try run(e, to: "u2", state: noBadge, app: providerApp(.compact)).1
        let n = try fcmMessage(try #require(bare.first))
        #expect(n["android"]?["notification"] == .object([]))
    }

    @Test("the silence survives the records between stages and the normalised JSON; a version 6 record is not silent")
    func records() throws {
        let e = try event(messageJSON(recipients: ["u2"], ext: silent))
        #expect(try ChatEvent.decode(e.jsonBytes) == e)
        let record = ResolvedRecord(event: e, recipient: "u2", state: user())
        #expect(try StageCodec.decode(ResolvedRecord.self, from: record.wireBytes()) == record)
        #expect(try StageCodec.decode(ResolvedRecord.self, from: record.jsonBytes()) == record)
        var reuse = EventReuse()
        let rules = try ResolvedRecord.readForRules(record.wireBytes(), reusing: &reuse)
        #expect(rules.forwarded != nil)
        let plain = ResolvedRecord(event: try event(messageJSON(recipients: ["u2"])), recipient: "u2", state: user())
        let v6 = try StageCodec.decode(ResolvedRecord.self, from: try version6Bytes(plain))
        #expect(v6 == plain && !v6.event.ext.apns.soundSilenced)
    }

    @Test("simulate: the silent example sends no sound")
    func simulateFixture() throws {
        let pipeline = try PipelineLoader.load(path: repoRoot.appendingPathComponent("pipelines/example.yaml").path)
        let fixture = try StageCodec.decode(
            StateFixture.self,
            from: Array(try Data(contentsOf: repoRoot.appendingPathComponent("pipelines/examples/state.json"))))
        let bytes = Array(try Data(contentsOf: repoRoot.appendingPathComponent("pipelines/examples/event-silent.json")))
        let out = try Simulator.simulate(
            eventBytes: bytes, fixture: fixture, apps: pipeline.config.apps, at: nil, now: now0)
        let u2 = try #require(out.first { $0.user == "u2" })
        #expect(u2.decision == .deliver)
        let p = try payload(try #require(u2.notifications.first { $0.pushType == .alert }))
        #expect(p["aps"]?["alert"] != nil)
        #expect(p["aps"]?["sound"] == nil)
        // app1 keeps counts: the fixture's 5 and this message.
        #expect(p["aps"]?["badge"] == .number("6"))
    }
}
