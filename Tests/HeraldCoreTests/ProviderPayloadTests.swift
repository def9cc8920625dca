// FCM HTTP v1 messages and custom-webhook payloads per payload profile, the
// CometChat webhook samples, device kinds and platform names.

import Foundation
import HeraldCore
import Testing

let fcmToken = "fcm-" + String(repeating: "Ab9_-", count: 30)
let hookToken = "hook-u2"

func fcmDevice(_ token: String = fcmToken, provider: String? = nil) -> Device {
    Device(token: token, kind: .fcm, registeredAt: 1, providerID: provider)
}

func hookDevice(_ token: String = hookToken, provider: String? = nil) -> Device {
    Device(token: token, kind: .webhook, registeredAt: 2, providerID: provider)
}

func providerApp(
    _ profile: PayloadProfile, includeNotification: Bool = true, badge: Bool = true,
    fcm: FCMOptions = FCMOptions()
) -> AppConfig {
    AppConfig(
        appID: "app123", payloadProfile: profile, badge: badge,
        credentials: [APNsCredential(bundleID: "com.example.chat", teamID: "T", keyID: "K", keyFile: "k.p8")],
        fcmCredentials: [
            FCMCredential(
                providerID: "fcm-provider-1", serviceAccountFile: "sa.json",
                includeNotification: includeNotification),
            FCMCredential(
                providerID: "fcm-provider-2", serviceAccountFile: "sa2.json",
                includeNotification: false),
        ],
        webhooks: [WebhookCredential(providerID: "custom-1", url: "https://hooks.example/push", region: "eu")],
        fcm: fcm)
}

