// The parity defects: duplicate keys in what Herald writes, app defaults applied field by field, the text of
// call updates that do not ring on FCM and webhooks, and Sendbird's audience_type per push.

import Foundation
import HeraldCore
import PropertyBased
import Testing

/// The first object member name written twice, at any depth, with its path; nil when there is none. JSON text
/// inside a string (FCM data values such as the Sendbird object) is checked too.
func duplicateKey(_ value: JSONValue, path: String = "$") -> String? {
    switch value {
    case .object(let members):
        var seen = Set<String>()
        for (name, member) in members {
            if !seen.insert(name).inserted { return path + "." + name }
            if let found = duplicateKey(member, path: path + "." + name) { return found }
        }
    case .array(let items):
        for (n, item) in items.enumerated() {
            if let found = duplicateKey(item, path: path + "[\(n)]") { return found }
        }
    case .string(let text) where text.hasPrefix("{"):
        if let inner = try? JSONValue.parse(Array(text.utf8)) { return duplicateKey(inner, path: path + "(json)") }
    default: break
    }
    return nil
}

let androidDevice = Device(token: "fcm-token-1", kind: .fcm, providerID: "android")
let hookUserDevice = Device(token: "hook-user", kind: .webhook, providerID: "hook")

func parityApp(
    _ profile: PayloadProfile = .cometchat, options: PayloadOptions = PayloadOptions(),
    userDefaults: Preferences? = nil
) -> AppConfig {
    AppConfig(
        appID: "app1", payloadProfile: profile, credentials: propertyCredentials,
        fcmCredentials: [FCMCredential(providerID: "android", serviceAccountFile: "sa.json")],
        webhooks: [WebhookCredential(providerID: "hook", url: "https://hooks.example/push")],
        payloadOptions: options, userDefaults: userDefaults)
}

