// FCM HTTP v1 messages (docs/providers.md): the body of
// `POST /v1/projects/{project}/messages:send` for one registration token, in
// the app's payload profile, built from the same texts as the APNs payload
// (templates, catalogs, translations, display style, badge) and shortened the
// same way to fit FCM's 4,096-byte limit.

/// Builds FCM HTTP v1 requests.
///
/// Shape (`{"message":{...}}`):
/// - `token`: the registration token.
/// - `notification` `{title, body}`: chat messages when the credential's `include_notification` is on
///   (the default); never for calls, which are data-only so the app can ring its own call screen.
/// - `data`: string values only. Per profile: compact `f`/`t`/`m`/`g`/`e` (+ `call` as JSON text);
///   Sendbird `message` and `sendbird` (the nested object as JSON text, as Sendbird's Android SDK
///   reads it); CometChat the flat fields of its document. Compact and CometChat carry `title`
///   (when there is one) and `body`, Sendbird `message` (and `title`); data-only messages add `badge`.
/// - `android`: `priority` `high` for calls, `normal` otherwise; `ttl` from the app's expiration
///   settings; `collapse_key` `call-<session>` for calls; `notification` (with the `notification`
///   block only) with `sound`, `notification_count` (the badge), the app's `channel_id` and
///   `click_action`, and for CometChat the `tag` of its payload.
/// - `apns` (with the `notification` block only): `aps` `sound`, `badge`, `thread-id`, for iOS
///   apps that receive through FCM.
public enum FCMMessage {
    /// FCM rejects messages whose payload exceeds 4,096 bytes; Herald keeps the whole request body within it.
    public static let payloadLimit = 4096

    /// The request for one FCM device of one recipient.
    static func request(
        event: ChatEvent, recipient: String, state: UserState, device: Device, app: AppConfig,
        senderDisplayName: String?, burst: Int? = nil, eventSeconds: Int64
    ) throws(RenderError) -> PushRequest {
        guard let credential = app.fcmCredential(device.providerID) else {
            throw RenderError.noFCMCredential(device, app: app)
        }
        let isCall = event.kind == .call
        let payload = try payload(
            event: event, recipient: recipient, state: state, app: app, token: device.token,
            includeNotification: credential.includeNotification,
            senderDisplayName: senderDisplayName, burst: burst)
        let ttl = isCall ? app.callExpirationSeconds : app.expirationSeconds
        let (sum, overflow) = eventSeconds.addingReportingOverflow(ttl)
        return PushRequest(
            token: device.token, environment: .production, pushType: .alert,
            topic: credential.providerID, priority: isCall ? 10 : 5,
            collapseID: burst.map { Coalescing.collapseID(event, burst: $0) } ?? collapseKey(event),
            expiration: overflow ? Int64.max : max(0, sum),
            apnsID: APNsID.derive(eventID: event.eventID, token: device.token), payload: payload,
            provider: .fcm, providerID: credential.providerID)
    }

    static func collapseKey(_ event: ChatEvent) -> String? {
        guard event.kind == .call, let call = event.call else { return nil }
        return "call-" + call.sessionID
    }

    /// The `{"message":{...}}` body for one token, within `payloadLimit`.
    public static func payload(
        event: ChatEvent, recipient: String, state: UserState, app: AppConfig, token: String,
        includeNotification: Bool, senderDisplayName: String?, burst: Int? = nil
    ) throws(RenderError) -> [UInt8] {
        let isCometChat: Bool = { if case .cometchat = app.payloadProfile { true } else { false } }()
        var (original, sender) = Renderer.content(
            event: event, state: state, app: app,
            senderDisplayName: senderDisplayName, cometchatTitle: isCometChat, burst: burst)
        // iOS apps that receive through FCM read the same interruption level and relevance in `apns.payload.aps`.
        original.attention = app.interruption.attention(event, recipient: recipient, priority: app.priority)
        let prefs = app.effectivePreferences(state.preferences)
        let shape = Shape(
            event: event, recipient: recipient, state: state, app: app, sender: sender, token: token,
            notify: includeNotification && event.kind != .call && event.kind != .messageDeleted,
            badge: app.badge(for: state, preferences: prefs),
            burstTag: burst.map { Coalescing.collapseID(event, burst: $0) })
        return try PayloadFit(limit: payloadLimit).fit(original, what: "FCM message") { shape.write($0) }
    }

    /// Everything but the shortenable texts, fixed for one recipient and token.
    struct Shape {
        let event: ChatEvent
        let recipient: String
        let state: UserState
        let app: AppConfig
        let sender: String
        let token: String
        let notify: Bool
        let badge: Int?
        /// A coalesced burst's `collapse_key` and notification `tag`, so an update replaces the shown one.
        let burstTag: String?

