// Web Push in the core: subscriptions as `webpush` devices, the allow-list, the payload a service worker shows and
// its headers' fields, shortening to fit 4,096 bytes once encrypted, and the answer table.

import Foundation
import HeraldCore
import Testing

/// RFC 8291 Appendix A's subscription keys.
let wpP256dh = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
let wpAuth = "BTBZMqHH6r4Tts7J_aSIgg"
let wpEndpoint = "https://push.example.net/wp/gAAAAABk-abc_123?x=1"

func webPushDevice(endpoint: String = wpEndpoint) -> Device {
    Device(
        token: WebPushSubscription(endpoint: endpoint, p256dh: wpP256dh, auth: wpAuth).token, kind: .webpush,
        registeredAt: 3)
}

func webPushApp(origins: [String] = [], collapse: CollapseIDSource = .none) -> AppConfig {
    var app = AppConfig(appID: "app1", collapseID: collapse)
    app.webPush = WebPushSettings(vapidKeyFile: "vapid.pem", subject: "mailto:ops@example.com", allowedOrigins: origins)
    return app
}

@Suite("Web Push subscriptions")
struct WebPushSubscriptionTests {
    @Test func tokenRoundTripsAndIsAValidDeviceToken() throws {
        let s = WebPushSubscription(endpoint: wpEndpoint, p256dh: wpP256dh, auth: wpAuth)
        #expect(s.token == "\(wpP256dh).\(wpAuth).\(wpEndpoint)")
        #expect(WebPushSubscription(token: s.token) == s)
        #expect(s.problem == nil)
        #expect(s.origin == "https://push.example.net")
        #expect(Device.tokenProblem(s.token, kind: .webpush) == nil)
        #expect(Device.Kind.webpush.provider == .webpush)
        #expect(PushPlatform.kind(for: "webpush") == .webpush)
    }

    @Test(arguments: [
        ("http://push.example.net/x", "https"),
        ("https:///nohost", "host"),
        ("https://user:pw@push.example.net/x", "user info"),
        ("https://push.example.net/x#frag", "fragment"),
        ("", "no endpoint"),
    ])
    func badEndpointsAreRefused(endpoint: String, says: String) throws {
        let problem = try #require(WebPushSubscription(endpoint: endpoint, p256dh: wpP256dh, auth: wpAuth).problem)
        #expect(problem.contains(says), "\(problem)")
    }

    @Test func badKeysAreRefused() throws {
        let short = WebPushSubscription(endpoint: wpEndpoint, p256dh: String(wpP256dh.prefix(43)), auth: wpAuth)
        #expect(short.problem?.contains("p256dh") == true)
        let standard = WebPushSubscription(endpoint: wpEndpoint, p256dh: "BCVxsr7N+eNg", auth: wpAuth)
        #expect(standard.problem?.contains("p256dh") == true)
        let auth = WebPushSubscription(endpoint: wpEndpoint, p256dh: wpP256dh, auth: "AAAA")
        #expect(auth.problem?.contains("auth") == true)
        #expect(Device.tokenProblem("not-a-subscription", kind: .webpush) != nil)
        #expect(Device.tokenProblem("a.b.https://x.example/", kind: .webpush) != nil)
    }

    @Test func allowListRefusesOtherOrigins() {
        let app = webPushApp(origins: ["https://push.example.net", "https://fcm.googleapis.com"])
        #expect(app.webPushProblem(webPushDevice()) == nil)
        let other = app.webPushProblem(webPushDevice(endpoint: "https://evil.example/wp/1"))
        #expect(other?.contains("https://evil.example") == true)
        #expect(other?.contains("allowed_origins") == true)
        #expect(webPushApp().webPushProblem(webPushDevice(endpoint: "https://evil.example/wp/1")) == nil, "no list")
        #expect(app.webPushProblem(device()) == nil, "other kinds are not Web Push's business")
        #expect(WebPushSubscription.origin(ofEndpoint: "https://H.example:8443/p") == "https://h.example:8443")
    }

