// The payload of one recipient: the content every provider's payload starts from, and the APNs payload, written
// by hand into a byte buffer and shortened until it fits the limit.

import Foundation

extension Renderer {
    /// The per-recipient texts every provider's payload starts from: the body (templates, catalogs,
    /// translation, `em_push_content`), the title (app title template, or the sender for CometChat),
    /// and what the Sendbird object carries. Returns the content and the sender's shown name.
    static func content(
        event: ChatEvent, state: UserState, app: AppConfig,
        senderDisplayName: String?, cometchatTitle: Bool, burst: Int? = nil
    ) -> (PayloadContent, String) {
        let prefs = app.effectivePreferences(state.preferences)
        var body = body(event: event, preferences: prefs, app: app, senderDisplayName: senderDisplayName)
        if event.kind == .message || event.kind == .messageEdited, let pc = event.ext.apns.pushContent, !pc.isEmpty {
            body = pc
        }
        let update = burstText(event, burst: burst, app: app, languages: prefs.languages)
        if let update { body = update }
        var title: String?
        let sender = senderName(event, senderDisplayName)
        if let t = app.titleTemplate {
            let strings = app.strings(for: prefs.languages)
            let text = event.message.map { displayText($0, languages: prefs.languages) } ?? ""
            title = t.render { variable($0, event, sender, text, strings) }
        } else if cometchatTitle {
            title = event.kind == .groupAction ? (event.conversation.name ?? sender) : sender
        }
        var content = PayloadContent(
            title: title, body: body,
            detailText: event.kind == .messageDeleted ? "" : event.message?.text ?? "",
            translations: event.message?.translations ?? [],
            data: event.message?.data ?? "", extern: event.ext.apns.extern)
        content.silent = update != nil
        if let digest = event.digest { Digest.shape(&content, digest, strings: app.strings(for: prefs.languages)) }
        return (content, sender)
    }

    /// The body of a burst update ("3 new messages in Hiking", translated), or of a flood guard's summary (`burst`
    /// < 0: "3 new messages", whatever the conversations); nil for anything else.
    static func burstText(_ event: ChatEvent, burst: Int?, app: AppConfig, languages: [String]) -> String? {
        guard let burst, burst > 1 || burst < 0 else { return nil }
        let count = abs(burst)
        let strings = app.strings(for: languages)
        let named = burst > 0 && !(event.conversation.name ?? "").isEmpty
        return strings[named ? .burst : .burstUnnamed].render { v in
            switch v {
            case .count: return String(count)
            case .channelName: return event.conversation.name ?? ""
            default: return ""
            }
        }
    }

    /// What an APNs payload drops to fit, in order: FCM's parts, then the `loc-args`.
    static let apnsDrops = PayloadFit.standardDrops + [{ $0.locArgsDropped = true }]

    /// Renders the payload for one recipient and push type, shortened to fit (`PayloadFit`).
    public static func renderPayload(
        event: ChatEvent, recipient: String, state: UserState, app: AppConfig,
        senderDisplayName: String?,
        pushType: PushRequest.PushType, burst: Int? = nil, aps: APSFlags? = nil
    ) throws(RenderError) -> [UInt8] {
        let aps =
            aps
            ?? APSFlags(
                contentAvailable: app.payloadOptions.contentAvailable, mutableContent: app.payloadOptions.mutableContent
            )
        let prefs = app.effectivePreferences(state.preferences)
        let isCometChat: Bool = { if case .cometchat = app.payloadProfile { true } else { false } }()
        var (content, sender) = Self.content(
            event: event, state: state, app: app, senderDisplayName: senderDisplayName, cometchatTitle: isCometChat,
            burst: burst)
        if pushType == .alert {
            content.attention = app.interruption.attention(event, recipient: recipient, priority: app.priority)
        }
        let limit = pushType.payloadLimit
        let badge = app.badge(for: state, preferences: prefs)

        return try PayloadFit(limit: limit, drops: Self.apnsDrops).fit(content, what: "payload") { content in
            var w = JSONWriter(capacity: 768)
            write(event, recipient, state, app, sender, badge, content, pushType: pushType, aps: aps, into: &w)
            return w.bytes
        }
    }

