// Edited and deleted messages as event kinds `message_edited` / `message_deleted`. CometChat's push
// seed says the message object is present "for new messages or in case a message was edited or deleted":
// an edit is shown again with the new text; a delete only updates the app (background push).

import Foundation
import HeraldCore
import Testing

struct ChangeRow: Sendable, CustomStringConvertible {
    var kind: String
    var profile: PayloadProfile
    var pushType: APNsPushType
    var priority: Int
    /// `aps.alert.body`, nil for a background push.
    var alert: String?
    /// Where the profile says what happened, and the value.
    var marker: [String]
    var markerValue: String
    var description: String { "\(kind) \(profile.name)" }
}

let changeRows: [ChangeRow] = [
    ChangeRow(
        kind: "message_edited", profile: .compact, pushType: .alert, priority: 10, alert: "Cindy: Fixed typo",
        marker: ["action"], markerValue: "edited"),
    ChangeRow(
        kind: "message_deleted", profile: .compact, pushType: .background, priority: 5, alert: nil,
        marker: ["action"], markerValue: "deleted"),
    ChangeRow(
        kind: "message_edited", profile: .sendbird(key: "sendbird"), pushType: .alert, priority: 10,
        alert: "Cindy: Fixed typo",
        marker: ["sendbird", "message_action"], markerValue: "edited"),
    ChangeRow(
        kind: "message_deleted", profile: .sendbird(key: "sendbird"), pushType: .background, priority: 5, alert: nil,
        marker: ["sendbird", "message_action"], markerValue: "deleted"),
    ChangeRow(
        kind: "message_edited", profile: .cometchat, pushType: .alert, priority: 10, alert: "Fixed typo",
        marker: ["messageAction"], markerValue: "edited"),
    ChangeRow(
        kind: "message_deleted", profile: .cometchat, pushType: .background, priority: 5, alert: nil,
        marker: ["messageAction"], markerValue: "deleted"),
]

@Suite("Edited and deleted messages")
struct MessageChangeTests {
    static func change(_ kind: String, text: String = "Fixed typo") throws -> ChatEvent {
        try event(
            messageJSON(sender: "s1", messageID: "m7", text: text).replacingOccurrences(
                of: #""kind":"message""#, with: #""kind":"\#(kind)""#))
    }

    @Test("push type, alert and marker per kind and profile", arguments: changeRows)
    func row(_ row: ChangeRow) throws {
        let app = AppConfig(payloadProfile: row.profile, credentials: sendbirdApp.credentials)
        let (_, requests) = try run(try Self.change(row.kind), to: "u2", state: user(), app: app)
        let r = try #require(requests.first)
        #expect(r.pushType == row.pushType && r.priority == row.priority)
        let p = try payload(r)
        if let alert = row.alert {
            #expect(p["aps"]?["alert"]?["body"] == .string(alert))
        } else {
            #expect(p["aps"]?["alert"] == nil && p["aps"]?["sound"] == nil && p["aps"]?["badge"] == nil)
            #expect(p["aps"]?["content-available"] == .number("1"))
            // The deleted text is not carried.
            #expect(!r.payloadString.contains("Fixed typo"))
        }
        var v: JSONValue? = p
        for k in row.marker { v = v?[k] }
        #expect(v == .string(row.markerValue))
    }

    @Test("a new message carries no marker")
    func plainMessage() throws {
        let p = try payload(
            try #require(
                try run(
                    try Self.change("message"), to: "u2", state: user(),
                    app: AppConfig(credentials: sendbirdApp.credentials)
                ).1.first))
        #expect(p["action"] == nil)
    }

    @Test("both kinds require the message block and go through the same rules as a message")
    func rules() throws {
        for kind in ["message_edited", "message_deleted"] {
            let text =
                #"{"event_id":"e","app_id":"a","kind":"\#(kind)","sender":{"id":"s"},"conversation":{"id":"c","type":"group"}}"#
            #expect(throws: FieldError(field: "message", message: "missing (required when kind is \(kind))")) {
                try ChatEvent.decode(Array(text.utf8))
            }
            let muted = Preferences(conversations: ["c1": ConversationPreference(muted: true)])
            #expect(
                Suppression.decide(
                    event: try Self.change(kind), recipient: "u2", state: user(prefs: muted),
                    app: AppConfig(credentials: sendbirdApp.credentials), now: now0) == .suppress(.muted))
        }
        // An edit to an empty text has nothing to show; a deletion needs no text.
        func admitted(_ e: ChatEvent) -> Bool { if case .admit = Ingest.admit(e) { return true } else { return false } }
        #expect(!admitted(try Self.change("message_edited", text: "")))
        #expect(admitted(try Self.change("message_deleted", text: "")))
    }

    @Test("FCM: an edit is a notification message, a deletion data-only")
    func fcm() throws {
        let app = AppConfig(
            payloadProfile: .compact, credentials: sendbirdApp.credentials,
            fcmCredentials: [FCMCredential(providerID: "p", serviceAccountFile: "/dev/null")])
        let edited = try #require(
            try run(try Self.change("message_edited"), to: "u2", state: user(devices: [fcmDevice()]), app: app).1.first)
        #expect(try payload(edited)["message"]?["notification"] != nil)
        let deleted = try #require(
            try run(try Self.change("message_deleted"), to: "u2", state: user(devices: [fcmDevice()]), app: app).1.first
        )
        let d = try payload(deleted)
        #expect(d["message"]?["notification"] == nil)
        #expect(d["message"]?["data"]?["action"] == .string("deleted"))
    }
}