    @Test func registryRecordCarriesTheSubscription() throws {
        let record = RegistryRecord(op: .registerDevice, appID: "app1", user: "u1", device: webPushDevice())
        #expect(record.validationError() == nil)
        var bad = record
        bad.device?.token = WebPushSubscription(endpoint: "http://x.example/", p256dh: wpP256dh, auth: wpAuth).token
        #expect(bad.validationError()?.detail.contains("https") == true)
        // The binary codec keeps the kind and the whole token.
        let decoded = try StageCodec.decode(RegistryRecord.self, from: StageCodec.encode(record))
        #expect(decoded.device == record.device)
    }
}

@Suite("Web Push payloads")
struct WebPushPayloadTests {
    func render(_ json: String, app: AppConfig = webPushApp(), burst: Int? = nil) throws -> PushRequest {
        let e = try event(json)
        let requests = try Renderer.render(
            event: e, recipient: "u2", state: user(devices: [webPushDevice()]), targets: [webPushDevice()],
            app: app, burst: burst, now: now0)
        #expect(requests.count == 1)
        return try #require(requests.first)
    }

    @Test func groupMessageShowsTitleBodyTagAndIDs() throws {
        let r = try render(messageJSON(text: "See you at the trailhead"))
        #expect(r.provider == .webpush)
        #expect(r.token == webPushDevice().token)
        #expect(r.topic == "https://push.example.net")
        #expect(r.priority == 5 && WebPushPayload.urgency(priority: r.priority) == "normal")
        #expect(r.collapseID == nil)
        #expect(r.expiration == t0 / 1000 + 86_400)
        let p = try payload(r)
        #expect(p["title"] == .string("Hiking"))
        #expect(p["body"]?.stringValue?.contains("See you at the trailhead") == true)
        #expect(p["tag"] == .string("c-c1"))
        #expect(p["renotify"] == .bool(true))
        #expect(p["silent"] == nil)
        #expect(p["data"]?["conversation_id"] == .string("c1"))
        #expect(p["data"]?["message_id"] == .string("373360335316321408"))
        #expect(p["data"]?["event_id"] == .string("e1"))
        #expect(p["data"]?["sender_id"] == .string("6001"))
        #expect(p["data"]?["type"] == .string("message"))
    }

    @Test func directMessageIsTitledWithTheSender() throws {
        let p = try payload(try render(messageJSON(type: "direct")))
        #expect(p["title"] == .string("Cindy"))
    }

    @Test func ringingCallIsHighUrgencyWithACallTopic() throws {
        let r = try render(callJSON("initiated"))
        #expect(WebPushPayload.urgency(priority: r.priority) == "high")
        #expect(r.collapseID == "call-s1")
        #expect(r.expiration == t0 / 1000 + 30)
        let p = try payload(r)
        #expect(p["tag"] == .string("call-s1"))
        #expect(p["data"]?["call_action"] == .string("initiated"))
        #expect(p["data"]?["session_id"] == .string("s1"))
    }

    @Test func burstUpdateIsSilentAndLowUrgency() throws {
        let r = try render(messageJSON(), burst: 3)
        #expect(WebPushPayload.urgency(priority: r.priority) == "low")
        let p = try payload(r)
        #expect(p["silent"] == .bool(true))
        #expect(p["renotify"] == nil)
        #expect(p["tag"] == .string("b-c1"))
        #expect(r.collapseID == "b-c1")
    }

    @Test func topicIsBase64URLSafeAndAtMost32Characters() {
        #expect(WebPushPayload.topic("call-s1") == "call-s1")
        let long = WebPushPayload.topic("m-" + String(repeating: "9", count: 40))
        #expect(long.count == 32)
        #expect(long.allSatisfy { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" })
        let odd = WebPushPayload.topic("call-v1.123.aik2")
        #expect(odd.count == 32 && !odd.contains("."))
        #expect(WebPushPayload.topic("call-v1.123.aik2") == odd, "stable")
        #expect(WebPushPayload.topic("call-v1.123.aik3") != odd)
    }

    @Test func messageCollapseIsTheTopic() throws {
        let r = try render(messageJSON(), app: webPushApp(collapse: .message))
        #expect(r.collapseID == "m-373360335316321408")
        #expect(try payload(r)["tag"] == .string("m-373360335316321408"))
    }

