// Rows from the Sendbird iOS push seeds: templates, trigger options, DND and
// snooze, translation, multi-device modes, the 20-token limit, the payload.

import Foundation
import HeraldCore
import Testing

let sendbirdApp = AppConfig(
    appID: "sb", payloadProfile: .sendbird(key: "sendbird"),
    templates: TemplateConfig(customTypes: [
        "support": TemplatePair(
            text: "[{channel_name}] {sender_name}: {message}",
            file: "{sender_name} sent {file_type_friendly}: {filename}")
    ]),
    credentials: [APNsCredential(bundleID: "com.example.chat", teamID: "T", keyID: "K", keyFile: "k.p8")])

struct TemplateRow: Sendable, CustomTestStringConvertible {
    var name: String
    var template: TemplateChoice = .default
    var messageType: String = "text"
    var file: String? = nil
    var convCustomType: String = ""
    var style: DisplayStyle = .summary
    var languages: [String] = []
    var body: String
    var testDescription: String { name }
}

let imageFile = #"{"name":"hello_world.jpg","mime_type":"image/jpeg","url":"https://cdn.example/f.jpg"}"#

let templateRows: [TemplateRow] = [
    TemplateRow(name: "default template, text: {sender_name}: {message}", body: "Cindy: Bye!"),
    TemplateRow(
        name: "default template, file: {filename}", messageType: "file", file: imageFile, body: "hello_world.jpg"),
    TemplateRow(name: "alternative template, text", template: .alternative, body: "New message arrived"),
    TemplateRow(
        name: "alternative template, file", template: .alternative, messageType: "file", file: imageFile,
        body: "New file arrived"),
    TemplateRow(name: "custom_type template beats default", convCustomType: "support", body: "[Hiking] Cindy: Bye!"),
    TemplateRow(
        name: "custom_type template beats alternative", template: .alternative, convCustomType: "support",
        body: "[Hiking] Cindy: Bye!"),
    TemplateRow(
        name: "custom_type file template with file_type_friendly", messageType: "file", file: imageFile,
        convCustomType: "support", body: "Cindy sent Image: hello_world.jpg"),
    TemplateRow(name: "unknown custom_type falls back to default", convCustomType: "other", body: "Cindy: Bye!"),
    TemplateRow(name: "simple banner display style", style: .simpleBanner, body: "You have a new message"),
    TemplateRow(
        name: "alternative template in French", template: .alternative, languages: ["fr"],
        body: "Nouveau message reçu"),
    TemplateRow(
        name: "alternative template in Korean (kr alias)", template: .alternative, languages: ["kr"],
        body: "새 메시지가 도착했습니다"),
    TemplateRow(
        name: "alternative template in Simplified Chinese", template: .alternative, languages: ["zh-Hans"],
        body: "收到一条新消息"),
    TemplateRow(name: "simple banner in Korean", style: .simpleBanner, languages: ["ko-KR"], body: "새 메시지가 있습니다"),
    TemplateRow(
        name: "unknown language falls back to English", template: .alternative, languages: ["xx"],
        body: "New message arrived"),
]

struct TriggerRow: Sendable, CustomTestStringConvertible {
    var name: String
    var user: PushTrigger
    var conversation: ConversationTrigger = .default
    var muted = false
    var mentions: [String] = []
    var mentionType = "users"
    var expected: SuppressionReason?
    var testDescription: String { name }
}

let triggerRows: [TriggerRow] = [
    TriggerRow(name: "all: every message", user: .all, expected: nil),
    TriggerRow(name: "mention_only, not mentioned", user: .mentionOnly, expected: .notMentioned),
    TriggerRow(name: "mention_only, mentioned", user: .mentionOnly, mentions: ["u2"], expected: nil),
    TriggerRow(
        name: "mention_only, someone else mentioned", user: .mentionOnly, mentions: ["u3"], expected: .notMentioned),
    TriggerRow(name: "mention_only, channel mention", user: .mentionOnly, mentionType: "channel", expected: nil),
    TriggerRow(name: "off: nothing", user: .off, mentions: ["u2"], expected: .triggerOff),
    TriggerRow(name: "conversation off beats user all", user: .all, conversation: .off, expected: .conversationOff),
    TriggerRow(name: "conversation all beats user off", user: .off, conversation: .all, expected: nil),
    TriggerRow(
        name: "conversation mention_only beats user all", user: .all, conversation: .mentionOnly,
        expected: .notMentioned),
    TriggerRow(
        name: "conversation default uses user mention_only", user: .mentionOnly, conversation: .default,
        expected: .notMentioned),
    TriggerRow(name: "muted conversation", user: .all, muted: true, mentions: ["u2"], expected: .muted),
    TriggerRow(
        name: "conversation off is reported before muted", user: .all, conversation: .off, muted: true,
        expected: .conversationOff),
]