        func write(_ content: PayloadContent) -> [UInt8] {
            let isCall = event.kind == .call
            // nil: `em_push_sound: null`, no sound at all.
            let sound: String? = event.ext.apns.soundSilenced ? nil : event.ext.apns.sound ?? "default"
            var w = JSONWriter(capacity: 1024)
            w.raw("{\"message\":{\"token\":"); w.string(token)
            if notify {
                w.raw(",\"notification\":{")
                if let title = content.title { w.key("title"); w.string(title); w.byte(UInt8(ascii: ",")) }
                w.key("body"); w.string(content.body)
                w.byte(UInt8(ascii: "}"))
            }
            w.raw(",\"data\":{")
            writeData(content, into: &w)
            w.raw("},\"android\":{\"priority\":")
            w.raw(isCall ? "\"high\"" : "\"normal\"")
            w.raw(",\"ttl\":\""); w.int(isCall ? app.callExpirationSeconds : app.expirationSeconds); w.raw("s\"")
            if let key = burstTag ?? collapseKey(event) { w.raw(",\"collapse_key\":"); w.string(key) }
            if notify {
                w.raw(",\"notification\":{")
                var first = false
                if content.silent {
                    w.raw("\"notification_priority\":\"PRIORITY_LOW\"")
                } else if let sound {
                    w.raw("\"sound\":"); w.string(sound)
                } else {
                    first = true
                }
                if let badge {
                    w.raw(first ? "\"notification_count\":" : ",\"notification_count\":"); w.int(badge)
                    first = false
                }
                if let channel = app.fcm.channelID {
                    w.raw(first ? "\"channel_id\":" : ",\"channel_id\":"); w.string(channel)
                    first = false
                }
                if let click = app.fcm.clickAction {
                    w.raw(first ? "\"click_action\":" : ",\"click_action\":"); w.string(click)
                    first = false
                }
                if let tag = burstTag {
                    w.raw(first ? "\"tag\":" : ",\"tag\":"); w.string(tag)
                } else if case .cometchat = app.payloadProfile {
                    w.raw(first ? "\"tag\":" : ",\"tag\":"); w.string(cometChatTag(event))
                }
                w.byte(UInt8(ascii: "}"))
            }
            w.byte(UInt8(ascii: "}"))
            if notify {
                w.raw(",\"apns\":{")
                if let tag = burstTag { w.raw("\"headers\":{\"apns-collapse-id\":"); w.string(tag); w.raw("},") }
                w.raw("\"payload\":{\"aps\":{")
                if !content.silent, let sound { w.raw("\"sound\":"); w.string(sound); w.byte(UInt8(ascii: ",")) }
                w.raw("\"thread-id\":"); w.string(event.conversation.id)
                if let badge { w.raw(",\"badge\":"); w.int(badge) }
                if let category = event.ext.apns.category { w.raw(",\"category\":"); w.string(category) }
                // The app's `apns:` options reach iOS devices that receive through FCM too.
                if app.payloadOptions.contentAvailable { w.raw(",\"content-available\":1") }
                if event.ext.apns.mutableContent || app.payloadOptions.mutableContent {
                    w.raw(",\"mutable-content\":1")
                }
                content.attention.write(into: &w)
                w.raw("}}}")
            }
            w.raw("}}")
            return w.bytes
        }

        /// `data`: every value a string.
        func writeData(_ content: PayloadContent, into w: inout JSONWriter) {
            switch app.payloadProfile {
            case .compact:
                Renderer.writeCompactIDs(event, recipient, into: &w)
                if let call = event.call {
                    var c = JSONWriter(capacity: 128)
                    Renderer.writeCallObject(call, into: &c)
                    // writeCallObject writes `,"call":{...}`: keep the object.
                    w.raw(",\"call\":"); w.string(String(decoding: c.bytes.dropFirst(8), as: UTF8.self))
                }
                if let action = Renderer.messageAction(event) { w.raw(",\"action\":"); w.string(action) }
                if let title = content.title { w.raw(",\"title\":"); w.string(title) }
                w.raw(",\"body\":"); w.string(content.body)
            case .sendbird(let key):
                w.raw("\"message\":"); w.string(content.body)
                if let title = content.title { w.raw(",\"title\":"); w.string(title) }
                var o = JSONWriter(capacity: 768)
                Renderer.writeSendbirdObject(event, recipient, state, sender, content, app.payloadOptions, into: &o)
                w.byte(UInt8(ascii: ",")); w.key(key); w.string(o.string)
            case .cometchat:
                var o = JSONWriter(capacity: 512)
                // FCM data values are strings: the `message` object is written as a JSON string; `custom` is for
                // APNs and webhooks only.
                Renderer.writeCometChat(
                    event, recipient, state, sender, content, app.payloadOptions, messageAsString: true, into: &o)
                w.bytes.append(contentsOf: o.bytes.dropFirst())  // its fields start with a comma
            }
            if let e = content.extern {
                w.raw(",\"e\":")
                if case .string(let text) = e { w.string(text) } else { w.string(e.serialized) }
            }
            if !notify, let badge { w.raw(",\"badge\":\""); w.int(badge); w.byte(UInt8(ascii: "\"")) }
        }
    }

    /// CometChat's `tag`: the message id (the notification's id on the device), the reacted-to message,
    /// the group for group actions.
    static func cometChatTag(_ event: ChatEvent) -> String {
        switch event.kind {
        case .message, .messageEdited, .messageDeleted: return event.message?.id ?? event.eventID
        case .reaction: return event.reaction?.messageID ?? event.message?.id ?? event.eventID
        case .groupAction, .conversationRead: return event.conversation.id
        case .call: return event.message?.id ?? event.call?.sessionID ?? event.eventID
        }
    }
}