    @Test func longTextIsShortenedToFitOnceEncrypted() throws {
        let text = String(repeating: "Ünïcødé ", count: 1500)
        let r = try render(messageJSON(text: text))
        #expect(r.payload.count <= WebPushPayload.payloadLimit)
        #expect(r.payload.count > WebPushPayload.payloadLimit - 64, "shortened only as much as needed")
        #expect(WebPushPayload.payloadLimit + 86 + 1 + 16 == 4096)
        let p = try payload(r)
        #expect(p["body"]?.stringValue?.hasSuffix(Renderer.ellipsis) == true)
        #expect(p["data"]?["message_id"] == .string("373360335316321408"), "the ids are kept")
    }

    @Test func a413IsAnsweredByAShorterBody() throws {
        let r = try render(messageJSON(text: String(repeating: "word ", count: 400)))
        #expect(r.payload.count > 2000)
        let smaller = try #require(WebPushPayload.shrunk(r.payload, toFit: 600))
        #expect(smaller.count <= 600 && smaller.count > 550, "cut only as much as needed: \(smaller.count)")
        let p = try JSONValue.parse(smaller)
        #expect(p["body"]?.stringValue?.hasSuffix(Renderer.ellipsis) == true)
        #expect(p["title"] == .string("Hiking"))
        #expect(p["data"] == (try payload(r))["data"], "the ids are kept")
        #expect(WebPushPayload.shrunk(r.payload, toFit: 5000) == nil, "it fits already")
        #expect(WebPushPayload.shrunk(r.payload, toFit: 100) == nil, "not even without body and title")
        #expect(WebPushPayload.shrunk(Array("not json".utf8), toFit: 4) == nil)
    }

    @Test func appWithoutWebPushOrAllowingAnotherOriginDeadLetters() throws {
        #expect(throws: RenderError.self) { try render(messageJSON(), app: AppConfig(appID: "app1")) }
        do {
            _ = try render(messageJSON(), app: webPushApp(origins: ["https://fcm.googleapis.com"]))
            Issue.record("rendered for an origin the app does not allow")
        } catch let error as RenderError {
            #expect(error.code == .noProvider)
            #expect(error.detail.contains("allowed_origins"))
        }
    }

    @Test func readSyncSendsNoClearToBrowsers() throws {
        let read = try event(
            #"{"event_id":"r1","app_id":"app1","kind":"conversation_read","created_at":1732000000000,"sender":{"id":"u2"},"conversation":{"id":"c1","type":"group"}}"#
        )
        let out = try Renderer.render(
            event: read, recipient: "u2", state: user(devices: [webPushDevice()]), targets: [webPushDevice()],
            app: webPushApp(), now: now0)
        #expect(out.isEmpty)
    }

    @Test func webPushDevicesAreTargetsOfChatAndCalls() throws {
        let state = user(devices: [device(), webPushDevice()])
        #expect(Suppression.pushableDevices(event: try event(messageJSON()), state: state).count == 2)
        #expect(Suppression.pushableDevices(event: try event(callJSON("initiated")), state: state).count == 2)
    }
}

@Suite("Web Push answers")
struct WebPushAnswerTests {
    @Test(arguments: [
        (201, PushAnswerClass.delivered), (404, .tokenDead(unregisteredAt: nil)),
        (410, .tokenDead(unregisteredAt: nil)),
        (429, .retryable), (500, .retryable), (503, .retryable), (400, .permanent), (401, .permanent),
        (403, .permanent), (413, .permanent),
    ])
    func classification(status: Int, answer: PushAnswerClass) {
        #expect(WebPushAnswerTable.classify(status: status) == answer)
    }

    @Test func reasons() {
        #expect(WebPushAnswerTable.reasonText(status: 410) == "SubscriptionGone")
        #expect(WebPushAnswerTable.reasonText(status: 403) == "VapidForbidden")
        #expect(WebPushAnswerTable.detail(Array(#"{"reason":"bad aud\nclaim"}"#.utf8)) == "bad aud claim")
        #expect(WebPushAnswerTable.detail(Array("plain text".utf8)) == "plain text")
        #expect(WebPushAnswerTable.detail(Array(String(repeating: "x", count: 500).utf8)).count == 161)
    }
}
