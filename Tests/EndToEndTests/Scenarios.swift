// The seed scenarios: state fixtures and chat events for the end-to-end suite, one user set per scenario so
// scenarios never disturb each other, and the prediction `Simulator.simulate` makes for each event.
import Foundation
import HeraldCore

/// A 64-hex-digit device token, unique per number.
func tok(_ n: Int) -> String {
    let hex = String(n, radix: 16)
    return "e2e0" + String(repeating: "0", count: 60 - hex.count) + hex
}

enum Scenarios {
    /// A suite run's events get ids no earlier run used (the idempotency records of a replay are per event).
    static let run = String(UInt32.random(in: 0...UInt32.max), radix: 36)

    static func id(_ name: String) -> String { "\(name)-\(run)" }

    // MARK: State

    /// app1: compact payload, send only when all devices are offline.
    static let app1Fixture = """
        {
          "users": {
            "s1":  {"devices": [{"token": "\(tok(1))", "registered_at": 1700000000000}],
                    "preferences": {"display_name": "Cindy L."}},
            "r1":  {"devices": [{"token": "\(tok(11))", "bundle_id": "com.example.chat", "registered_at": 1700000000000}],
                    "unread": {"total": 3, "conversations": {"g1": 1}}},
            "r2":  {"devices": [{"token": "\(tok(12))", "registered_at": 1700000000000}], "online": ["\(tok(12))"]},
            "r3":  {"devices": []},
            "r4":  {"devices": [{"token": "\(tok(14))", "registered_at": 1700000000000}],
                    "preferences": {"template": "alternative"}},
            "r5":  {"devices": [{"token": "\(tok(15))", "registered_at": 1700000000000}],
                    "preferences": {"trigger": "mention_only"}},
            "r6":  {"devices": [{"token": "\(tok(16))", "registered_at": 1700000000000}],
                    "preferences": {"trigger": "mention_only"}},
            "r7":  {"devices": [{"token": "\(tok(17))", "registered_at": 1700000000000}],
                    "preferences": {"conversations": {"m1": {"trigger": "off"}}}},
            "r17": {"devices": [{"token": "\(tok(117))", "registered_at": 1700000000000}],
                    "preferences": {"conversations": {"m1": {"trigger": "default", "muted": true}}}},
            "r8":  {"devices": [{"token": "\(tok(18))", "registered_at": 1700000000000}],
                    "preferences": {"dnd": {"start": "00:00", "end": "24:00", "timezone": "Asia/Seoul"}, "badge": false}},
            "r9":  {"devices": [{"token": "\(tok(19))", "registered_at": 1700000000000}],
                    "preferences": {"snooze": {"start": 1000000000000, "end": 4000000000000}}},
            "r10": {"devices": [{"token": "\(tok(20))", "registered_at": 1700000000000}]},
            "r11": {"devices": [{"token": "\(tok(21))", "registered_at": 1700000000000}],
                    "preferences": {"languages": ["fr", "de"]}, "unread": {"total": 7}},
            "k1":  {"devices": [{"token": "\(tok(201))", "registered_at": 1700000000000}]},
            "k2":  {"devices": [{"token": "\(tok(202))", "registered_at": 1700000000000}]},
            "k3":  {"devices": [{"token": "\(tok(203))", "registered_at": 1700000000000}]},
            "k4":  {"devices": [{"token": "\(tok(204))", "registered_at": 1700000000000}]},
            "x1":  {"devices": [{"token": "\(tok(301))", "registered_at": 1700000000000}]},
            "dt":  {"devices": [{"token": "\(E2EStack.deadToken)", "registered_at": 1700000000000},
                                {"token": "\(tok(401))", "registered_at": 1700000000000}]},
            "dt2": {"devices": [{"token": "\(E2EStack.deadToken)", "registered_at": 4000000000000}]}
          },
          "conversations": {
            "g1": {"members": ["s1", "r1", "r2", "r3"]},
            "m1": {"members": ["s1", "r5", "r6", "r7", "r17"]},
            "sil1": {"members": ["s1", "r10"]},
            "k1": {"members": ["s1", "k1", "k2", "k3", "k4"]}
          }
        }
        """

    /// app2: Sendbird-style payload, `any_offline`: every device once one is offline.
    static let app2Fixture = """
        {
          "users": {
            "a2s": {"devices": []},
            "a2r1": {"devices": [{"token": "\(tok(31))", "registered_at": 1700000000000},
                                 {"token": "\(tok(32))", "registered_at": 1700000001000}],
                     "online": ["\(tok(31))"]},
            "a2r2": {"devices": [{"token": "\(tok(33))", "registered_at": 1700000000000},
                                 {"token": "\(tok(34))", "registered_at": 1700000001000},
                                 {"token": "\(tok(35))", "registered_at": 1700000002000}]}
          },
          "conversations": {"md1": {"members": ["a2s", "a2r1", "a2r2"]}}
        }
        """

    /// app3: CometChat-style payload, calls to VoIP tokens.
    static let app3Fixture = """
        {
          "users": {
            "c3s": {"devices": []},
            "c3r1": {"devices": [{"token": "\(tok(41))", "registered_at": 1700000000000},
                                 {"token": "\(tok(42))", "kind": "voip", "registered_at": 1700000000000}]},
            "c3r2": {"devices": [{"token": "\(tok(43))", "registered_at": 1700000000000}]}
          },
          "conversations": {"call1": {"members": ["c3s", "c3r1", "c3r2"]}}
        }
        """

    static func fixture(_ app: String) -> String {
        switch app {
        case "app2": return app2Fixture
        case "app3": return app3Fixture
        default: return app1Fixture
        }
    }

    // MARK: Events

