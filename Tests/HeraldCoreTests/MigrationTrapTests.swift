// What a team leaving Sendbird or CometChat relies on field for field: Sendbird's recipient nickname, per
// conversation channel type, is_hidden and channel_unread_mention_count; CometChat's receiverAvatar, full message
// object (APNs and FCM alike) and per-credential aps flags; and the webhook called for every recipient.

import Foundation
import HeraldCore
import Testing

/// A group message event with the conversation and message fields the vendors' payloads read.
func migrationEvent(
    conversation: String = #"{"id":"c1","type":"group","name":"Hiking"}"#,
    message: String = #"{"id":"77","text":"Bye!","mentions":["u2"]}"#, recipients: [String] = ["u2"]
) throws -> ChatEvent {
    try event(
        #"{"event_id":"e1","app_id":"app1","kind":"message","created_at":1732000000000,"#
            + #""sender":{"id":"u1","name":"Cindy","profile_url":"https://img.example/u1.png"},"#
            + #""conversation":\#(conversation),"recipients":[\#(recipients.map { "\"\($0)\"" }.joined(separator: ","))],"#
            + #""message":\#(message)}"#)
}

let sendbirdMentionApp: AppConfig = {
    var o = PayloadOptions()
    o.sendbirdMentionedUsers = true
    return AppConfig(
        appID: "app1", payloadProfile: .sendbird(key: "sendbird"), credentials: sendbirdApp.credentials,
        payloadOptions: o)
}()

func cometMessageApp(_ credentials: [APNsCredential]? = nil, contentAvailable: Bool = false) -> AppConfig {
    var o = PayloadOptions()
    o.cometchatIncludeMessage = true
    o.contentAvailable = contentAvailable
    return AppConfig(
        appID: "app1", payloadProfile: .cometchat, credentials: credentials ?? cometApp.credentials,
        fcmCredentials: [FCMCredential(providerID: "android", serviceAccountFile: "sa.json")], payloadOptions: o)
}

@Suite("Migration traps: Sendbird fields")
struct SendbirdMigrationTests {
    @Test("recipient.name is the recipient's nickname (else their push display name, else empty)")
    func recipientNickname() throws {
        let e = try migrationEvent()
        var prefs = Preferences(displayName: "Pushy")
        prefs.nickname = "Rosa"
        for (prefs, name) in [(prefs, "Rosa"), (Preferences(displayName: "Pushy"), "Pushy"), (Preferences(), "")] {
            let (_, requests) = try run(e, to: "u2", state: user(prefs: prefs), app: sendbirdMentionApp)
            let p = try payload(try #require(requests.first))
            #expect(p["sendbird"]?["recipient"]?["name"] == .string(name))
            #expect(p["sendbird"]?["recipient"]?["id"] == .string("u2"))
        }
    }

    @Test("channel_type comes from the event's conversation; without it the app's setting (groups) or messaging")
    func channelTypePerConversation() throws {
        let rows: [(String, String)] = [
            (#"{"id":"c1","type":"group","channel_type":"chat"}"#, "chat"),
            (#"{"id":"c1","type":"direct","channel_type":"group_messaging"}"#, "group_messaging"),
            (#"{"id":"c1","type":"group"}"#, "group_messaging"),
            (#"{"id":"c1","type":"direct"}"#, "messaging"),
        ]
        for (conversation, expected) in rows {
            let (_, requests) = try run(
                try migrationEvent(conversation: conversation), to: "u2", state: user(), app: sendbirdMentionApp)
            let p = try payload(try #require(requests.first))
            #expect(p["sendbird"]?["channel_type"] == .string(expected), "\(conversation)")
        }
        #expect(throws: FieldError.self) {
            try migrationEvent(conversation: #"{"id":"c1","type":"group","channel_type":"open"}"#)
        }
    }

    @Test("mentioned_users.is_hidden is true when the recipient hid the conversation (conversation.hidden_by)")
    func isHidden() throws {
        for (hidden, expected) in [(#"["u2"]"#, true), (#"["u3"]"#, false), ("[]", false)] {
            let e = try migrationEvent(conversation: #"{"id":"c1","type":"group","hidden_by":\#(hidden)}"#)
            let (_, requests) = try run(e, to: "u2", state: user(), app: sendbirdMentionApp)
            let p = try payload(try #require(requests.first))
            #expect(p["sendbird"]?["mentioned_users"]?["is_hidden"] == .bool(expected), "\(hidden)")
        }
    }

    @Test("channel_unread_mention_count is the number of conversations with an unread mention, not one's mentions")
    func channelUnreadMentionCount() throws {
        let e = try migrationEvent()
        // Three mentions in c1 and one in c2: two conversations. The count Herald's counter answered wins.
        var state = user()
        state.unread.mentionTotal = 4
        state.unread.mentionConversations = ["c1": 3, "c2": 1, "c3": 0]
        var (_, requests) = try run(e, to: "u2", state: state, app: sendbirdMentionApp)
        var mentioned = try payload(try #require(requests.first))["sendbird"]?["mentioned_users"]
        #expect(mentioned?["total_unread_mention_count"] == .number("4"))
        #expect(mentioned?["channel_unread_mention_count"] == .number("2"))
        let after = CountsAfter(
            counted: true, unreadTotal: 9, unreadConversation: 4, mentionTotal: 6, mentionConversation: 4,
            mentionedConversations: 5)
        let counted = Counting.applying(after, to: user().scoped(to: "c1"), conversation: "c1")
        (_, requests) = try run(e, to: "u2", state: counted, app: sendbirdMentionApp)
        mentioned = try payload(try #require(requests.first))["sendbird"]?["mentioned_users"]
        #expect(mentioned?["channel_unread_mention_count"] == .number("5"))
        #expect(mentioned?["total_unread_mention_count"] == .number("6"))
    }

    @Test("a nickname is a preference the registry stores: set, cleared, and carried in both record forms")
    func nicknamePreference() throws {
        let patch = try PreferencePatch.parse(Array(#"{"nickname":"Rosa"}"#.utf8))
        let stored = patch.apply(to: Preferences())
        #expect(stored.nickname == "Rosa")
        #expect(try PreferencePatch(json: try JSONValue.parse(patch.jsonBytes())) == patch)
        let cleared = try PreferencePatch.parse(Array(#"{"nickname":null}"#.utf8)).apply(to: stored)
        #expect(cleared.nickname == nil)
        #expect(try PreferencePatch.parse(Array(#"{"nickname":""}"#.utf8)).clear == [.nickname])
        #expect(throws: FieldError.self) {
            try PreferencePatch.parse(Array("{\"nickname\":\"\(String(repeating: "n", count: 257))\"}".utf8))
        }
        #expect(try Preferences.fromJSON(stored.jsonBytes()) == stored)
        let record = ResolvedRecord(event: try migrationEvent(), recipient: "u2", state: user(prefs: stored))
        #expect(try StageCodec.decode(ResolvedRecord.self, from: record.wireBytes()) == record)
        #expect(try StageCodec.decode(ResolvedRecord.self, from: record.jsonBytes()) == record)
    }
}

@Suite("Migration traps: CometChat fields")
struct CometChatMigrationTests {
    @Test("receiverAvatar is the group's avatar, or in a direct conversation the receiver's; receiverName a nickname")
    func receiverAvatar() throws {
        let group = try migrationEvent(
            conversation: #"{"id":"g1","type":"group","name":"Hiking","avatar_url":"https://img.example/g1.png"}"#)
        var (_, requests) = try run(group, to: "u2", state: user(), app: cometApp)
        var p = try payload(try #require(requests.first))
        #expect(p["receiverAvatar"] == .string("https://img.example/g1.png"))
        #expect(p["receiverName"] == .string("Hiking") && p["receiver"] == .string("g1"))

        let direct = try migrationEvent(
            conversation: #"{"id":"u1_user_u2","type":"direct","avatar_url":"https://img.example/u2.png"}"#)
        var prefs = Preferences()
        prefs.nickname = "Rosa"
        (_, requests) = try run(direct, to: "u2", state: user(prefs: prefs), app: cometApp)
        p = try payload(try #require(requests.first))
        #expect(p["receiverAvatar"] == .string("https://img.example/u2.png"))
        #expect(p["receiverName"] == .string("Rosa") && p["receiver"] == .string("u2"))

        (_, requests) = try run(try migrationEvent(), to: "u2", state: user(), app: cometApp)
        #expect(try payload(try #require(requests.first))["receiverAvatar"] == nil)
    }

    @Test("the message object carries metadata and every attachment, in APNs and (as a string) in FCM data")
    func fullMessageObject() throws {
        let e = try migrationEvent(
            message: #"""
                {"id":"77","type":"file","text":"photos","metadata":{"pinned":true,"reply_to":"76"},
                 "file":{"name":"a.JPG","mime_type":"image/jpeg","url":"https://f.example/a.jpg"},
                 "attachments":[{"name":"b.png","mime_type":"image/png","url":"https://f.example/b.png"}]}
                """#)
        let expectedData = json(
            #"""
            {"text":"photos","metadata":{"pinned":true,"reply_to":"76"},
             "attachments":[{"name":"a.JPG","mimeType":"image/jpeg","extension":"jpg","url":"https://f.example/a.jpg"},
                            {"name":"b.png","mimeType":"image/png","extension":"png","url":"https://f.example/b.png"}],
             "entities":{"sender":{"entityType":"user","entity":{"uid":"u1","name":"Cindy","avatar":"https://img.example/u1.png"}},
                         "receiver":{"entityType":"group","entity":{"guid":"c1","name":"Hiking"}}}}
            """#)
        let app = cometMessageApp()
        let state = user(devices: [device(bundle: nil), Device(token: "fcm-1", kind: .fcm, providerID: "android")])
        let (_, requests) = try run(e, to: "u2", state: state, app: app)
        #expect(requests.count == 2)
        let apnsRequest = try #require(requests.first { $0.provider == .apns })
        let apns = try #require(try payload(apnsRequest)["message"])
        #expect(canonical(try #require(apns["data"])) == canonical(expectedData))
        #expect(apns["type"] == .string("image") && apns["url"] == .string("https://f.example/a.jpg"))
        #expect(apns["id"] == .string("77") && apns["receiverType"] == .string("group"))
        let fcm = try fcmMessage(try #require(requests.first { $0.provider == .fcm }))
        #expect(allStrings(fcm["data"]))
        guard case .string(let text)? = fcm["data"]?["message"] else {
            Issue.record("FCM data has no message string: \(String(describing: fcm["data"]))")
            return
        }
        #expect(canonical(try JSONValue.parse(Array(text.utf8))) == canonical(apns))
    }

    @Test("a payload too large drops the message object's metadata and extra attachments before cutting the body")
    func extrasDropFirst() throws {
        let attachments = (0..<10).map {
            #"{"name":"f\#($0).png","url":"https://f.example/\#(String(repeating: "x", count: 300))/\#($0).png"}"#
        }
        let e = try migrationEvent(
            message: #"{"id":"77","text":"short","attachments":[\#(attachments.joined(separator: ","))]}"#)
        let (_, requests) = try run(e, to: "u2", state: user(devices: [device(bundle: nil)]), app: cometMessageApp())
        let r = try #require(requests.first)
        #expect(r.payload.count <= 4096)
        let p = try payload(r)
        #expect(p["body"] == .string("short"))
        #expect(p["message"]?["data"]?["attachments"] == nil)
    }

    @Test("content-available and mutable-content per APNs credential; the app's setting reaches FCM's apns block")
    func apsFlagsPerCredential() throws {
        var quiet = APNsCredential(bundleID: "com.example.a", teamID: "T", keyID: "K", keyFile: "k.p8")
        quiet.providerID = "apns-quiet"
        var rich = APNsCredential(bundleID: "com.example.b", teamID: "T", keyID: "K", keyFile: "k.p8")
        rich.providerID = "apns-rich"
        rich.contentAvailable = false
        rich.mutableContent = true
        let app = cometMessageApp([quiet, rich], contentAvailable: true)
        var a = device(tokenA, bundle: nil)
        a.providerID = "apns-quiet"
        var b = device(tokenB, bundle: nil)
        b.providerID = "apns-rich"
        let fcm = Device(token: "fcm-1", kind: .fcm, providerID: "android")
        let (_, requests) = try run(try migrationEvent(), to: "u2", state: user(devices: [a, b, fcm]), app: app)
        #expect(requests.count == 3)
        let apsA = try payload(try #require(requests.first { $0.token == tokenA }))["aps"]
        #expect(apsA?["content-available"] == .number("1") && apsA?["mutable-content"] == nil)
        #expect(requests.first { $0.token == tokenA }?.topic == "com.example.a")
        let apsB = try payload(try #require(requests.first { $0.token == tokenB }))["aps"]
        #expect(apsB?["content-available"] == nil && apsB?["mutable-content"] == .number("1"))
        #expect(requests.first { $0.token == tokenB }?.topic == "com.example.b")
        let fcmAps = try fcmMessage(try #require(requests.first { $0.provider == .fcm }))["apns"]?["payload"]?["aps"]
        #expect(fcmAps?["content-available"] == .number("1") && fcmAps?["mutable-content"] == nil)
        // A device without a provider id is sent with the credential of its bundle id, whose flags it gets.
        let byBundle = device(tokenA, bundle: "com.example.b")
        let (_, bundled) = try run(try migrationEvent(), to: "u2", state: user(devices: [byBundle]), app: app)
        let apsBundled = try payload(try #require(bundled.first))["aps"]
        #expect(apsBundled?["content-available"] == nil && apsBundled?["mutable-content"] == .number("1"))
    }
}

@Suite("Migration traps: the webhook called for every recipient")
struct EveryRecipientWebhookTests {
    func app(everyRecipient: Bool, multiDevice: MultiDeviceMode = .allOffline) -> AppConfig {
        AppConfig(
            appID: "app1", payloadProfile: .cometchat, multiDevice: multiDevice, credentials: cometApp.credentials,
            webhooks: [
                WebhookCredential(providerID: "hook", url: "https://hooks.example/push", everyRecipient: everyRecipient)
            ])
    }

    @Test("a user with no device gets the webhook post; without the mode nothing is sent (no_devices)")
    func noDevices() throws {
        let e = try migrationEvent(recipients: ["u2", "u3"])
        let (decision, requests) = try run(e, to: "u2", state: user(devices: []), app: app(everyRecipient: true))
        #expect(decision.targets.map(\.kind) == [.webhook])
        let r = try #require(requests.first)
        #expect(requests.count == 1 && r.provider == .webhook && r.providerID == "hook")
        let body = try payload(r)
        #expect(body["data"]?["to"]?["uid"] == .string("u2"))
        // Each recipient is its own (event, token) pair, so send's claims never take one for a duplicate.
        let (other, _) = try run(e, to: "u3", state: user(devices: []), app: app(everyRecipient: true))
        #expect(Set(decision.targets.map(\.token)).isDisjoint(with: other.targets.map(\.token)))
        let (off, none) = try run(e, to: "u2", state: user(devices: []), app: app(everyRecipient: false))
        #expect(off == .suppress(.noDevices) && none.isEmpty)
    }

    @Test("the user's own devices are sent to beside it; a registered webhook device of it is not doubled")
    func besideDevices() throws {
        let e = try migrationEvent()
        var (decision, requests) = try run(
            e, to: "u2", state: user(devices: [device()]), app: app(everyRecipient: true))
        #expect(decision.targets.map(\.kind) == [.apns, .webhook])
        #expect(Set(requests.map(\.provider)) == [.apns, .webhook])
        let own = Device(token: "hook-user", kind: .webhook, providerID: "hook")
        (decision, requests) = try run(e, to: "u2", state: user(devices: [own]), app: app(everyRecipient: true))
        #expect(decision.targets == [own] && requests.count == 1)
    }

    @Test("the rules still apply: online, muted, the sender and app_off suppress the webhook post too")
    func rulesApply() throws {
        let e = try migrationEvent()
        let hook = app(everyRecipient: true)
        #expect(try run(e, to: "u2", state: user(devices: [], online: ["t"]), app: hook).0 == .suppress(.online))
        for mode in [MultiDeviceMode.anyOffline, .offlineOnly] {
            #expect(
                try run(
                    e, to: "u2", state: user(devices: [], online: ["t"]),
                    app: app(everyRecipient: true, multiDevice: mode)
                )
                .0 == .suppress(.online))
            let (decision, _) = try run(
                e, to: "u2", state: user(devices: []), app: app(everyRecipient: true, multiDevice: mode))
            #expect(decision.targets.map(\.kind) == [.webhook])
        }
        var muted = Preferences()
        muted.conversations["c1"] = ConversationPreference(muted: true)
        #expect(try run(e, to: "u2", state: user(devices: [], prefs: muted), app: hook).0 == .suppress(.muted))
        #expect(try run(e, to: "u1", state: user(devices: []), app: hook).0 == .suppress(.sender))
        var off = hook
        off.push = false
        #expect(try run(e, to: "u2", state: user(devices: []), app: off).0 == .suppress(.appOff))
    }
}

@Suite("Migration traps: the new event fields")
struct MigrationEventFieldTests {
    @Test("channel type, avatar, hiding members, metadata and attachments survive both record forms and the rules read")
    func roundTrips() throws {
        let e = try migrationEvent(
            conversation:
                #"{"id":"c1","type":"group","channel_type":"chat","avatar_url":"https://img.example/g.png","hidden_by":["u2","u9"]}"#,
            message:
                #"{"id":"77","text":"hi","mentions":["u2"],"metadata":{"k":[1,2]},"attachments":[{"name":"a.pdf","mime_type":"application/pdf","url":"https://f.example/a.pdf"}]}"#
        )
        #expect(e.conversation.channelType == "chat" && e.conversation.hiddenBy == ["u2", "u9"])
        #expect(e.message?.attachments.count == 1 && e.message?.metadata == json(#"{"k":[1,2]}"#))
        #expect(try ChatEvent.decode(e.jsonBytes) == e)
        var state = user()
        state.preferences.nickname = "Rosa"
        state.unread.storedMentionedConversations = 3
        let record = DeliverableRecord(event: e, recipient: "u2", state: state, targets: [device()])
        #expect(try StageCodec.decode(DeliverableRecord.self, from: record.wireBytes()) == record)
        #expect(try StageCodec.decode(DeliverableRecord.self, from: record.jsonBytes()) == record)
        let resolved = ResolvedRecord(event: e, recipient: "u2", state: state)
        var reuse = EventReuse()
        let rules = try ResolvedRecord.readForRules(resolved.wireBytes(), reusing: &reuse)
        #expect(rules.forwarded != nil)
        #expect(rules.record.recipient == "u2" && rules.record.event.message?.mentions == ["u2"])
    }

    @Test("bad values of the new fields are refused naming the field")
    func refused() throws {
        let rows: [(String, String, String)] = [
            (#"{"id":"c1","type":"group","channel_type":"open"}"#, #"{"id":"1"}"#, "conversation.channel_type"),
            (#"{"id":"c1","type":"group","hidden_by":[""]}"#, #"{"id":"1"}"#, "conversation.hidden_by[0]"),
            (#"{"id":"c1","type":"group"}"#, #"{"id":"1","metadata":"x"}"#, "message.metadata"),
            (
                #"{"id":"c1","type":"group"}"#,
                #"{"id":"1","metadata":{"k":"\#(String(repeating: "m", count: 2100))"}}"#, "message.metadata"
            ),
            (#"{"id":"c1","type":"group"}"#, #"{"id":"1","attachments":{}}"#, "message.attachments"),
            (#"{"id":"c1","type":"group"}"#, #"{"id":"1","attachments":[1]}"#, "message.attachments[0]"),
            (
                #"{"id":"c1","type":"group"}"#,
                #"{"id":"1","attachments":[\#(Array(repeating: "{}", count: 11).joined(separator: ","))]}"#,
                "message.attachments"
            ),
        ]
        for (conversation, message, field) in rows {
            do {
                _ = try migrationEvent(conversation: conversation, message: message)
                Issue.record("accepted \(conversation) \(message)")
            } catch let error as FieldError {
                #expect(error.field == field, "\(conversation) \(message): \(error)")
            }
        }
    }
}