@Suite("Sendbird seed behaviour")
struct SendbirdSeedTests {
    @Test(arguments: templateRows)
    func templates(_ row: TemplateRow) throws {
        let e = try event(
            messageJSON(
                sender: "u1", convCustomType: row.convCustomType, messageType: row.messageType,
                file: row.file))
        var prefs = Preferences()
        prefs.template = row.template
        prefs.displayStyle = row.style
        prefs.languages = row.languages
        let (_, requests) = try run(e, to: "u2", state: user(prefs: prefs), app: sendbirdApp)
        let p = try payload(try #require(requests.first))
        #expect(p["aps"]?["alert"]?["body"] == .string(row.body))
    }

    @Test(arguments: triggerRows)
    func triggerOptions(_ row: TriggerRow) throws {
        let e = try event(messageJSON(sender: "u1", mentions: row.mentions, mentionType: row.mentionType))
        let prefs = Preferences(
            trigger: row.user,
            conversations: ["c1": ConversationPreference(trigger: row.conversation, muted: row.muted)])
        let state = user(prefs: prefs)
        let d = Suppression.decide(event: e, recipient: "u2", state: state, app: sendbirdApp, now: now0)
        #expect(d == (row.expected.map { .suppress($0) } ?? .deliver(targets: state.devices)))
    }

    @Test("do not disturb in the user's time zone, across midnight (22:00-08:00 Asia/Seoul)")
    func dndSeoul() throws {
        var prefs = Preferences()
        prefs.dnd = DoNotDisturb(start: ClockTime("22:00")!, end: ClockTime("08:00")!, timezone: "Asia/Seoul")
        let state = user(prefs: prefs)
        // t0 is 16:06 in Seoul: not in the window. 2024-11-19T14:30Z is 23:30 in Seoul.
        let rows: [(Int64, Bool)] = [
            (t0, false), (1_732_026_600_000, true), (1_732_060_800_000, false),
            (1_732_050_000_000, true),
        ]
        for (at, inDND) in rows {
            let e = try event(messageJSON(createdAt: at))
            let d = Suppression.decide(event: e, recipient: "u2", state: state, app: sendbirdApp, now: now0)
            #expect((d == .suppress(.dnd)) == inDND, "at \(at)")
        }
        // The same instant is outside a 22-08 window in New York (03:30 there is inside; 09:30 is not).
        prefs.dnd?.timezone = "America/New_York"
        let e = try event(messageJSON(createdAt: 1_732_026_600_000))  // 09:30 in New York
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: prefs), app: sendbirdApp, now: now0)
                == .deliver(targets: [device()]))
    }

    @Test("DND uses created_at, and now only when the event has none")
    func dndTimeSource() throws {
        var prefs = Preferences()
        prefs.dnd = DoNotDisturb(start: ClockTime("22:00")!, end: ClockTime("08:00")!, timezone: "Asia/Seoul")
        let noTime = try event(messageJSON(createdAt: nil))
        let night = Date(timeIntervalSince1970: 1_732_026_600)  // 23:30 Seoul
        #expect(
            Suppression.decide(event: noTime, recipient: "u2", state: user(prefs: prefs), app: sendbirdApp, now: night)
                == .suppress(.dnd))
        #expect(
            Suppression.decide(event: noTime, recipient: "u2", state: user(prefs: prefs), app: sendbirdApp, now: now0)
                != .suppress(.dnd))
    }

    @Test("snooze covers [start, end)")
    func snooze() throws {
        var prefs = Preferences()
        prefs.snooze = Snooze(start: t0, end: t0 + 3_600_000)
        for (at, snoozed) in [(t0 - 1, false), (t0, true), (t0 + 3_599_999, true), (t0 + 3_600_000, false)] {
            let e = try event(messageJSON(createdAt: at))
            let d = Suppression.decide(
                event: e, recipient: "u2", state: user(prefs: prefs), app: sendbirdApp, now: now0)
            #expect((d == .suppress(.snoozed)) == snoozed, "at \(at)")
        }
    }

    @Test("translation: body in the first preferred language, all translations in the sendbird object")
    func translation() throws {
        let translations =
            #"{"fr":"Bonjour comment allez vous","de":"Hallo wie geht es dir","es":"Hola como estas","kr":"안녕하십니까?"}"#
        let app = AppConfig(
            payloadProfile: .sendbird(key: "sendbird"),
            templates: TemplateConfig(defaultPair: TemplatePair(text: "{message}", file: "{filename}")),
            credentials: sendbirdApp.credentials)
        let e = try event(
            messageJSON(sender: "u1", text: "Hello, how are you?", language: "en", translations: translations))
        var prefs = Preferences()
        prefs.languages = ["fr", "de", "es", "kr"]
        let p = try payload(try #require(try run(e, to: "u2", state: user(prefs: prefs), app: app).1.first))
        #expect(p["aps"]?["alert"]?["body"] == .string("Bonjour comment allez vous"))
        #expect(p["sendbird"]?["message"] == .string("Hello, how are you?"))
        #expect(p["sendbird"]?["type"] == .string("User"))
        #expect(p["sendbird"]?["category"] == .string("messaging:offline_notification"))
        #expect(canonical(p["sendbird"]?["translations"] ?? .null) == canonical(json(translations)))
        // Sent in a preferred language: not translated.
        prefs.languages = ["de", "en"]
        let p2 = try payload(try #require(try run(e, to: "u2", state: user(prefs: prefs), app: app).1.first))
        #expect(p2["aps"]?["alert"]?["body"] == .string("Hello, how are you?"))
        // With the default template the translated text is the {message}.
        prefs.languages = ["kr"]
        let p3 = try payload(try #require(try run(e, to: "u2", state: user(prefs: prefs), app: sendbirdApp).1.first))
        #expect(p3["aps"]?["alert"]?["body"] == .string("Cindy: 안녕하십니까?"))
    }

    @Test("preferred languages keep at most four")
    func fourLanguages() throws {
        let p = Preferences(languages: ["fr", "de", "es", "kr", "ja"])
        #expect(p.languages == ["fr", "de", "es", "kr"])
        let decoded = try Preferences.fromJSON(Array(#"{"languages":["a","b","c","d","e"]}"#.utf8))
        #expect(decoded.languages.count == 4)
    }

    @Test("the sendbird payload object: ids, channel, sender, recipient, unread counts, files; key is configurable")
    func sendbirdObject() throws {
        let app = AppConfig(payloadProfile: .sendbird(key: "chat"), credentials: sendbirdApp.credentials)
        let e = try event(messageJSON(sender: "u1", messageType: "file", file: imageFile))
        var state = user(unread: 7)
        state.unread.conversations = ["c1": 3]
        let (_, requests) = try run(e, to: "u2", state: state, app: app, senderDisplayName: "Cindy L.")
        let p = try payload(try #require(requests.first))
        #expect(p["sendbird"] == nil)
        let sb = try #require(p["chat"])
        let expected = json(
            """
            {"category":"messaging:offline_notification","type":"File","message":"Bye!","data":"","custom_type":"",
             "message_id":373360335316321408,"created_at":1732000000000,"app_id":"app1","unread_message_count":7,
             "channel":{"channel_url":"c1","name":"Hiking","custom_type":""},"channel_type":"group_messaging",
             "sender":{"id":"u1","name":"Cindy L.","profile_url":""},"recipient":{"id":"u2","name":""},
             "files":[{"name":"hello_world.jpg","type":"image/jpeg","url":"https://cdn.example/f.jpg"}],
             "translations":{},"push_sound":"default","channel_unread_count":3}
            """)
        #expect(canonical(sb) == canonical(expected))
        #expect(p["aps"]?["badge"] == .number("7"))
        #expect(p["aps"]?["alert"]?["body"] == .string("hello_world.jpg"))
    }

    @Test("badge is the unread total, unless the user or the app turns it off")
    func badge() throws {
        let e = try event(messageJSON(sender: "u1"))
        let on = try payload(try #require(try run(e, to: "u2", state: user(unread: 5), app: sendbirdApp).1.first))
        #expect(on["aps"]?["badge"] == .number("5"))
        var prefs = Preferences()
        prefs.badge = false
        let userOff = try payload(
            try #require(try run(e, to: "u2", state: user(prefs: prefs, unread: 5), app: sendbirdApp).1.first))
        #expect(userOff["aps"]?["badge"] == nil)
        let appOff = AppConfig(payloadProfile: .compact, badge: false, credentials: sendbirdApp.credentials)
        let off = try payload(try #require(try run(e, to: "u2", state: user(unread: 5), app: appOff).1.first))
        #expect(off["aps"]?["badge"] == nil)
    }

    @Test("send when all devices are offline (default multi-device mode)")
    func allOffline() throws {
        let e = try event(messageJSON(sender: "u1"))
        let two = [device(tokenA), device(tokenB)]
        let app = AppConfig(multiDevice: .allOffline, credentials: sendbirdApp.credentials)
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(devices: two), app: app, now: now0)
                == .deliver(targets: two))
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(devices: two, online: [tokenB]), app: app, now: now0)
                == .suppress(.online))
    }

    @Test("any_offline (Sendbird): as long as one device is offline, every device gets it")
    func anyOfflineAll() throws {
        let e = try event(messageJSON(sender: "u1"))
        let two = [device(tokenA), device(tokenB)]
        let app = AppConfig(multiDevice: .anyOffline, credentials: sendbirdApp.credentials)
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(devices: two, online: [tokenB]), app: app, now: now0)
                == .deliver(targets: two))
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(devices: two, online: [tokenA, tokenB]), app: app,
                now: now0) == .suppress(.online))
        let (_, requests) = try run(e, to: "u2", state: user(devices: two, online: [tokenB]), app: app)
        #expect(requests.map(\.token) == [tokenA, tokenB])
    }

    @Test("offline_only: as long as one device is offline, only the offline devices")
    func anyOffline() throws {
        let e = try event(messageJSON(sender: "u1"))
        let two = [device(tokenA), device(tokenB)]
        let app = AppConfig(multiDevice: .offlineOnly, credentials: sendbirdApp.credentials)
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(devices: two, online: [tokenB]), app: app, now: now0)
                == .deliver(targets: [device(tokenA)]))
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(devices: two, online: [tokenA, tokenB]), app: app,
                now: now0) == .suppress(.online))
        let (_, requests) = try run(e, to: "u2", state: user(devices: two, online: [tokenB]), app: app)
        #expect(requests.map(\.token) == [tokenA])
    }

    @Test("force overrides DND, snooze, mute and trigger, never sender, no devices or online")
    func forceScope() throws {
        let forced = try event(messageJSON(sender: "u1", ext: #"{"em_force_notification":true}"#))
        let prefs = Preferences(
            trigger: .off, conversations: ["c1": ConversationPreference(trigger: .off, muted: true)],
            dnd: DoNotDisturb(start: ClockTime(hour: 0), end: ClockTime(hour: 24)),
            snooze: Snooze(start: 0, end: Int64.max))
        #expect(
            Suppression.decide(event: forced, recipient: "u2", state: user(prefs: prefs), app: sendbirdApp, now: now0)
                == .deliver(targets: [device()]))
        #expect(
            Suppression.decide(event: forced, recipient: "u1", state: user(prefs: prefs), app: sendbirdApp, now: now0)
                == .suppress(.sender))
        #expect(
            Suppression.decide(event: forced, recipient: "u2", state: user(devices: []), app: sendbirdApp, now: now0)
                == .suppress(.noDevices))
        #expect(
            Suppression.decide(
                event: forced, recipient: "u2", state: user(online: [tokenA]), app: sendbirdApp, now: now0)
                == .suppress(.online))
    }

    @Test("rule order: the first rule that decides, decides")
    func ruleOrder() throws {
        let everything = Preferences(
            trigger: .off, conversations: ["c1": ConversationPreference(trigger: .off, muted: true)],
            dnd: DoNotDisturb(start: ClockTime(hour: 0), end: ClockTime(hour: 24)),
            snooze: Snooze(start: 0, end: Int64.max))
        let ignored = try event(messageJSON(sender: "u1", ext: #"{"em_ignore_notification":true}"#))
        #expect(
            Suppression.decide(event: ignored, recipient: "u1", state: user(), app: sendbirdApp, now: now0)
                == .suppress(.sender))
        #expect(
            Suppression.decide(event: ignored, recipient: "u2", state: user(devices: []), app: sendbirdApp, now: now0)
                == .suppress(.ignored))
        let e = try event(messageJSON(sender: "u1"))
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(devices: [], online: [tokenA]), app: sendbirdApp, now: now0)
                == .suppress(.noDevices))
        #expect(
            Suppression.decide(
                event: e, recipient: "u2", state: user(online: [tokenA], prefs: everything), app: sendbirdApp, now: now0
            ) == .suppress(.online))
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: everything), app: sendbirdApp, now: now0)
                == .suppress(.conversationOff))
        var p = everything
        p.conversations = [:]
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: p), app: sendbirdApp, now: now0)
                == .suppress(.triggerOff))
        p.trigger = .mentionOnly
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: p), app: sendbirdApp, now: now0)
                == .suppress(.notMentioned))
        p.trigger = .all
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: p), app: sendbirdApp, now: now0)
                == .suppress(.snoozed))
        p.snooze = nil
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: p), app: sendbirdApp, now: now0)
                == .suppress(.dnd))
        p.dnd = nil
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(prefs: p), app: sendbirdApp, now: now0)
                == .deliver(targets: [device()]))
    }

    @Test("reason codes are exactly the words of docs/behaviour.md §6, in rule order")
    func reasonCodes() {
        #expect(
            SuppressionReason.allCases.map(\.rawValue) == [
                "sender", "app_off", "ignored", "no_devices", "online", "conversation_off",
                "muted", "trigger_off", "not_mentioned", "snoozed", "dnd",
            ])
        #expect(DropReason.allCases.map(\.rawValue) == ["channel_type", "invalid", "out_of_range"])
    }
}