    static func message(
        _ eventID: String, app: String = "app1", kind: String = "message", sender: String = "s1", conversation: String,
        type: String = "group", name: String = "Hiking", text: String = "Bye!",
        recipients: [String]? = nil, mentions: [String] = [], mentionType: String = "users",
        language: String? = nil, translations: [String: String] = [:], ext: String = "{}",
        createdAt: Int64
    ) -> String {
        var message: [String: Any] = [
            "id": "m-\(eventID)", "type": "text", "text": text, "mentions": mentions,
            "mention_type": mentionType,
        ]
        if let language { message["language"] = language }
        if !translations.isEmpty { message["translations"] = translations }
        var event: [String: Any] = [
            "event_id": eventID, "app_id": app, "kind": kind, "created_at": createdAt,
            "sender": ["id": sender, "name": "Cindy", "profile_url": "https://cdn.example/\(sender).png"],
            "conversation": ["id": conversation, "type": type, "name": name],
            "message": message,
        ]
        if let recipients { event["recipients"] = recipients }
        if let extObject = try? JSONSerialization.jsonObject(with: Data(ext.utf8)) { event["ext"] = extObject }
        let data = (try? JSONSerialization.data(withJSONObject: event, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    static func call(_ eventID: String, action: String = "initiated", createdAt: Int64) -> String {
        """
        {"event_id": "\(eventID)", "app_id": "app3", "kind": "call", "created_at": \(createdAt),
         "sender": {"id": "c3s", "name": "Andrew"},
         "conversation": {"id": "call1", "type": "group", "name": "Standup"},
         "call": {"action": "\(action)", "session_id": "v1.123.\(eventID)", "type": "video"}}
        """
    }

    /// The seed scenarios: name, app, event JSON.
    static func seeds(now: Int64) -> [(name: String, app: String, event: String)] {
        [
            (
                "group chat: delivered, online, no devices", "app1",
                message(id("group"), conversation: "g1", createdAt: now)
            ),
            (
                "direct chat with the alternative template", "app1",
                message(
                    id("direct"), conversation: "d1", type: "direct", name: "", text: "See you", recipients: ["r4"],
                    createdAt: now)
            ),
            (
                "mentions: mention_only, conversation off, muted", "app1",
                message(id("mention"), conversation: "m1", text: "@r5 look", mentions: ["r5"], createdAt: now)
            ),
            (
                "channel mention wakes mention_only users", "app1",
                message(
                    id("channel"), conversation: "m1", text: "@channel standup", mentionType: "channel", createdAt: now)
            ),
            (
                "do not disturb suppresses", "app1",
                message(id("dnd"), conversation: "d8", type: "direct", recipients: ["r8"], createdAt: now)
            ),
            (
                "force notification overrides do not disturb", "app1",
                message(
                    id("force"), conversation: "d8", type: "direct", recipients: ["r8"],
                    ext:
                        #"{"em_force_notification": true, "em_apns_ext": {"em_push_content": "Urgent!", "em_push_sound": "alarm.caf", "extern": "x-1"}}"#,
                    createdAt: now)
            ),
            (
                "snooze suppresses", "app1",
                message(id("snooze"), conversation: "d9", type: "direct", recipients: ["r9"], createdAt: now)
            ),
            (
                "lenient input: em_ignore_notification 1 reads as true (a warning, not the DLQ)", "app1",
                message(id("lenient"), conversation: "sil1", ext: #"{"em_ignore_notification": 1}"#, createdAt: now)
            ),
            (
                "edited message: shown again with the new text", "app1",
                message(
                    id("edit"), kind: "message_edited", conversation: "d1", type: "direct", name: "",
                    text: "See you soon",
                    recipients: ["r4"], createdAt: now)
            ),
            (
                "deleted message: a background update", "app1",
                message(
                    id("delete"), kind: "message_deleted", conversation: "d1", type: "direct", name: "", text: "",
                    recipients: ["r4"], createdAt: now)
            ),
            (
                "silent (em_ignore_notification) wakes nobody", "app1",
                message(id("silent"), conversation: "sil1", ext: #"{"em_ignore_notification": true}"#, createdAt: now)
            ),
            (
                "translation into the first preferred language", "app1",
                message(
                    id("translate"), conversation: "d11", type: "direct", text: "Good night", recipients: ["r11"],
                    language: "en", translations: ["fr": "Bonne nuit", "de": "Gute Nacht"], createdAt: now)
            ),
            ("call to VoIP tokens, alert without one", "app3", call(id("call"), createdAt: now)),
            (
                "cancelled call: a missed-call alert to device tokens, never VoIP", "app3",
                call(id("callx"), action: "cancelled", createdAt: now)
            ),
            (
                "ended call: a background push to device tokens", "app3",
                call(id("calle"), action: "ended", createdAt: now)
            ),
            (
                "file message in a support conversation (custom_type template)", "app1",
                """
                {"event_id": "\(id("file"))", "app_id": "app1", "kind": "message", "created_at": \(now),
                 "sender": {"id": "s1", "name": "Cindy"},
                 "conversation": {"id": "sup1", "type": "direct", "name": "Help desk", "custom_type": "support"},
                 "recipients": ["r4", "s1"],
                 "message": {"id": "m-file", "type": "file", "text": "",
                             "file": {"name": "receipt.jpg", "mime_type": "image/jpeg", "url": "https://cdn.example/r.jpg"}}}
                """
            ),
            (
                "open channel is dropped at ingest", "app1",
                message(id("open"), conversation: "o1", type: "open", name: "Lobby", createdAt: now)
            ),
            (
                "multi-device any_offline: every device once one is offline", "app2",
                message(id("multi"), app: "app2", sender: "a2s", conversation: "md1", text: "Hello all", createdAt: now)
            ),
        ]
    }
}
