// Payload fidelity: per-app options that reproduce the vendors' payloads (Sendbird push seeds
// v3/v4, CometChat push seed, Easemob APNs seed). Each row sets one option and names what the payload
// must then hold.

import Foundation
import HeraldCore
import Testing

struct OptionRow: Sendable, CustomStringConvertible {
    var name: String
    var profile: PayloadProfile
    var options: PayloadOptions
    /// A JSON path (keys) and the value expected there; `nil` value: the key is absent.
    var checks: [([String], JSONValue?)]
    var description: String { name }
}

func opts(_ change: (inout PayloadOptions) -> Void) -> PayloadOptions {
    var o = PayloadOptions(); change(&o); return o
}

let sb = PayloadProfile.sendbird(key: "sendbird")

let optionRows: [OptionRow] = [
    OptionRow(
        name: "defaults: Sendbird v4 codes, group_messaging, channel_unread_count, dictionary alert", profile: sb,
        options: PayloadOptions(),
        checks: [
            (["sendbird", "type"], .string("User")), (["sendbird", "channel_type"], .string("group_messaging")),
            (["sendbird", "channel_unread_count"], .number("2")), (["sendbird", "push_title"], nil),
            (["sendbird", "push_alert"], nil), (["sendbird", "audience_type"], nil),
            (["sendbird", "mentioned_users"], nil), (["aps", "alert", "body"], .string("Cindy: Hello @u2")),
            (["aps", "content-available"], nil), (["aps", "mutable-content"], nil),
            (["aps", "sound"], .string("default")),
        ]),
    OptionRow(
        name: "Sendbird v3 type code MESG", profile: sb, options: opts { $0.sendbirdV3TypeCodes = true },
        checks: [(["sendbird", "type"], .string("MESG"))]),
    OptionRow(
        name: "channel_type chat for group conversations", profile: sb,
        options: opts { $0.sendbirdGroupChannelType = "chat" },
        checks: [(["sendbird", "channel_type"], .string("chat"))]),
    OptionRow(
        name: "channel_unread_count switched off", profile: sb,
        options: opts { $0.sendbirdChannelUnreadCount = false },
        checks: [(["sendbird", "channel_unread_count"], nil), (["sendbird", "unread_message_count"], .number("5"))]),
    OptionRow(
        name: "push_title and push_alert", profile: sb,
        options: opts {
            $0.sendbirdPushTitle = true; $0.sendbirdPushAlert = true
        },
        checks: [
            (["sendbird", "push_title"], .string("")), (["sendbird", "push_alert"], .string("Cindy: Hello @u2")),
        ]),
    OptionRow(
        name: "audience_type", profile: sb, options: opts { $0.sendbirdAudienceType = "only" },
        checks: [(["sendbird", "audience_type"], .string("only"))]),
    OptionRow(
        name: "mentioned_users for a mentioned recipient (counts 0 until Herald keeps them)", profile: sb,
        options: opts { $0.sendbirdMentionedUsers = true },
        checks: [
            (["sendbird", "mentioned_users", "user_id"], .string("u2")),
            (["sendbird", "mentioned_users", "total_unread_mention_count"], .number("0")),
            (["sendbird", "mentioned_users", "channel_unread_mention_count"], .number("0")),
            (["sendbird", "mentioned_users", "is_hidden"], .bool(false)),
        ]),
    OptionRow(
        name: "aps.alert as a string (older Sendbird sample)", profile: sb, options: opts { $0.alertString = true },
        checks: [(["aps", "alert"], .string("Cindy: Hello @u2"))]),
    OptionRow(
        name: "content-available and mutable-content", profile: .compact,
        options: opts {
            $0.contentAvailable = true; $0.mutableContent = true
        },
        checks: [
            (["aps", "content-available"], .number("1")), (["aps", "mutable-content"], .number("1")),
            (["aps", "alert", "body"], .string("Cindy: Hello @u2")),
        ]),
    OptionRow(
        name: "app default sound, in aps and Sendbird push_sound", profile: sb,
        options: opts { $0.sound = "chime.caf" },
        checks: [(["aps", "sound"], .string("chime.caf")), (["sendbird", "push_sound"], .string("chime.caf"))]),
    OptionRow(
        name: "per-conversation sound beats the app sound", profile: .compact,
        options: opts {
            $0.sound = "chime.caf"; $0.conversationSounds = ["g1": "bell.caf"]
        },
        checks: [(["aps", "sound"], .string("bell.caf"))]),
    OptionRow(
        name: "CometChat message object", profile: .cometchat, options: opts { $0.cometchatIncludeMessage = true },
        checks: [
            (["message", "id"], .string("m1")), (["message", "text"], .string("Hello @u2")),
            (["message", "type"], .string("text")), (["message", "receiverType"], .string("group")),
            (["message", "conversationId"], .string("g1")),
        ]),
    OptionRow(
        name: "CometChat custom JSON", profile: .cometchat,
        options: opts { $0.cometchatCustom = try? JSONValue.parse(#"{"tenant":"acme","n":1}"#) },
        checks: [(["custom", "tenant"], .string("acme")), (["custom", "n"], .number("1")), (["message"], nil)]),
]

@Suite("Per-app payload options from the vendor seeds")
struct PayloadOptionsTests {
    static func message() throws -> ChatEvent {
        try event(messageJSON(sender: "s1", conversation: "g1", messageID: "m1", text: "Hello @u2", mentions: ["u2"]))
    }

    static func value(_ v: JSONValue, _ path: [String]) -> JSONValue? {
        var cur: JSONValue? = v
        for k in path { cur = cur?[k] }
        return cur
    }

    @Test("option rows", arguments: optionRows)
    func row(_ row: OptionRow) throws {
        let app = AppConfig(
            appID: "app1", payloadProfile: row.profile, credentials: sendbirdApp.credentials,
            payloadOptions: row.options)
        let state = UserState(devices: [device()], unread: Unread(total: 5, conversations: ["g1": 2]))
        let r = try #require(try run(try Self.message(), to: "u2", state: state, app: app).1.first)
        let p = try payload(r)
        for (path, expected) in row.checks {
            #expect(Self.value(p, path) == expected, "\(path.joined(separator: "."))")
        }
    }

    @Test("an event sound (em_push_sound) beats the app and conversation sounds")
    func eventSoundWins() throws {
        let e = try event(
            messageJSON(sender: "s1", conversation: "g1", ext: #"{"em_apns_ext":{"em_push_sound":"alarm.caf"}}"#))
        let app = AppConfig(
            credentials: sendbirdApp.credentials,
            payloadOptions: opts {
                $0.sound = "chime.caf"; $0.conversationSounds = ["g1": "bell.caf"]
            })
        #expect(
            try payload(try #require(try run(e, to: "u2", state: user(), app: app).1.first))["aps"]?["sound"]
                == .string("alarm.caf"))
    }

    @Test("CometChat options reach the webhook body too")
    func webhookCarriesOptions() throws {
        let app = AppConfig(
            appID: "app1", payloadProfile: .cometchat, credentials: sendbirdApp.credentials,
            webhooks: [WebhookCredential(providerID: "custom-1", url: "https://hook.example/x")],
            payloadOptions: opts {
                $0.cometchatIncludeMessage = true; $0.cometchatCustom = .object([("k", .string("v"))])
            })
        let r = try #require(
            try run(try Self.message(), to: "u2", state: user(devices: [hookDevice()]), app: app).1.first)
        let body = try payload(r)
        let details = body["data"]?["notificationDetails"]
        #expect(details?["custom"]?["k"] == .string("v"))
        #expect(details?["message"]?["id"] == .string("m1"))
        #expect(details?["message"]?["text"] == .string("Hello @u2"))
    }

    @Test("a long text with the CometChat message object still fits 4096 bytes")
    func messageObjectFits() throws {
        let long = String(repeating: "é", count: 3000)
        let e = try event(messageJSON(sender: "s1", text: long))
        let app = AppConfig(
            appID: "app1", payloadProfile: .cometchat, credentials: sendbirdApp.credentials,
            payloadOptions: opts { $0.cometchatIncludeMessage = true })
        let r = try #require(try run(e, to: "u2", state: user(), app: app).1.first)
        #expect(r.payload.count <= 4096)
        #expect(try payload(r)["message"]?["text"] != nil)
    }

    @Test("app user_defaults apply to users who never set preferences (Easemob preset: simple banner)")
    func userDefaults() throws {
        var easemob = Preferences(); easemob.displayStyle = .simpleBanner
        let app = AppConfig(credentials: sendbirdApp.credentials, userDefaults: easemob)
        let e = try event(messageJSON(sender: "s1"))
        let fresh = try payload(try #require(try run(e, to: "u2", state: user(), app: app).1.first))
        #expect(fresh["aps"]?["alert"]?["body"] == .string("You have a new message"))
        // A user who chose a display style keeps it, even the built-in one; one who set only a language keeps the
        // app's (field by field).
        let chosen = user(prefs: Preferences(displayStyle: .summary, languages: ["en"]))
        let own = try payload(try #require(try run(e, to: "u2", state: chosen, app: app).1.first))
        #expect(own["aps"]?["alert"]?["body"] != .string("You have a new message"))
        let languageOnly = user(prefs: Preferences(languages: ["en"]))
        let banner = try payload(try #require(try run(e, to: "u2", state: languageOnly, app: app).1.first))
        #expect(banner["aps"]?["alert"]?["body"] == .string("You have a new message"))
        // A default trigger of mention_only suppresses an unmentioned user who never set one.
        var mentionOnly = Preferences(); mentionOnly.trigger = .mentionOnly
        let quiet = AppConfig(credentials: sendbirdApp.credentials, userDefaults: mentionOnly)
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: user(), app: quiet, now: now0)
                == .suppress(.notMentioned))
    }
}