/// The `message` object of an FCM request.
func fcmMessage(_ r: PushRequest) throws -> JSONValue { try #require(try payload(r)["message"]) }

/// Every value of an object is a string.
func allStrings(_ v: JSONValue?) -> Bool {
    guard case .object(let pairs)? = v else { return false }
    return pairs.allSatisfy { if case .string = $0.1 { true } else { false } }
}

@Suite("FCM HTTP v1 messages")
struct FCMMessageTests {
    struct ProfileRow: CustomTestStringConvertible, Sendable {
        let name: String
        let profile: PayloadProfile
        /// Expected `data`, exactly.
        let data: String
        let notificationTitle: String?
        let notificationBody: String
        var testDescription: String { name }
    }

    static let chatRows: [ProfileRow] = [
        ProfileRow(
            name: "compact", profile: .compact,
            data: #"{"f":"6001","t":"u2","m":"373360335316321408","g":"c1","body":"Cindy: Bye!"}"#,
            notificationTitle: nil, notificationBody: "Cindy: Bye!"),
        ProfileRow(
            name: "cometchat", profile: .cometchat,
            data:
                #"{"title":"Cindy","body":"Bye!","sender":"6001","senderName":"Cindy","receiver":"c1","receiverName":"Hiking","receiverType":"group","tag":"373360335316321408","conversationId":"c1","type":"chat","sentAt":"1732000000000"}"#,
            notificationTitle: "Cindy", notificationBody: "Bye!"),
    ]

    @Test("chat message per profile: notification block, string-only data, normal priority, ttl", arguments: chatRows)
    func chatPerProfile(_ row: ProfileRow) throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let state = user(devices: [fcmDevice()], unread: 3)
        let (_, requests) = try run(e, to: "u2", state: state, app: providerApp(row.profile))
        let r = try #require(requests.first)
        #expect(requests.count == 1)
        #expect(r.provider == .fcm && r.providerID == "fcm-provider-1" && r.topic == "fcm-provider-1")
        #expect(r.priority == 5 && r.collapseID == nil)
        let m = try fcmMessage(r)
        #expect(m["token"] == .string(fcmToken))
        #expect(canonical(try #require(m["data"])) == canonical(json(row.data)))
        #expect(allStrings(m["data"]))
        #expect(m["notification"]?["title"] == row.notificationTitle.map(JSONValue.string))
        #expect(m["notification"]?["body"] == .string(row.notificationBody))
        #expect(m["android"]?["priority"] == .string("normal"))
        #expect(m["android"]?["ttl"] == .string("86400s"))
        #expect(m["android"]?["notification"]?["notification_count"] == .number("3"))
        #expect(m["android"]?["notification"]?["sound"] == .string("default"))
        #expect(m["apns"]?["payload"]?["aps"]?["badge"] == .number("3"))
        #expect(m["apns"]?["payload"]?["aps"]?["thread-id"] == .string("c1"))
        #expect(r.payload.count <= FCMMessage.payloadLimit)
    }

    @Test("sendbird: data carries message and the nested object as JSON text")
    func sendbird() throws {
        let e = try event(messageJSON(recipients: ["u2"], translations: #"{"fr":"Au revoir !"}"#))
        let (_, requests) = try run(
            e, to: "u2", state: user(devices: [fcmDevice()], unread: 7),
            app: providerApp(.sendbird(key: "sendbird")))
        let m = try fcmMessage(try #require(requests.first))
        #expect(allStrings(m["data"]))
        #expect(m["data"]?["message"] == .string("Cindy: Bye!"))
        guard case .string(let text)? = m["data"]?["sendbird"] else { Issue.record("no sendbird text"); return }
        let nested = try JSONValue.parse(text)
        #expect(nested["category"] == .string("messaging:offline_notification"))
        #expect(nested["message"] == .string("Bye!"))
        #expect(nested["message_id"] == .number("373360335316321408"))
        #expect(nested["channel"]?["channel_url"] == .string("c1"))
        #expect(nested["sender"]?["id"] == .string("6001"))
        #expect(nested["recipient"]?["id"] == .string("u2"))
        #expect(nested["unread_message_count"] == .number("7"))
        #expect(nested["translations"]?["fr"] == .string("Au revoir !"))
    }

    @Test("include_notification off: data-only with the badge in data and no android.notification")
    func dataOnly() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let (_, requests) = try run(
            e, to: "u2", state: user(devices: [fcmDevice()], unread: 2),
            app: providerApp(.compact, includeNotification: false))
        let m = try fcmMessage(try #require(requests.first))
        #expect(m["notification"] == nil)
        #expect(m["android"]?["notification"] == nil)
        #expect(m["apns"] == nil)
        #expect(m["data"]?["badge"] == .string("2"))
        #expect(m["data"]?["body"] == .string("Cindy: Bye!"))
    }

    @Test("the device's provider id picks the credential and its include_notification setting")
    func providerPicksCredential() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let (_, requests) = try run(
            e, to: "u2", state: user(devices: [fcmDevice(provider: "fcm-provider-2")]),
            app: providerApp(.compact))
        let r = try #require(requests.first)
        #expect(r.providerID == "fcm-provider-2")
        #expect(try fcmMessage(r)["notification"] == nil)
    }

    @Test("an unknown provider id is a render error (no_provider), not a silent drop")
    func unknownProvider() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        #expect(throws: RenderError.self) {
            _ = try run(e, to: "u2", state: user(devices: [fcmDevice(provider: "nope")]), app: providerApp(.compact))
        }
        do {
            _ = try run(e, to: "u2", state: user(devices: [fcmDevice(provider: "nope")]), app: providerApp(.compact))
        } catch let error as RenderError {
            #expect(error.code == .noProvider)
        }
    }

    @Test("call: data-only, high priority, call ttl, collapse key per session; CometChat call fields")
    func call() throws {
        let e = try cometEvent(
            kind: "call", block: #""call":{"action":"initiated","session_id":"v1.123.aik2","type":"video"}"#)
        let (_, requests) = try run(
            e, to: "cometchat-uid-2", state: user(devices: [fcmDevice()]),
            app: providerApp(.cometchat))
        let r = try #require(requests.first)
        #expect(r.priority == 10 && r.collapseID == "call-v1.123.aik2")
        let m = try fcmMessage(r)
        #expect(m["notification"] == nil)
        #expect(m["android"]?["priority"] == .string("high"))
        #expect(m["android"]?["ttl"] == .string("30s"))
        #expect(m["android"]?["collapse_key"] == .string("call-v1.123.aik2"))
        #expect(allStrings(m["data"]))
        #expect(m["data"]?["type"] == .string("call"))
        #expect(m["data"]?["body"] == .string("VIDEO CALL"))
        #expect(m["data"]?["callAction"] == .string("initiated"))
        #expect(m["data"]?["sessionId"] == .string("v1.123.aik2"))
        #expect(m["data"]?["callType"] == .string("video"))
    }

    @Test("compact call: the call object travels as JSON text in data")
    func compactCall() throws {
        let e = try cometEvent(kind: "call", block: #""call":{"action":"initiated","session_id":"s1","type":"audio"}"#)
        let (_, requests) = try run(
            e, to: "cometchat-uid-2", state: user(devices: [fcmDevice()]), app: providerApp(.compact))
        let m = try fcmMessage(try #require(requests.first))
        guard case .string(let text)? = m["data"]?["call"] else { Issue.record("no call text"); return }
        #expect(
            canonical(try JSONValue.parse(text))
                == canonical(json(#"{"action":"initiated","session_id":"s1","type":"audio"}"#)))
    }

    @Test("channel id, click action and CometChat's tag go in android.notification")
    func androidNotificationOptions() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let app = providerApp(.cometchat, fcm: FCMOptions(channelID: "chat", clickAction: "OPEN_CHAT"))
        let m = try fcmMessage(
            try #require(try run(e, to: "u2", state: user(devices: [fcmDevice()]), app: app).1.first))
        #expect(m["android"]?["notification"]?["channel_id"] == .string("chat"))
        #expect(m["android"]?["notification"]?["click_action"] == .string("OPEN_CHAT"))
        #expect(m["android"]?["notification"]?["tag"] == .string("373360335316321408"))
    }

    @Test("translation, display style and badge switch apply as for APNs")
    func sameTextsAsAPNs() throws {
        let e = try event(messageJSON(recipients: ["u2"], language: "en", translations: #"{"fr":"Au revoir !"}"#))
        let fr = Preferences(languages: ["fr"])
        let m = try fcmMessage(
            try #require(
                try run(
                    e, to: "u2", state: user(devices: [fcmDevice()], prefs: fr),
                    app: providerApp(.compact)
                ).1.first))
        #expect(m["notification"]?["body"] == .string("Cindy: Au revoir !"))
        let banner = Preferences(displayStyle: .simpleBanner)
        let b = try fcmMessage(
            try #require(
                try run(
                    e, to: "u2", state: user(devices: [fcmDevice()], prefs: banner),
                    app: providerApp(.compact)
                ).1.first))
        #expect(b["notification"]?["body"] == .string("You have a new message"))
        let off = try fcmMessage(
            try #require(
                try run(
                    e, to: "u2", state: user(devices: [fcmDevice()], unread: 4),
                    app: providerApp(.compact, badge: false)
                ).1.first))
        #expect(off["android"]?["notification"]?["notification_count"] == nil)
    }

    @Test(
        "a long message is shortened to fit 4096 bytes, ending in …, valid JSON",
        arguments: [
            PayloadProfile.compact, .sendbird(key: "sendbird"), .cometchat,
        ])
    func truncation(_ profile: PayloadProfile) throws {
        let long = String(repeating: "héllo \"wörld\" ", count: 600)
        let e = try event(
            messageJSON(
                recipients: ["u2"], text: long, translations: #"{"fr":"\#(String(repeating: "x", count: 900))"}"#))
        let r = try #require(
            try run(e, to: "u2", state: user(devices: [fcmDevice()]), app: providerApp(profile)).1.first)
        #expect(r.payload.count <= FCMMessage.payloadLimit)
        #expect(r.payload.count > FCMMessage.payloadLimit - 200)
        let m = try fcmMessage(r)
        guard case .string(let body)? = m["notification"]?["body"] else { Issue.record("no body"); return }
        #expect(body.hasSuffix("…"))
        #expect(allStrings(m["data"]))
    }
}

@Suite("Custom webhook payloads")
struct WebhookPayloadTests {
    @Test("chat notification matches CometChat's sample")
    func chatSample() throws {
        let e = try cometEvent(
            kind: "message", block: #""ext":{}"#, message: #"{"id":"123","type":"text","text":"Hello!"}"#)
        let (_, requests) = try run(
            e, to: "cometchat-uid-2", state: user(devices: [hookDevice()]), app: providerApp(.cometchat))
        let r = try #require(requests.first)
        #expect(r.provider == .webhook && r.providerID == "custom-1" && r.token == hookToken)
        let expected = json(
            """
            {"trigger":"push-notification-payload-generated",
             "data":{"to":{"uid":"cometchat-uid-2"},
                     "notificationDetails":{"title":"Andrew Joseph","body":"Hello!","sender":"cometchat-uid-1",
                        "senderName":"Andrew Joseph",
                        "senderAvatar":"https://assets.cometchat.io/sampleapp/v2/users/cometchat-uid-1.webp",
                        "receiver":"cometchat-uid-2","receiverType":"user","tag":"123",
                        "conversationId":"cometchat-uid-1_user_cometchat-uid-2","type":"chat","sentAt":"1741847453000"}},
             "appId":"app123","region":"eu","webhook":"custom"}
            """)
        #expect(canonical(try payload(r)) == canonical(expected))
    }

    @Test("call notification: AUDIO CALL with callAction, sessionId, callType")
    func callSample() throws {
        let e = try cometEvent(
            kind: "call", block: #""call":{"action":"initiated","session_id":"v1.123.aik2","type":"audio"}"#)
        let r = try #require(
            try run(e, to: "cometchat-uid-2", state: user(devices: [hookDevice()]), app: providerApp(.cometchat)).1
                .first)
        let d = try #require(try payload(r)["data"]?["notificationDetails"])
        #expect(d["title"] == .string("Andrew Joseph"))
        #expect(d["body"] == .string("AUDIO CALL"))
        #expect(d["type"] == .string("call"))
        #expect(d["callAction"] == .string("initiated"))
        #expect(d["sessionId"] == .string("v1.123.aik2"))
        #expect(d["callType"] == .string("audio"))
        #expect(d["sentAt"] == .string("1741847453000"))
    }

    @Test("reaction notification: Reacted to your message: 😎, tag 58, type chat")
    func reactionSample() throws {
        let e = try cometEvent(kind: "reaction", block: #""reaction":{"emoji":"😎","message_id":"58"}"#)
        let r = try #require(
            try run(e, to: "cometchat-uid-2", state: user(devices: [hookDevice()]), app: providerApp(.cometchat)).1
                .first)
        let d = try #require(try payload(r)["data"]?["notificationDetails"])
        #expect(d["body"] == .string("Reacted to your message: 😎"))
        #expect(d["tag"] == .string("58"))
        #expect(d["type"] == .string("chat"))
    }

    @Test("group action notification: title is the group, receiver the group, tag the group")
    func groupActionSample() throws {
        let e = try cometEvent(
            kind: "group_action", block: #""group_action":{"action":"left","actor_name":"Andrew Joseph"}"#,
            conversation: #"{"id":"cometchat-guid-1","type":"group","name":"Hiking group"}"#,
            recipients: ["g-messages-none"])
        let r = try #require(
            try run(e, to: "g-messages-none", state: user(devices: [hookDevice()]), app: providerApp(.cometchat)).1
                .first)
        let p = try payload(r)
        #expect(p["data"]?["to"]?["uid"] == .string("g-messages-none"))
        let d = try #require(p["data"]?["notificationDetails"])
        #expect(d["title"] == .string("Hiking group"))
        #expect(d["body"] == .string("Andrew Joseph has left"))
        #expect(d["receiver"] == .string("cometchat-guid-1"))
        #expect(d["receiverName"] == .string("Hiking group"))
        #expect(d["receiverType"] == .string("group"))
        #expect(d["tag"] == .string("cometchat-guid-1"))
        #expect(d["conversationId"] == .string("cometchat-guid-1"))
    }

    @Test("extern becomes custom; the shape is CometChat's whatever the app profile")
    func customAndProfileIndependence() throws {
        let e = try event(messageJSON(recipients: ["u2"], ext: #"{"em_apns_ext":{"extern":{"k":"v"}}}"#))
        let r = try #require(
            try run(e, to: "u2", state: user(devices: [hookDevice()]), app: providerApp(.compact)).1.first)
        let p = try payload(r)
        #expect(p["trigger"] == .string("push-notification-payload-generated"))
        #expect(p["webhook"] == .string("custom"))
        #expect(p["data"]?["notificationDetails"]?["custom"]?["k"] == .string("v"))
        #expect(p["data"]?["notificationDetails"]?["title"] == .string("Cindy"))
    }

    @Test("two webhook devices of one provider make one POST per recipient")
    func onePerRecipient() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let state = user(devices: [hookDevice("h1"), hookDevice("h2")])
        #expect(try run(e, to: "u2", state: state, app: providerApp(.cometchat)).1.count == 1)
    }
}

@Suite("Devices of every kind")
struct DeviceKindTests {
    @Test("a group message reaches an iPhone, an Android phone and a webhook, each once with its own payload")
    func mixedDevices() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let state = user(devices: [device(), fcmDevice(), hookDevice()])
        let (decision, requests) = try run(e, to: "u2", state: state, app: providerApp(.compact))
        #expect(decision.targets.count == 3)
        #expect(requests.map(\.provider) == [.apns, .fcm, .webhook])
        #expect(try payload(requests[0])["aps"] != nil)
        #expect(try payload(requests[1])["message"] != nil)
        #expect(try payload(requests[2])["trigger"] != nil)
    }

    @Test("a call goes to VoIP on Apple's side and to FCM and webhook devices alike")
    func callTargets() throws {
        let e = try cometEvent(kind: "call", block: #""call":{"action":"initiated","session_id":"s","type":"audio"}"#)
        let state = user(devices: [device(), device(tokenV, kind: .voip), fcmDevice(), hookDevice()])
        let d = Suppression.decide(
            event: e, recipient: "cometchat-uid-2", state: state, app: providerApp(.cometchat), now: now0)
        #expect(d.targets.map(\.kind) == [.voip, .fcm, .webhook])
    }

    @Test("presence applies across all devices: any online device silences the default mode")
    func presenceAcrossKinds() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let state = user(devices: [device(), fcmDevice()], online: [fcmToken])
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: state, app: providerApp(.compact), now: now0)
                == .suppress(.online))
        let multi = AppConfig(
            multiDevice: .offlineOnly, credentials: providerApp(.compact).credentials,
            fcmCredentials: providerApp(.compact).fcmCredentials)
        #expect(
            Suppression.decide(event: e, recipient: "u2", state: state, app: multi, now: now0).targets == [device()])
    }

    @Test("device JSON without kind decodes as apns; provider_id round-trips (JSON and binary forms)")
    func decoding() throws {
        let old = try Device.fromJSON(Array(#"{"token":"ab"}"#.utf8))
        #expect(old.kind == .apns && old.providerID == nil)
        let d = Device(token: "t", kind: .fcm, registeredAt: 5, providerID: "fcm-provider-2")
        let back = try Device.fromJSON(d.jsonBytes())
        #expect(back == d)
        let record = DeliverableRecord(
            event: try event(messageJSON()), recipient: "u2", state: user(devices: [d]),
            targets: [d, hookDevice()])
        let fast = try StageCodec.decode(DeliverableRecord.self, from: StageCodec.encode(record))
        #expect(fast.targets == [d, hookDevice()])
    }

    @Test("an FCM request survives the outbound record codec with its provider")
    func outboundCodec() throws {
        let e = try event(messageJSON(recipients: ["u2"]))
        let r = try #require(
            try run(e, to: "u2", state: user(devices: [fcmDevice()]), app: providerApp(.compact)).1.first)
        let record = OutboundRecord(eventID: "e1", appID: "app123", recipient: "u2", request: r)
        let fast = try StageCodec.decode(OutboundRecord.self, from: StageCodec.encode(record))
        #expect(fast.request == r)
        let slow = try OutboundRecord.fromJSON(record.jsonBytes())
        #expect(slow.request.provider == .fcm && slow.request.providerID == "fcm-provider-1")
    }

    @Test(
        "CometChat platform names map onto device kinds",
        arguments: [
            ("FCM_ANDROID", Device.Kind.fcm), ("FCM_iOS", .fcm), ("FCM_WEB", .fcm), ("FCM_FLUTTER_ANDROID", .fcm),
            ("FCM_REACT_NATIVE_iOS", .fcm), ("FCM_IONIC_CORDOVA_ANDROID", .fcm),
            ("APNS_iOS_DEVICE", .apns), ("APNS_iOS_VOIP", .voip), ("APNS_FLUTTER_VOIP", .voip),
            ("APNS_REACT_NATIVE_DEVICE", .apns), ("APNS_IONIC_CORDOVA_VOIP", .voip),
            ("fcm", .fcm), ("webhook", .webhook), ("CUSTOM", .webhook),
        ])
    func platforms(_ name: String, _ kind: Device.Kind) {
        #expect(PushPlatform.kind(for: name) == kind)
    }

    @Test("unknown platform names are rejected")
    func unknownPlatforms() {
        for name in ["FCM_PALM", "APNS_iOS", "GCM", ""] { #expect(PushPlatform.kind(for: name) == nil) }
    }
}

@Suite("FCM and webhook answer tables")
struct ProviderAnswerTableTests {
    struct Row: CustomTestStringConvertible, Sendable {
        let status: Int
        let body: String?
        let answer: PushAnswerClass
        var testDescription: String { "\(status) \(body ?? "")" }
    }

    static func fcmError(
        _ status: Int, _ name: String, _ code: String?, message: String = "m", field: String? = nil
    ) -> String {
        var details: [String] = []
        if let code {
            details.append(#"{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"\#(code)"}"#)
        }
        if let field {
            details.append(
                #"{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"\#(field)","description":"d"}]}"#
            )
        }
        return
            #"{"error":{"code":\#(status),"message":"\#(message)","status":"\#(name)","details":[\#(details.joined(separator: ","))]}}"#
    }

    static let rows: [Row] = [
        Row(status: 200, body: nil, answer: .delivered),
        Row(status: 404, body: fcmError(404, "NOT_FOUND", "UNREGISTERED"), answer: .tokenDead(unregisteredAt: nil)),
        Row(
            status: 400,
            body: fcmError(
                400, "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                message: "The registration token is not a valid FCM registration token"),
            answer: .tokenDead(unregisteredAt: nil)),
        Row(
            status: 400, body: fcmError(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", field: "message.token"),
            answer: .tokenDead(unregisteredAt: nil)),
        Row(
            status: 400,
            body: fcmError(
                400, "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                message: "Invalid value at 'message.data[0].value'", field: "message.data[0].value"),
            answer: .permanent),
        Row(status: 403, body: fcmError(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"), answer: .permanent),
        Row(status: 429, body: fcmError(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), answer: .retryable),
        Row(status: 503, body: fcmError(503, "UNAVAILABLE", "UNAVAILABLE"), answer: .retryable),
        Row(status: 500, body: fcmError(500, "INTERNAL", "INTERNAL"), answer: .retryable),
        Row(status: 401, body: fcmError(401, "UNAUTHENTICATED", nil), answer: .renewCredentials),
        Row(status: 401, body: fcmError(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR"), answer: .permanent),
        Row(status: 502, body: nil, answer: .retryable),
        Row(status: 418, body: nil, answer: .permanent),
    ]

    @Test("every FCM v1 error maps to its disposition", arguments: rows)
    func fcm(_ row: Row) {
        let body = row.body.flatMap { FCMErrorBody.parse(Array($0.utf8)) }
        if row.body != nil { #expect(body != nil) }
        #expect(FCMAnswerTable.classify(status: row.status, body: body) == row.answer)
    }

    @Test("FCM error body: code, status and reason text")
    func body() throws {
        let b = try #require(FCMErrorBody.parse(Array(Self.fcmError(404, "NOT_FOUND", "UNREGISTERED").utf8)))
        #expect(b.errorCode == .unregistered && b.status == "NOT_FOUND" && b.reasonText == "UNREGISTERED")
        #expect(FCMErrorBody.parse(Array("not json".utf8)) == nil)
        #expect(FCMErrorCode(wire: "NEW_ONE") == .unknown("NEW_ONE"))
    }

    @Test("Retry-After is honoured in seconds")
    func retryAfter() {
        #expect(FCMAnswerTable.retryAfter("30") == .seconds(30))
        #expect(FCMAnswerTable.retryAfter(" 5 ") == .seconds(5))
        #expect(FCMAnswerTable.retryAfter("soon") == nil)
        #expect(FCMAnswerTable.retryAfter(nil) == nil)
    }

    @Test(
        "webhook statuses: 2xx delivered, 408/429/5xx retried, other 4xx permanent",
        arguments: [
            (200, PushAnswerClass.delivered), (204, .delivered), (429, .retryable), (503, .retryable),
            (500, .retryable),
            (408, .retryable), (400, .permanent), (401, .permanent), (404, .permanent), (301, .permanent),
        ])
    func webhook(_ status: Int, _ answer: PushAnswerClass) {
        #expect(WebhookAnswerTable.classify(status: status) == answer)
    }

    @Test("webhook transport failures are retried, shutdown is not")
    func webhookFailures() {
        #expect(WebhookAnswerTable.classify(.deadlineExceeded) == .retryable)
        #expect(WebhookAnswerTable.classify(.connectFailed("x")) == .retryable)
        #expect(WebhookAnswerTable.classify(.clientShutdown) == .permanent)
    }
}

@Suite("Registry records with platform names")
struct PlatformRecordTests {
    @Test("a device given as a CometChat platform takes its kind; an unknown platform is refused")
    func platformField() throws {
        let d = try Device.fromJSON(
            Array(#"{"token":"t","platform":"FCM_ANDROID","provider_id":"fcm-provider-2"}"#.utf8))
        #expect(d.kind == .fcm && d.providerID == "fcm-provider-2")
        let v = try Device.fromJSON(Array(#"{"token":"t","platform":"APNS_iOS_VOIP"}"#.utf8))
        #expect(v.kind == .voip)
        #expect(throws: StageRecordError.self) {
            _ = try Device.fromJSON(Array(#"{"token":"t","platform":"PALM"}"#.utf8))
        }
        let record = try StageCodec.decode(
            RegistryRecord.self,
            from: Array(
                #"{"op":"register_device","app_id":"a","user":"u","device":{"token":"t","platform":"FCM_WEB"}}"#.utf8))
        #expect(record.device?.kind == .fcm)
    }
}
