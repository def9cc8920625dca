// Rows from the CometChat push seed: chat, call, reaction and group-action
// notifications with CometChat's flat payload fields.

import Foundation
import HeraldCore
import Testing

/// Herald's interruption levels are off: the samples are CometChat's payloads exactly.
let cometApp: AppConfig = {
    var app = AppConfig(
        appID: "app123", payloadProfile: .cometchat,
        credentials: [APNsCredential(bundleID: "com.example.calls", teamID: "T", keyID: "K", keyFile: "k.p8")])
    app.interruption = InterruptionPolicy(levels: nil, relevance: nil)
    return app
}()

func cometEvent(
    kind: String, block: String,
    conversation: String = #"{"id":"cometchat-uid-1_user_cometchat-uid-2","type":"direct"}"#,
    message: String? = nil, recipients: [String] = ["cometchat-uid-2"]
) throws -> ChatEvent {
    var s = #"{"event_id":"ev-\#(kind)","app_id":"app123","kind":"\#(kind)","created_at":1741847453000,"#
    s +=
        #""sender":{"id":"cometchat-uid-1","name":"Andrew Joseph","profile_url":"https://assets.cometchat.io/sampleapp/v2/users/cometchat-uid-1.webp"},"#
    s += #""conversation":\#(conversation),"recipients":[\#(recipients.map { "\"\($0)\"" }.joined(separator: ","))],"#
    if let message { s += #""message":\#(message),"# }
    s += block + "}"
    return try event(s)
}

@Suite("CometChat seed notifications")
struct CometChatSeedTests {
    @Test("chat notification: title is the sender, body the message, flat fields")
    func chat() throws {
        let e = try cometEvent(
            kind: "message", block: #""ext":{}"#,
            message: #"{"id":"123","type":"text","text":"Hello!"}"#)
        let (_, requests) = try run(
            e, to: "cometchat-uid-2", state: user(devices: [device(bundle: nil)]), app: cometApp)
        let r = try #require(requests.first)
        #expect(r.pushType == .alert && r.topic == "com.example.calls")
        let p = try payload(r)
        let expected = json(
            """
            {"aps":{"alert":{"title":"Andrew Joseph","body":"Hello!"},"badge":0,"sound":"default",
                    "thread-id":"cometchat-uid-1_user_cometchat-uid-2"},
             "title":"Andrew Joseph","body":"Hello!","sender":"cometchat-uid-1","senderName":"Andrew Joseph",
             "senderAvatar":"https://assets.cometchat.io/sampleapp/v2/users/cometchat-uid-1.webp",
             "receiver":"cometchat-uid-2","receiverType":"user","tag":"123",
             "conversationId":"cometchat-uid-1_user_cometchat-uid-2","type":"chat","sentAt":"1741847453000"}
            """)
        #expect(canonical(p) == canonical(expected))
    }

    @Test("call notification goes to the VoIP token: push type voip, topic <bundle>.voip, 5120-byte limit")
    func callVoIP() throws {
        let e = try cometEvent(
            kind: "call", block: #""call":{"action":"initiated","session_id":"v1.123.aik2","type":"audio"}"#)
        let state = user(devices: [device(tokenA), device(tokenV, kind: .voip)])
        let (decision, requests) = try run(e, to: "cometchat-uid-2", state: state, app: cometApp)
        #expect(decision == .deliver(targets: [device(tokenV, kind: .voip)]))
        let r = try #require(requests.first)
        #expect(requests.count == 1)
        #expect(r.pushType == .voip && r.topic == "com.example.chat.voip" && r.priority == 10)
        #expect(r.pushType.payloadLimit == 5120)
        #expect(r.collapseID == "call-v1.123.aik2")
        #expect(r.expiration == 1_741_847_453 + 30)
        let p = try payload(r)
        #expect(p["body"] == .string("AUDIO CALL"))
        #expect(p["aps"]?["alert"]?["body"] == .string("AUDIO CALL"))
        #expect(p["type"] == .string("call"))
        #expect(p["callAction"] == .string("initiated"))
        #expect(p["sessionId"] == .string("v1.123.aik2"))
        #expect(p["callType"] == .string("audio"))
        #expect(p["senderName"] == .string("Andrew Joseph"))
        #expect(p["receiverType"] == .string("user"))
    }

    @Test("a VoIP token registered with a .voip bundle id keeps a single suffix")
    func voipSuffixOnce() throws {
        let e = try cometEvent(kind: "call", block: #""call":{"action":"initiated","session_id":"s","type":"audio"}"#)
        let state = user(devices: [device(tokenV, kind: .voip, bundle: "com.example.chat.voip")])
        #expect(
            try run(e, to: "cometchat-uid-2", state: state, app: cometApp).1.first?.topic == "com.example.chat.voip")
    }

    @Test("call without VoIP tokens falls back to an alert: VIDEO CALL")
    func callAlertFallback() throws {
        let e = try cometEvent(
            kind: "call", block: #""call":{"action":"initiated","session_id":"v1.9","type":"video"}"#)
        let (_, requests) = try run(e, to: "cometchat-uid-2", state: user(), app: cometApp)
        let r = try #require(requests.first)
        #expect(r.pushType == .alert && r.topic == "com.example.chat")
        #expect(try payload(r)["aps"]?["alert"]?["body"] == .string("VIDEO CALL"))
    }

    @Test("reaction notification: Reacted to your message: 😎, tag is the reacted message")
    func reaction() throws {
        let e = try cometEvent(kind: "reaction", block: #""reaction":{"emoji":"😎","message_id":"58"}"#)
        let p = try payload(try #require(try run(e, to: "cometchat-uid-2", state: user(), app: cometApp).1.first))
        #expect(p["body"] == .string("Reacted to your message: 😎"))
        #expect(p["title"] == .string("Andrew Joseph"))
        #expect(p["tag"] == .string("58"))
        #expect(p["type"] == .string("chat"))
    }

    @Test(
        "group action notification: {actor_name} has left, title is the group",
        arguments: [
            ("left", "Andrew Joseph has left"), ("joined", "Andrew Joseph has joined"),
            ("added", "Andrew Joseph was added"), ("removed", "Andrew Joseph was removed"),
            ("kicked", "Andrew Joseph was removed"), ("banned", "Andrew Joseph was banned"),
            ("unbanned", "Andrew Joseph was unbanned"),
        ])
    func groupAction(action: String, body: String) throws {
        let e = try cometEvent(
            kind: "group_action", block: #""group_action":{"action":"\#(action)","actor_name":"Andrew Joseph"}"#,
            conversation: #"{"id":"cometchat-guid-1","type":"group","name":"Hiking group"}"#,
            recipients: ["g-member"])
        let p = try payload(try #require(try run(e, to: "g-member", state: user(), app: cometApp).1.first))
        #expect(p["body"] == .string(body))
        #expect(p["title"] == .string("Hiking group"))
        #expect(p["receiver"] == .string("cometchat-guid-1"))
        #expect(p["receiverName"] == .string("Hiking group"))
        #expect(p["receiverType"] == .string("group"))
        #expect(p["tag"] == .string("cometchat-guid-1"))
    }

    @Test("group actions are not mentions; calls and reactions are")
    func mentionsOfOtherKinds() throws {
        let prefs = Preferences(trigger: .mentionOnly)
        let g = try cometEvent(kind: "group_action", block: #""group_action":{"action":"left","actor_name":"A"}"#)
        #expect(
            Suppression.decide(
                event: g, recipient: "cometchat-uid-2", state: user(prefs: prefs), app: cometApp, now: now0)
                == .suppress(.notMentioned))
        let c = try cometEvent(kind: "call", block: #""call":{"action":"initiated","session_id":"s","type":"audio"}"#)
        #expect(
            Suppression.decide(
                event: c, recipient: "cometchat-uid-2", state: user(prefs: prefs), app: cometApp, now: now0)
                == .deliver(targets: [device()]))
    }

    @Test("localised call, reaction and group texts")
    func localised() throws {
        let c = try cometEvent(kind: "call", block: #""call":{"action":"initiated","session_id":"s","type":"video"}"#)
        for (lang, text) in [("fr", "APPEL VIDÉO"), ("ko", "영상 통화"), ("zh", "视频通话")] {
            let prefs = Preferences(languages: [lang])
            let p = try payload(
                try #require(try run(c, to: "cometchat-uid-2", state: user(prefs: prefs), app: cometApp).1.first))
            #expect(p["body"] == .string(text))
        }
    }
}
