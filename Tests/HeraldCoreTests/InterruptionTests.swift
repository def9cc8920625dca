// iOS interruption levels and relevance scores per priority rule (docs/behaviour.md §7).

import Foundation
import HeraldCore
import Testing

struct AttentionRow: Sendable, CustomTestStringConvertible {
    var name: String
    var json: String
    var level: String?
    var relevance: Double?
    var testDescription: String { name }
}

func callJSON(_ action: String, conversation: String = "direct") -> String {
    #"""
    {"event_id":"e9","app_id":"app1","kind":"call","created_at":1732000000000,
     "sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"c1","type":"\#(conversation)"},
     "call":{"action":"\#(action)","session_id":"s1","type":"audio"}}
    """#
}

let attentionRows: [AttentionRow] = [
    AttentionRow(name: "ringing call", json: callJSON("initiated"), level: "time-sensitive", relevance: 1),
    AttentionRow(name: "missed call", json: callJSON("unanswered"), level: "time-sensitive", relevance: 1),
    AttentionRow(name: "direct message", json: messageJSON(type: "direct"), level: "time-sensitive", relevance: 0.8),
    AttentionRow(
        name: "forced group message", json: messageJSON(ext: #"{"em_force_notification":true}"#),
        level: "time-sensitive", relevance: 0.8),
    AttentionRow(name: "mention in a group", json: messageJSON(mentions: ["u2"]), level: "active", relevance: 0.7),
    AttentionRow(name: "group message", json: messageJSON(), level: "active", relevance: 0.4),
    AttentionRow(
        name: "admin broadcast", json: messageJSON(messageType: "admin"), level: "passive", relevance: 0.1),
]

/// The payload of the first request (a test fails when there is none).
func firstPayload(_ requests: [PushRequest], sourceLocation: SourceLocation = #_sourceLocation) throws -> JSONValue {
    try payload(try #require(requests.first, sourceLocation: sourceLocation))
}

@Suite("Interruption levels and relevance")
struct InterruptionTests {
    @Test("each priority rule has its level and score in aps", arguments: attentionRows)
    func defaults(row: AttentionRow) throws {
        let app = AppConfig(credentials: propertyCredentials)
        let state = user(devices: [device()])
        let (_, requests) = try run(try event(row.json), to: "u2", state: state, app: app)
        let aps = try #require(try firstPayload(requests)["aps"])
        #expect(aps["interruption-level"]?.stringValue == row.level)
        var score: Double?
        if case .number(let text)? = aps["relevance-score"] { score = Double(text) }
        #expect(score == row.relevance)
    }

    @Test("background and VoIP pushes carry neither key")
    func notOnBackgroundOrVoIP() throws {
        let app = AppConfig(credentials: propertyCredentials)
        for (json, devices) in [
            (callJSON("ended"), [device()]), (callJSON("initiated"), [device(tokenV, kind: .voip)]),
        ] {
            let (_, requests) = try run(try event(json), to: "u2", state: user(devices: devices), app: app)
            let aps = try #require(try firstPayload(requests)["aps"])
            #expect(aps["interruption-level"] == nil)
            #expect(aps["relevance-score"] == nil)
        }
    }

    @Test("an app sets forced messages to active and turns relevance off")
    func configured() throws {
        var app = AppConfig(credentials: propertyCredentials)
        app.interruption.levels?["force"] = .active
        app.interruption.relevance = nil
        let e = try event(messageJSON(ext: #"{"em_force_notification":true}"#))
        let (_, requests) = try run(e, to: "u2", state: user(), app: app)
        let aps = try #require(try firstPayload(requests)["aps"])
        #expect(aps["interruption-level"] == .string("active"))
        #expect(aps["relevance-score"] == nil)

        app.interruption.levels = nil
        let (_, quiet) = try run(e, to: "u2", state: user(), app: app)
        #expect(try firstPayload(quiet)["aps"]?["interruption-level"] == nil)
    }

    @Test("iOS through FCM gets the level in apns.payload.aps")
    func throughFCM() throws {
        let app = parityApp(.compact)
        let (_, requests) = try run(
            try event(messageJSON(type: "direct")), to: "u2", state: user(devices: [androidDevice]), app: app)
        let body = try firstPayload(requests)
        #expect(body["message"]?["apns"]?["payload"]?["aps"]?["interruption-level"] == .string("time-sensitive"))
    }

    @Test(
        "scores are written as short decimals",
        arguments: [(0, "0"), (5, "0.05"), (40, "0.4"), (75, "0.75"), (100, "1")])
    func decimals(hundredths: Int, text: String) {
        var app = AppConfig(credentials: propertyCredentials)
        app.interruption.relevance = ["group": hundredths]
        let requests = try? run(try event(messageJSON()), to: "u2", state: user(), app: app).1
        let body = requests?.first.map { String(decoding: $0.payload, as: UTF8.self) } ?? ""
        #expect(body.contains("\"relevance-score\":\(text)}"))
    }
}