@Suite("Payload size")
struct PayloadSizeTests {
    @Test(
        "a long body is cut on a character boundary with … and the payload lands just under 4096 bytes",
        arguments: [PayloadProfile.compact, .sendbird(key: "sendbird"), .cometchat])
    func longBody(profile: PayloadProfile) throws {
        let app = AppConfig(payloadProfile: profile, credentials: sendbirdApp.credentials)
        let text = String(repeating: "é👨‍👩‍👧\"", count: 2000)
        let e = try event(
            messageJSON(sender: "u1", text: text, translations: #"{"fr":"\#(String(repeating: "x", count: 3000))"}"#))
        let r = try #require(try run(e, to: "u2", state: user(), app: app).1.first)
        #expect(r.payload.count <= 4096 && r.payload.count > 4000, "\(profile.name): \(r.payload.count)")
        let p = try payload(r)
        guard case .string(let body)? = p["aps"]?["alert"]?["body"] else { Issue.record("no body"); return }
        #expect(body.hasSuffix("…"))
        let full = profile == .cometchat ? text : "Cindy: " + text
        #expect(full.hasPrefix(String(body.dropLast())))
        // The alert keeps most of the room: at least a third of the payload.
        #expect(body.utf8.count > 1000, "\(profile.name): body of \(body.utf8.count) bytes")
    }

    @Test("a body that fits is not touched")
    func fits() throws {
        let text = String(repeating: "a", count: 3000)
        let e = try event(messageJSON(sender: "u1", text: text))
        let p = try payload(try #require(try run(e, to: "u2", state: user(), app: easemobApp).1.first))
        #expect(p["aps"]?["alert"]?["body"] == .string("Cindy:" + text))
    }

    @Test("VoIP payloads may use 5120 bytes")
    func voipLimit() throws {
        let e = try cometEvent(
            kind: "call", block: #""call":{"action":"initiated","session_id":"s","type":"audio"}"#,
            message: #"{"id":"1","text":"\#(String(repeating: "z", count: 6000))"}"#)
        let app = AppConfig(payloadProfile: .sendbird(key: "sendbird"), credentials: cometApp.credentials)
        let r = try #require(
            try run(e, to: "cometchat-uid-2", state: user(devices: [device(tokenV, kind: .voip)]), app: app).1.first)
        #expect(r.pushType == .voip)
        #expect(r.payload.count <= 5120 && r.payload.count > 4096)
    }
}
