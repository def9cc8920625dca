// Calls: only a ringing call goes through PushKit. The seven CometChat `callAction` values
// (CometChat push seed: "initiated", "cancelled", "unanswered", "ongoing", "rejected", "ended", "busy")
// against a user with a device token and a VoIP token, and against a user with a VoIP token only.

import Foundation
import HeraldCore
import Testing

struct CallRow: Sendable, CustomStringConvertible {
    var action: String
    var pushType: APNsPushType
    var token: String
    var priority: Int
    /// `aps.alert.body`, or nil when the push has no alert.
    var alertBody: String?
    var description: String { action }
}

let callRows: [CallRow] = [
    CallRow(action: "initiated", pushType: .voip, token: tokenV, priority: 10, alertBody: "AUDIO CALL"),
    CallRow(action: "unanswered", pushType: .alert, token: tokenA, priority: 10, alertBody: "Missed call"),
    CallRow(action: "cancelled", pushType: .alert, token: tokenA, priority: 10, alertBody: "Missed call"),
    CallRow(action: "ongoing", pushType: .background, token: tokenA, priority: 5, alertBody: nil),
    CallRow(action: "rejected", pushType: .background, token: tokenA, priority: 5, alertBody: nil),
    CallRow(action: "ended", pushType: .background, token: tokenA, priority: 5, alertBody: nil),
    CallRow(action: "busy", pushType: .background, token: tokenA, priority: 5, alertBody: nil),
]

@Suite("Call routing: only ringing goes to VoIP tokens")
struct CallRoutingTests {
    func callEvent(_ action: String) throws -> ChatEvent {
        try cometEvent(
            kind: "call", block: #""call":{"action":"\#(action)","session_id":"v1.123.aik2","type":"audio"}"#)
    }

    @Test("device token + VoIP token: push type, token, priority and alert per call action", arguments: callRows)
    func routing(_ row: CallRow) throws {
        let state = user(devices: [device(tokenA), device(tokenV, kind: .voip)])
        let (decision, requests) = try run(
            try callEvent(row.action), to: "cometchat-uid-2", state: state, app: cometApp)
        #expect(decision.targets.map(\.token) == [row.token])
        let r = try #require(requests.first)
        #expect(requests.count == 1)
        #expect(r.pushType == row.pushType)
        #expect(r.priority == row.priority)
        #expect(r.topic == (row.pushType == .voip ? "com.example.chat.voip" : "com.example.chat"))
        #expect(r.collapseID == "call-v1.123.aik2")
        #expect(r.expiration == 1_741_847_453 + 30)
        let p = try payload(r)
        #expect(p["callAction"] == .string(row.action))
        #expect(p["sessionId"] == .string("v1.123.aik2"))
        if let body = row.alertBody {
            #expect(p["aps"]?["alert"]?["body"] == .string(body))
            #expect(p["aps"]?["content-available"] == nil)
        } else {
            #expect(p["aps"] == json(#"{"content-available":1,"thread-id":"cometchat-uid-1_user_cometchat-uid-2"}"#))
        }
    }

    @Test("VoIP token only: ringing still rings, the other actions find no device", arguments: callRows)
    func voipOnly(_ row: CallRow) throws {
        let state = user(devices: [device(tokenV, kind: .voip)])
        let decision = try run(try callEvent(row.action), to: "cometchat-uid-2", state: state, app: cometApp).0
        if row.pushType == .voip {
            #expect(decision.targets.map(\.kind) == [.voip])
        } else {
            #expect(decision == .suppress(.noDevices))
        }
    }

    @Test("no VoIP token: ringing falls back to an alert on the device token")
    func ringWithoutVoIP() throws {
        let (_, requests) = try run(try callEvent("initiated"), to: "cometchat-uid-2", state: user(), app: cometApp)
        let r = try #require(requests.first)
        #expect(r.pushType == .alert && r.priority == 10)
        #expect(try payload(r)["aps"]?["alert"]?["body"] == .string("AUDIO CALL"))
    }

    @Test("FCM and webhook devices take every call action", arguments: callRows)
    func otherProviders(_ row: CallRow) throws {
        let state = user(devices: [device(tokenV, kind: .voip), fcmDevice(), hookDevice()])
        let decision = Suppression.decide(
            event: try callEvent(row.action), recipient: "cometchat-uid-2", state: state,
            app: cometApp, now: Date(timeIntervalSince1970: 1_741_847_453))
        let expected: [Device.Kind] = row.pushType == .voip ? [.voip, .fcm, .webhook] : [.fcm, .webhook]
        #expect(decision.targets.map(\.kind) == expected)
    }

    @Test("the applePush classification covers every call action")
    func classification() {
        let ring = ChatEvent.CallAction.allCases.filter { $0.applePush == .ring }
        #expect(ring == [.initiated])
        #expect(Set(callRows.map(\.action)) == Set(ChatEvent.CallAction.allCases.map(\.rawValue)))
    }
}