@Suite("Parity defects")
struct ParityDefectTests {
    @Test("a webhook body carries one custom: the app's cometchat.custom merged with the event's extern")
    func webhookCustomOnce() throws {
        var options = PayloadOptions()
        options.cometchatCustom = json(#"{"plan":"gold","region":"eu"}"#)
        let app = parityApp(options: options)
        let e = try event(messageJSON(ext: #"{"em_apns_ext":{"extern":{"region":"us","ticket":7}}}"#))
        let (_, requests) = try run(e, to: "u2", state: user(devices: [hookUserDevice]), app: app)
        let body = try payload(try #require(requests.first))
        #expect(duplicateKey(body) == nil)
        let custom = try #require(body["data"]?["notificationDetails"]?["custom"])
        #expect(canonical(custom) == canonical(json(#"{"plan":"gold","region":"us","ticket":7}"#)))

        // An extern that is not an object replaces the app's value; without one the app's object stays.
        #expect(WebhookPayload.mergedCustom(app: json(#"{"a":1}"#), event: .string("x")) == .string("x"))
        #expect(WebhookPayload.mergedCustom(app: json(#"{"a":1}"#), event: nil) == json(#"{"a":1}"#))
    }

    @Test("an extern written with a name twice is written with it once (the first, as Herald reads it)")
    func externDuplicateNames() throws {
        let e = try event(messageJSON(ext: #"{"em_apns_ext":{"extern":{"k":1,"k":2}}}"#))
        for profile in profiles {
            let app = parityApp(profile)
            let devices = [device(), androidDevice, hookUserDevice]
            let (_, requests) = try run(e, to: "u2", state: user(devices: devices), app: app)
            #expect(requests.count == 3)
            for r in requests {
                let body = try payload(r)
                #expect(duplicateKey(body) == nil, "\(profile.name) \(r.provider)")
            }
        }
    }

    @Test("any event, profile, options and provider: no payload or body holds a name twice")
    func noDuplicateKeys() async {
        let names = ["custom", "e", "k", "message", "title", "aps", "body", "sendbird"]
        await propertyCheck(count: 200, input: Gen.int(in: 0...Int(Int32.max))) { seed in
            var rng = SplitMix(state: UInt64(seed))
            func pick<T>(_ items: [T]) -> T { items[Int.random(in: 0..<items.count, using: &rng)] }
            var members: [(String, JSONValue)] = []
            for _ in 0..<Int.random(in: 0...4, using: &rng) { members.append((pick(names), .string(pick(names)))) }
            let extern: JSONValue? = Bool.random(using: &rng) ? .object(members) : pick([nil, .string("x")])
            var options = PayloadOptions()
            if Bool.random(using: &rng) { options.cometchatCustom = .object(members.reversed()) }
            options.cometchatIncludeMessage = Bool.random(using: &rng)
            options.contentAvailable = Bool.random(using: &rng)
            options.mutableContent = Bool.random(using: &rng)
            options.sendbirdPushTitle = Bool.random(using: &rng)
            options.sendbirdPushAlert = Bool.random(using: &rng)
            options.sendbirdAudienceType = Bool.random(using: &rng) ? "all" : nil
            options.sendbirdMentionedUsers = Bool.random(using: &rng)
            let profile = pick([PayloadProfile.compact, .sendbird(key: "sendbird"), .sendbird(key: "sb"), .cometchat])
            var app = parityApp(profile, options: options)
            if Bool.random(using: &rng) { app.interruption = InterruptionPolicy(levels: nil, relevance: nil) }
            let kind = pick(["message", "call", "reaction", "message_deleted"])
            var text = messageJSON(
                type: pick(["group", "direct"]), mentions: Bool.random(using: &rng) ? ["u2"] : [],
                ext: extern.map { #"{"em_apns_ext":{"extern":\#($0.serialized)}}"# } ?? "{}")
            if kind == "call" {
                let action = pick(ChatEvent.CallAction.allCases).rawValue
                text = text.replacingOccurrences(
                    of: #""kind":"message""#,
                    with: #""kind":"call","call":{"action":"\#(action)","session_id":"s1","type":"video"}"#)
            } else if kind == "reaction" {
                text = text.replacingOccurrences(
                    of: #""kind":"message""#, with: #""kind":"reaction","reaction":{"emoji":"👍","message_id":"m0"}"#)
            } else {
                text = text.replacingOccurrences(of: #""kind":"message""#, with: #""kind":"\#(kind)""#)
            }
            guard let e = try? event(text) else {
                Issue.record("test event does not decode: \(text)")
                return
            }
            let devices = [device(), device(tokenV, kind: .voip), androidDevice, hookUserDevice]
            let state = user(devices: devices, unread: 3)
            guard
                let requests = try? Renderer.render(
                    event: e, recipient: "u2", state: state, targets: devices, app: app, now: now0)
            else {
                Issue.record("render failed for \(text)")
                return
            }
            for r in requests {
                guard let body = try? JSONValue.parse(r.payload) else {
                    Issue.record("not JSON: \(r.payloadString)")
                    continue
                }
                if let name = duplicateKey(body) {
                    Issue.record("\(profile.name) \(r.provider) \(kind): \(name) twice in \(r.payloadString)")
                }
            }
        }
    }

    @Test(
        "user_defaults fill only the fields a user never set",
        arguments: [
            // (stored preferences JSON, display style, template, trigger) with app defaults simple_banner,
            // alternative, mention_only.
            (#"{}"#, DisplayStyle.simpleBanner, TemplateChoice.alternative, PushTrigger.mentionOnly),
            (#"{"languages":["fr"]}"#, .simpleBanner, .alternative, .mentionOnly),
            (#"{"display_style":"summary"}"#, .summary, .alternative, .mentionOnly),
            (#"{"trigger":"all","languages":["de"]}"#, .simpleBanner, .alternative, .all),
            (#"{"template":"default","display_style":"summary","trigger":"all"}"#, .summary, .default, .all),
        ])
    func userDefaultsFieldByField(
        stored: String, style: DisplayStyle, template: TemplateChoice, trigger: PushTrigger
    )
        throws
    {
        let defaults = Preferences(trigger: .mentionOnly, template: .alternative, displayStyle: .simpleBanner)
        let app = parityApp(.compact, userDefaults: defaults)
        let prefs = try Preferences.fromJSON(Array(stored.utf8))
        let effective = app.effectivePreferences(prefs)
        #expect(effective.displayStyle == style)
        #expect(effective.template == template)
        #expect(effective.trigger == trigger)
        // Written back (Redis, fixtures) and read again, and through the binary stage records, nothing changes.
        let again = try Preferences.fromJSON(prefs.jsonBytes())
        #expect(app.effectivePreferences(again) == effective)
        let record = DeliverableRecord(
            event: try event(messageJSON()), recipient: "u2", state: user(prefs: prefs), targets: [device()])
        let decoded = try StageCodec.decode(DeliverableRecord.self, from: StageCodec.encode(record))
        #expect(app.effectivePreferences(decoded.state.preferences) == effective)
    }

    @Test("a user who set only a language keeps the app's simple banner, in their language")
    func languageOnlyKeepsAppStyle() throws {
        let app = parityApp(.compact, userDefaults: Preferences(displayStyle: .simpleBanner))
        let prefs = try Preferences.fromJSON(Array(#"{"languages":["fr"]}"#.utf8))
        let (_, requests) = try run(try event(messageJSON()), to: "u2", state: user(prefs: prefs), app: app)
        let body = try payload(try #require(requests.first))["aps"]?["alert"]?["body"]
        #expect(body == .string("Vous avez un nouveau message"))
    }

    @Test("clearing a field in a patch makes it unset again, so the app's default returns")
    func clearedFieldIsUnset() {
        let app = parityApp(.compact, userDefaults: Preferences(displayStyle: .simpleBanner))
        let set = PreferencePatch(
            set: {
                var f = PreferencePatch.Fields(); f.displayStyle = .summary; return f
            }()
        )
        .apply(to: Preferences())
        #expect(app.effectivePreferences(set).displayStyle == .summary)
        let cleared = PreferencePatch(clear: [.displayStyle]).apply(to: set)
        #expect(app.effectivePreferences(cleared).displayStyle == .simpleBanner)
    }

    @Test(
        "a call update that does not ring says what happened on FCM and webhooks, in every language",
        arguments: [
            ("ended", CatalogKey.callEnded), ("rejected", .callRejected), ("busy", .callBusy),
            ("ongoing", .callOngoing),
        ])
    func callUpdateText(action: String, key: CatalogKey) throws {
        let text = #"""
            {"event_id":"e9","app_id":"app1","kind":"call","created_at":1732000000000,
             "sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"c1","type":"direct"},
             "call":{"action":"\#(action)","session_id":"s1","type":"video"}}
            """#
        let app = parityApp(.cometchat)
        for language in ["en", "zh", "ko", "fr", "de", "es", "ja"] {
            let expected = app.strings(for: [language])[key].source
            #expect(!expected.isEmpty)
            #expect(expected != app.strings(for: [language])[.callVideo].source)
            let prefs = Preferences(languages: [language])
            let (_, requests) = try run(
                try event(text), to: "u2",
                state: user(devices: [device(), androidDevice, hookUserDevice], prefs: prefs),
                app: app)
            let byProvider = Dictionary(uniqueKeysWithValues: requests.map { ($0.provider, $0) })
            let fcm = try payload(try #require(byProvider[.fcm]))
            #expect(fcm["message"]?["data"]?["body"] == .string(expected), "\(language)")
            let hook = try payload(try #require(byProvider[.webhook]))
            #expect(hook["data"]?["notificationDetails"]?["body"] == .string(expected), "\(language)")
            // APNs stays a background push without text.
            let apns = try payload(try #require(byProvider[.apns]))
            #expect(apns["aps"]?["alert"] == nil)
        }
    }

    @Test(
        "Sendbird audience_type follows the event where it says enough",
        arguments: [
            // (mentions, mention_type, expected)
            ([String](), "users", "custom"), (["u2"], "users", "only"), (["u9"], "users", "custom"),
            ([], "channel", "all"),
        ])
    func audienceType(mentions: [String], mentionType: String, expected: String) throws {
        var options = PayloadOptions()
        options.sendbirdAudienceType = "custom"
        let app = parityApp(.sendbird(key: "sendbird"), options: options)
        let e = try event(messageJSON(mentions: mentions, mentionType: mentionType))
        let (_, requests) = try run(e, to: "u2", state: user(), app: app)
        let body = try payload(try #require(requests.first))
        #expect(body["sendbird"]?["audience_type"] == .string(expected))
    }
}