    /// Shortens `text` so that its JSON-escaped form is at least `excess` bytes
    /// shorter, cutting on a character boundary and ending with `…`. Returns
    /// just `…` when nothing of the text fits.
    public static func shorten(_ text: String, by excess: Int) -> String {
        if excess <= 0 || text.isEmpty { return text }
        let current = JSONWriter.escapedLength(text) - 2
        let ellipsisBytes = 3
        let budget = current - excess - ellipsisBytes
        if budget <= 0 { return current > ellipsisBytes ? ellipsis : "" }
        var used = 0
        var end = text.startIndex
        for index in text.indices {
            let ch = text[index]
            let cost = JSONWriter.escapedLength(String(ch)) - 2
            if used + cost > budget { break }
            used += cost
            end = text.index(after: index)
        }
        return String(text[..<end]) + ellipsis
    }

    static func write(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ app: AppConfig, _ sender: String,
        _ badge: Int?, _ content: PayloadContent, pushType: PushRequest.PushType = .alert, aps: APSFlags,
        into w: inout JSONWriter
    ) {
        if pushType == .background {
            // A background push: no alert, sound or badge; the profile fields below tell the app what changed.
            w.raw("{\"aps\":{\"content-available\":1,\"thread-id\":"); w.string(event.conversation.id)
            w.byte(UInt8(ascii: "}"))
        } else {
            writeAlertAPS(event, app, badge, content, aps: aps, into: &w)
        }

        switch app.payloadProfile {
        case .compact: writeCompact(event, recipient, into: &w)
        case .sendbird(let key):
            writeSendbird(event, recipient, state, sender, content, key: key, app.payloadOptions, into: &w)
        case .cometchat: writeCometChat(event, recipient, state, sender, content, app.payloadOptions, into: &w)
        }
        if let e = content.extern { w.raw(",\"e\":"); w.value(e) }
        w.byte(UInt8(ascii: "}"))
    }

    /// `{"aps":{...}` of a visible notification (the closing brace of the payload is the caller's).
    static func writeAlertAPS(
        _ event: ChatEvent, _ app: AppConfig, _ badge: Int?, _ content: PayloadContent, aps: APSFlags,
        into w: inout JSONWriter
    ) {
        let a = event.ext.apns
        let options = app.payloadOptions
        if options.alertString {
            w.raw("{\"aps\":{\"alert\":"); w.string(content.body)
        } else {
            w.raw("{\"aps\":{\"alert\":{")
            var first = true
            if let title = content.title {
                w.key("title"); w.string(title); first = false
            }
            if !first { w.byte(UInt8(ascii: ",")) }
            w.key("body"); w.string(content.body)
            if let k = a.titleLocKey {
                w.raw(",\"title-loc-key\":"); w.string(k)
                if let args = a.titleLocArgs, !content.locArgsDropped {
                    w.raw(",\"title-loc-args\":"); w.stringArray(args)
                }
            }
            if let k = a.bodyLocKey {
                w.raw(",\"loc-key\":"); w.string(k)
                if let args = a.bodyLocArgs, !content.locArgsDropped { w.raw(",\"loc-args\":"); w.stringArray(args) }
            }
            w.byte(UInt8(ascii: "}"))
        }
        if let badge { w.raw(",\"badge\":"); w.int(badge) }
        if !content.silent && !a.soundSilenced {
            w.raw(",\"sound\":"); w.string(a.sound ?? options.sound(conversation: event.conversation.id))
        }
        if let cat = a.category { w.raw(",\"category\":"); w.string(cat) }
        if aps.contentAvailable { w.raw(",\"content-available\":1") }
        if a.mutableContent || aps.mutableContent { w.raw(",\"mutable-content\":1") }
        w.raw(",\"thread-id\":"); w.string(event.conversation.id)
        content.attention.write(into: &w)
        w.byte(UInt8(ascii: "}"))
    }
}
