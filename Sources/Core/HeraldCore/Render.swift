// Rendering (docs/behaviour.md §7): picks template, language and translation for one
// recipient and builds one APNs request per target device. The payload is
// written by hand into a byte buffer and always fits the APNs limit.

import Foundation

/// One rendered request to a push provider: headers and the JSON payload. Named after APNs, its first
/// provider; `provider` says which service it is for. For FCM and webhook requests `topic` and
/// `providerID` name the credential, `priority` is 10 (FCM `high`) or 5 (`normal`), `collapseID` is
/// FCM's `collapse_key`, `apnsID` is the same derived trace id, and `payload` is the complete HTTP body
/// (FCM: `{"message":{...}}`; webhook: CometChat's `push-notification-payload-generated` object).
public struct PushRequest: Sendable, Hashable {
    /// Render writes `alert` (chat) or `voip` (calls).
    public typealias PushType = APNsPushType

    /// The request's values, behind one reference (`CopyOnWrite`): a request is copied into the outbound
    /// record, the send loop's jobs and the provider client's deliveries, and a copy is then one retain.
    struct Values: Sendable, Hashable {
        var token: String
        var environment: APNsEnvironment
        var pushType: PushType
        var topic: String
        var priority: Int
        var collapseID: String?
        var expiration: Int64
        var apnsID: String
        var payload: [UInt8]
        var provider: PushProvider
        var providerID: String?
        var guesses: Guesses
    }

    /// What render guessed in an APNs request (the device did not say it, nor did a credential its provider id
    /// names), and whether this is the one retry on the other environment. Send removes a token only for an answer
    /// about what the device was registered with (docs/providers.md, "Dead tokens").
    public struct Guesses: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// The environment is Herald's default, production.
        public static let environment = Guesses(rawValue: 1)
        /// The topic is the app's first credential's bundle id.
        public static let topic = Guesses(rawValue: 2)
        /// The request is the retry of a guessed environment on the other one.
        public static let otherEnvironment = Guesses(rawValue: 4)
        static let all: Guesses = [.environment, .topic, .otherEnvironment]
    }

    private var values: CopyOnWrite<Values>

    /// Full device token (never log it whole).
    public var token: String {
        get { values.value.token }
        set { values.modify { $0.token = newValue } }
        _modify { yield &values.value.token }
    }
    public var environment: APNsEnvironment {
        get { values.value.environment }
        set { values.modify { $0.environment = newValue } }
        _modify { yield &values.value.environment }
    }
    public var pushType: PushType {
        get { values.value.pushType }
        set { values.modify { $0.pushType = newValue } }
        _modify { yield &values.value.pushType }
    }
    /// `apns-topic`: the bundle id, `<bundle>.voip` for VoIP.
    public var topic: String {
        get { values.value.topic }
        set { values.modify { $0.topic = newValue } }
        _modify { yield &values.value.topic }
    }
    /// `apns-priority`: 10 to alert now, 5 for background.
    public var priority: Int {
        get { values.value.priority }
        set { values.modify { $0.priority = newValue } }
        _modify { yield &values.value.priority }
    }
    /// `apns-collapse-id` (at most 64 bytes), or nil.
    public var collapseID: String? {
        get { values.value.collapseID }
        set { values.modify { $0.collapseID = newValue } }
        _modify { yield &values.value.collapseID }
    }
    /// `apns-expiration`, epoch seconds; 0 means "try once".
    public var expiration: Int64 {
        get { values.value.expiration }
        set { values.modify { $0.expiration = newValue } }
        _modify { yield &values.value.expiration }
    }
    /// `apns-id`, derived from (event id, token): see `APNsID`.
    public var apnsID: String {
        get { values.value.apnsID }
        set { values.modify { $0.apnsID = newValue } }
        _modify { yield &values.value.apnsID }
    }
    /// The payload: UTF-8 JSON, within `pushType.payloadLimit` (FCM: `FCMMessage.payloadLimit`).
    public var payload: [UInt8] {
        get { values.value.payload }
        set { values.modify { $0.payload = newValue } }
        _modify { yield &values.value.payload }
    }
    /// Which service this request is for (`apns` when absent on the wire).
    public var provider: PushProvider {
        get { values.value.provider }
        set { values.modify { $0.provider = newValue } }
        _modify { yield &values.value.provider }
    }
    /// The FCM or webhook credential's provider id; nil for APNs.
    public var providerID: String? {
        get { values.value.providerID }
        set { values.modify { $0.providerID = newValue } }
        _modify { yield &values.value.providerID }
    }
    /// What render guessed (APNs only).
    public var guesses: Guesses {
        get { values.value.guesses }
        set { values.modify { $0.guesses = newValue } }
        _modify { yield &values.value.guesses }
    }

    public init(
        token: String, environment: APNsEnvironment, pushType: PushType, topic: String, priority: Int,
        collapseID: String?, expiration: Int64, apnsID: String, payload: [UInt8],
        provider: PushProvider = .apns, providerID: String? = nil, guesses: Guesses = []
    ) {
        values = CopyOnWrite(
            Values(
                token: token, environment: environment, pushType: pushType, topic: topic, priority: priority,
                collapseID: collapseID, expiration: expiration, apnsID: apnsID, payload: payload, provider: provider,
                providerID: providerID, guesses: guesses))
    }

    /// The payload as text.
    public var payloadString: String { String(decoding: payload, as: UTF8.self) }
}

/// Why rendering failed; the record goes to the DLQ with this reason.
public struct RenderError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Code: String, Sendable, Hashable {
        /// The device has no bundle id and the app has no credential to take one from.
        case noTopic = "no_topic"
        /// Even the minimal payload exceeds the limit (cannot happen within the event limits).
        case payloadTooLarge = "payload_too_large"
        /// An FCM or webhook device names a provider id the app has no credential for (or the app has none).
        case noProvider = "no_provider"
    }
    public var code: Code
    public var detail: String
    public var description: String { "\(code.rawValue): \(detail)" }

    /// An APNs device without a bundle id in an app without a credential to take one from.
    static func noTopic(_ device: Device, app: AppConfig) -> RenderError {
        RenderError(
            code: .noTopic,
            detail: "device \(String(device.token.prefix(8)))… has no bundle_id and app \(app.appID) has no credential")
    }

    /// An FCM device naming a provider the app has no credential for.
    static func noFCMCredential(_ device: Device, app: AppConfig) -> RenderError {
        RenderError(
            code: .noProvider,
            detail:
                "FCM device \(String(device.token.prefix(8)))… names provider \(device.providerID ?? "(default)") and app \(app.appID) has no such FCM credential"
        )
    }

    /// A webhook device naming a provider the app has no webhook for.
    static func noWebhook(_ device: Device, app: AppConfig) -> RenderError {
        RenderError(
            code: .noProvider,
            detail:
                "webhook device names provider \(device.providerID ?? "(default)") and app \(app.appID) has no such webhook"
        )
    }
}

/// Everything that varies per recipient in a payload; the truncation loop
/// shortens these fields and writes again.
struct PayloadContent {
    var title: String?
    var body: String
    /// The original message text carried in the Sendbird object.
    var detailText: String
    var translations: [(String, String)]
    var data: String
    var extern: JSONValue?
    var locArgsDropped = false
    /// CometChat's message object without its metadata and further attachments (a payload too large drops them
    /// with the translations).
    var messageExtrasDropped = false
    /// The alert's interruption level and relevance score (none for background and VoIP pushes).
    var attention = Attention()
    /// An update of a burst's notification: no sound (docs/behaviour.md §6a).
    var silent = false
}

public enum Renderer {
    /// The ellipsis that ends a shortened body.
    public static let ellipsis = "\u{2026}"

    /// Builds one request per target device for one recipient.
    /// - Parameters:
    ///   - senderDisplayName: the sender's push display name, when the sender set one.
    ///   - now: used only for `apns-expiration` when the event has no `created_at`.
    /// - Parameter burst: the message's place in a coalesced burst (docs/behaviour.md §6a): 1 opens it (a normal
    ///   alert), n > 1 replaces its notification with "n new messages"; nil: not coalesced.
    public static func render(
        event: ChatEvent, recipient: String, state: UserState, targets: [Device],
        app: AppConfig, senderDisplayName: String? = nil, burst: Int? = nil,
        now: Date
    ) throws(RenderError) -> [PushRequest] {
        if targets.isEmpty { return [] }
        if event.kind == .conversationRead {
            return try ReadSync.render(event: event, recipient: recipient, state: state, targets: targets, app: app)
        }
        let nowMillis = Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
        let eventSeconds = event.ruleTime(now: nowMillis) / 1000
        let isCall = event.kind == .call
        // Rendered once per push type and `aps` flags (a credential may set its own, `APSFlags`).
        var alertPayload: (flags: APSFlags, bytes: [UInt8])?
        var voipPayload: (flags: APSFlags, bytes: [UInt8])?
        var out: [PushRequest] = []
        out.reserveCapacity(targets.count)
        var webhookProviders: Set<String> = []
        for device in targets {
            switch device.kind {
            case .fcm:
                out.append(
                    try FCMMessage.request(
                        event: event, recipient: recipient, state: state, device: device,
                        app: app, senderDisplayName: senderDisplayName, burst: burst,
                        eventSeconds: eventSeconds))
                continue
            case .webhook:
                // One POST per recipient and webhook provider, however many webhook devices name it.
                guard let hook = app.webhook(device.providerID) else {
                    throw RenderError.noWebhook(device, app: app)
                }
                if !webhookProviders.insert(hook.providerID).inserted { continue }
                out.append(
                    WebhookPayload.request(
                        event: event, recipient: recipient, state: state, device: device,
                        hook: hook, app: app, senderDisplayName: senderDisplayName, burst: burst,
                        eventSeconds: eventSeconds))
                continue
            case .webpush:
                out.append(
                    try WebPushPayload.request(
                        event: event, recipient: recipient, state: state, device: device, app: app,
                        senderDisplayName: senderDisplayName, burst: burst, eventSeconds: eventSeconds))
                continue
            case .apns, .voip:
                break
            }
            let pushType: PushRequest.PushType
            switch isCall ? event.call?.action.applePush : nil {
            case .ring?: pushType = device.kind == .voip ? .voip : .alert
            case .background?: pushType = .background
            case .alert?, nil: pushType = event.kind == .messageDeleted ? .background : .alert
            }
            let route = app.apnsRoute(device)
            guard let bundle = route.bundleID, !bundle.isEmpty else {
                throw RenderError.noTopic(device, app: app)
            }
            let payload: [UInt8]
            let flags = app.apsFlags(device)
            if let p = pushType == .voip ? voipPayload : alertPayload, p.flags == flags {
                payload = p.bytes
            } else {
                payload = try renderPayload(
                    event: event, recipient: recipient, state: state, app: app,
                    senderDisplayName: senderDisplayName, pushType: pushType, burst: burst, aps: flags)
                if pushType == .voip { voipPayload = (flags, payload) } else { alertPayload = (flags, payload) }
            }
            let expiration = Saturating.add(
                eventSeconds, isCall ? app.callExpirationSeconds : app.expirationSeconds)
            var collapse: String?
            if let call = event.call, isCall {
                let id = "call-" + call.sessionID
                if id.utf8.count <= 64 { collapse = id }
            } else if let burst {
                collapse = Coalescing.collapseID(event, burst: burst)
            } else if app.collapseID == .message {
                collapse = Self.messageCollapseID(event)
            }
            out.append(
                PushRequest(
                    token: device.token, environment: route.environment, pushType: pushType,
                    topic: pushType == .voip && !bundle.hasSuffix(".voip") ? bundle + ".voip" : bundle,
                    priority: pushType == .background ? 5 : 10,
                    collapseID: collapse, expiration: max(0, expiration),
                    apnsID: APNsID.derive(eventID: event.eventID, token: device.token),
                    payload: payload, guesses: route.guesses))
        }
        return out
    }

    /// `m-<message id>` (or the event id), at most 64 bytes: longer ids are replaced by their derived hash.
    static func messageCollapseID(_ event: ChatEvent) -> String {
        let id = "m-" + (event.message?.id ?? event.eventID)
        return id.utf8.count <= 64 ? id : "m-" + APNsID.derive(eventID: id, token: "")
    }

    // MARK: Text

    /// The sender's name as shown: push display name, else nickname, else id.
    static func senderName(_ event: ChatEvent, _ displayName: String?) -> String {
        if let d = displayName, !d.isEmpty { return d }
        if let n = event.sender.name, !n.isEmpty { return n }
        return event.sender.id
    }

    /// The message text in the recipient's language: the translation into the
    /// first preferred language when the message language is not preferred.
    static func displayText(_ m: ChatEvent.Message, languages: [String]) -> String {
        guard let first = languages.first, !m.translations.isEmpty else { return m.text }
        if isInPreferredLanguage(m, languages: languages) { return m.text }
        return m.translation(first) ?? m.text
    }

    /// Whether the message is written in one of the preferred languages (its tag, or a tag whose primary subtag it
    /// is): then its text is shown as written, and no translation is asked for (`Translation.missingLanguage`).
    static func isInPreferredLanguage(_ m: ChatEvent.Message, languages: [String]) -> Bool {
        guard let lang = m.language else { return false }
        let l = Language.normalize(lang)
        return languages.contains { Language.normalize($0) == l || Language.primary($0) == l }
    }

    static func fileTypeFriendly(_ mime: String?, _ strings: Strings) -> String {
        let m = (mime ?? "").lowercased()
        if m.hasPrefix("image/") { return strings[.fileImage].source }
        if m.hasPrefix("video/") { return strings[.fileVideo].source }
        if m.hasPrefix("audio/") { return strings[.fileAudio].source }
        return strings[.fileOther].source
    }

    /// The alert body (before `em_push_content`, which the caller applies).
    public static func body(
        event: ChatEvent, preferences: Preferences, app: AppConfig,
        senderDisplayName: String?
    ) -> String {
        let strings = app.strings(for: preferences.languages)
        let sender = senderName(event, senderDisplayName)
        switch event.kind {
        case .call:
            switch event.call?.action {
            case .unanswered?, .cancelled?: return strings[.callMissed].source
            case .ongoing?: return strings[.callOngoing].source
            case .rejected?: return strings[.callRejected].source
            case .ended?: return strings[.callEnded].source
            case .busy?: return strings[.callBusy].source
            case .initiated?, nil: return strings[event.call?.type == .video ? .callVideo : .callAudio].source
            }
        case .reaction:
            let emoji = event.reaction?.emoji ?? ""
            return strings[.reaction].render { $0 == .emoji ? emoji : variable($0, event, sender, "", strings) }
        case .groupAction:
            guard let g = event.groupAction else { return "" }
            let key: CatalogKey
            switch g.action {
            case .joined: key = .groupJoined
            case .left: key = .groupLeft
            case .added: key = .groupAdded
            case .removed: key = .groupRemoved
            case .banned: key = .groupBanned
            case .unbanned: key = .groupUnbanned
            }
            return strings[key].render { $0 == .actorName ? g.actorName : variable($0, event, sender, "", strings) }
        case .messageDeleted, .conversationRead:
            return ""
        case .message, .messageEdited:
            guard let m = event.message else { return "" }
            let text = displayText(m, languages: preferences.languages)
            if m.type == .admin { return text }
            if preferences.displayStyle == .simpleBanner { return strings[.simpleBanner].source }
            let isFile = m.type == .file
            let template: Template
            if let ct = event.conversation.customType, !ct.isEmpty, let custom = app.customTemplates[ct] {
                template = isFile ? custom.file : custom.text
            } else if !m.customType.isEmpty, let custom = app.customTemplates[m.customType] {
                template = isFile ? custom.file : custom.text
            } else if preferences.template == .alternative {
                template = strings[isFile ? .alternativeFile : .alternativeText]
            } else {
                template = strings[isFile ? .defaultFile : .defaultText]
            }
            return template.render { variable($0, event, sender, text, strings) }
        }
    }

    static func variable(
        _ v: TemplateVariable, _ event: ChatEvent, _ sender: String, _ text: String,
        _ strings: Strings
    ) -> String {
        switch v {
        case .count, .conversationCount: return ""
        case .senderName: return sender
        case .message: return text
        case .filename: return event.message?.file?.name ?? ""
        case .channelName: return event.conversation.name ?? ""
        case .fileTypeFriendly: return fileTypeFriendly(event.message?.file?.mimeType, strings)
        case .emoji: return event.reaction?.emoji ?? ""
        case .actorName: return event.groupAction?.actorName ?? ""
        }
    }

    // MARK: Payload

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

    /// Renders the payload for one recipient and push type, shortened to fit.
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

        var w = JSONWriter(capacity: 768)
        write(event, recipient, state, app, sender, badge, content, pushType: pushType, aps: aps, into: &w)
        if w.count <= limit { return w.bytes }

        // Too large. The body is shortened first, together with the copy of
        // the message text in the Sendbird object (the longer one is cut
        // first, then both alike), down to `floor` bytes each. If that is not
        // enough, translations, then data, then extern, then loc args are
        // dropped, one at a time, and the cut is recomputed from the full
        // texts each time (so the body gets back what the drop freed). Last,
        // body and text are cut below the floor, then the title.
        // CometChat writes body and title twice.
        let copies = { if case .cometchat = app.payloadProfile { return 2 } else { return 1 } }()
        let textCopies: Int = {
            switch app.payloadProfile {
            case .sendbird: return 1
            case .cometchat: return app.payloadOptions.cometchatIncludeMessage && event.message != nil ? 1 : 0
            case .compact: return 0
            }
        }()
        let floor = 1024
        let original = content
        for drops in 0...4 {
            var trial = original
            if drops >= 1 { trial.translations = []; trial.messageExtrasDropped = true }
            if drops >= 2 { trial.data = "" }
            if drops >= 3 { trial.extern = nil }
            if drops >= 4 { trial.locArgsDropped = true }
            if drops > 0 {
                w = JSONWriter(capacity: limit + 256)
                write(event, recipient, state, app, sender, badge, trial, pushType: pushType, aps: aps, into: &w)
                if w.count <= limit { return w.bytes }
            }
            let excess = w.count - limit
            let floorForThisLevel = drops == 4 ? 0 : floor
            shareCut(&trial, excess: excess, copies: copies, textCopies: textCopies, floor: floorForThisLevel)
            w = JSONWriter(capacity: limit + 256)
            write(event, recipient, state, app, sender, badge, trial, pushType: pushType, aps: aps, into: &w)
            if w.count <= limit { return w.bytes }
            content = trial
        }
        if let title = content.title {
            content.title = shorten(title, by: (w.count - limit + copies - 1) / copies)
            w = JSONWriter(capacity: limit + 256)
            write(event, recipient, state, app, sender, badge, content, pushType: pushType, aps: aps, into: &w)
            if w.count <= limit { return w.bytes }
        }
        throw RenderError(code: .payloadTooLarge, detail: "minimal payload is \(w.count) bytes (limit \(limit))")
    }

    /// Cuts the body (written `copies` times) and the message text to a common
    /// escaped length L, the largest that saves `excess` bytes, but not below
    /// `floor`.
    static func shareCut(_ content: inout PayloadContent, excess: Int, copies: Int, textCopies: Int, floor: Int) {
        let bodyLength = JSONWriter.escapedLength(content.body) - 2
        let textLength = JSONWriter.escapedLength(content.detailText) - 2
        func saved(_ level: Int) -> Int {
            copies * max(0, bodyLength - level) + textCopies * max(0, textLength - level)
        }
        var low = floor, high = max(floor, bodyLength, textCopies > 0 ? textLength : 0)
        if saved(low) < excess {
            high = low  // cannot save enough at the floor: cut both to it
        } else {
            // Largest level that still saves `excess` (saved() decreases with the level).
            while low < high {
                let mid = (low + high + 1) / 2
                if saved(mid) >= excess { low = mid } else { high = mid - 1 }
            }
        }
        let level = max(0, low)
        if bodyLength > level { content.body = shorten(content.body, by: bodyLength - level) }
        if textCopies > 0, textLength > level {
            content.detailText = shorten(content.detailText, by: textLength - level)
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

    static func writeCompact(_ event: ChatEvent, _ recipient: String, into w: inout JSONWriter) {
        w.raw(",\"f\":"); w.string(event.sender.id)
        w.raw(",\"t\":"); w.string(recipient)
        if let m = event.message {
            w.raw(",\"m\":"); w.string(m.id)
        } else if let id = event.reaction?.messageID {
            w.raw(",\"m\":"); w.string(id)
        }
        if event.conversation.type == .group { w.raw(",\"g\":"); w.string(event.conversation.id) }
        if let call = event.call { writeCallObject(call, into: &w) }
        if let action = messageAction(event) { w.raw(",\"action\":"); w.string(action) }
    }

    /// `edited` or `deleted` for the message-change kinds, else nil (docs/behaviour.md §7).
    static func messageAction(_ event: ChatEvent) -> String? {
        switch event.kind {
        case .messageEdited: return "edited"
        case .messageDeleted: return "deleted"
        default: return nil
        }
    }

    static func writeCallObject(_ call: ChatEvent.Call, into w: inout JSONWriter) {
        w.raw(",\"call\":{\"action\":"); w.string(call.action.rawValue)
        w.raw(",\"session_id\":"); w.string(call.sessionID)
        w.raw(",\"type\":"); w.string(call.type.rawValue)
        w.byte(UInt8(ascii: "}"))
    }

    /// A message id as a JSON number when it is a decimal integer (Sendbird's
    /// `message_id` is a long), else as a string.
    static func writeID(_ id: String, into w: inout JSONWriter) {
        if let n = Int64(id), String(n) == id { w.int(n) } else { w.string(id) }
    }

    static func writeSendbird(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, key: String, _ options: PayloadOptions, into w: inout JSONWriter
    ) {
        w.byte(UInt8(ascii: ",")); w.key(key)
        writeSendbirdObject(event, recipient, state, sender, content, options, into: &w)
    }

    /// The Sendbird object itself (`{"category":"messaging:offline_notification",...}`).
    static func writeSendbirdObject(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, _ options: PayloadOptions = PayloadOptions(),
        into w: inout JSONWriter
    ) {
        let m = event.message
        w.raw("{\"category\":\"messaging:offline_notification\",\"type\":")
        switch m?.type {
        case .file: w.raw(options.sendbirdV3TypeCodes ? "\"FILE\"" : "\"File\"")
        case .admin: w.raw(options.sendbirdV3TypeCodes ? "\"ADMM\"" : "\"Admin\"")
        default: w.raw(options.sendbirdV3TypeCodes ? "\"MESG\"" : "\"User\"")
        }
        w.raw(",\"message\":"); w.string(m != nil ? content.detailText : content.body)
        w.raw(",\"data\":"); w.string(content.data)
        w.raw(",\"custom_type\":"); w.string(m?.customType ?? "")
        if let m {
            w.raw(",\"message_id\":"); writeID(m.id, into: &w)
        } else if let id = event.reaction?.messageID {
            w.raw(",\"message_id\":"); writeID(id, into: &w)
        }
        if let t = event.createdAt { w.raw(",\"created_at\":"); w.int(t) }
        w.raw(",\"app_id\":"); w.string(event.appID)
        w.raw(",\"unread_message_count\":"); w.int(state.unread.total)
        w.raw(",\"channel\":{\"channel_url\":"); w.string(event.conversation.id)
        w.raw(",\"name\":"); w.string(event.conversation.name ?? "")
        w.raw(",\"custom_type\":"); w.string(event.conversation.customType ?? "")
        w.raw("},\"channel_type\":")
        if let channelType = event.conversation.channelType {
            w.string(channelType)
        } else if event.conversation.type == .direct {
            w.raw("\"messaging\"")
        } else {
            w.string(options.sendbirdGroupChannelType)
        }
        w.raw(",\"sender\":{\"id\":"); w.string(event.sender.id)
        w.raw(",\"name\":"); w.string(sender)
        w.raw(",\"profile_url\":"); w.string(event.sender.profileURL ?? "")
        w.raw("},\"recipient\":{\"id\":"); w.string(recipient)
        w.raw(",\"name\":"); w.string(state.preferences.nickname ?? state.preferences.displayName ?? "")
        w.raw("},\"files\":[")
        if let f = m?.file {
            w.raw("{\"name\":"); w.string(f.name ?? "")
            w.raw(",\"type\":"); w.string(f.mimeType ?? "")
            w.raw(",\"url\":"); w.string(f.url ?? "")
            w.byte(UInt8(ascii: "}"))
        }
        w.raw("],\"translations\":{")
        for (n, pair) in content.translations.enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            w.key(pair.0); w.string(pair.1)
        }
        w.raw("},\"push_sound\":")
        // `em_push_sound: null` silences the push: no sound name.
        w.string(
            event.ext.apns.soundSilenced
                ? "" : event.ext.apns.sound ?? options.sound(conversation: event.conversation.id))
        if options.sendbirdPushTitle { w.raw(",\"push_title\":"); w.string(content.title ?? "") }
        if options.sendbirdPushAlert { w.raw(",\"push_alert\":"); w.string(content.body) }
        if let audience = options.sendbirdAudienceType {
            w.raw(",\"audience_type\":"); w.string(audienceType(event, recipient: recipient) ?? audience)
        }
        if options.sendbirdMentionedUsers, m?.mentions.contains(recipient) == true {
            // The mention counts are Herald's when the app counts (docs/behaviour.md §12), else 0.
            w.raw(",\"mentioned_users\":{\"user_id\":"); w.string(recipient)
            w.raw(",\"total_unread_mention_count\":"); w.int(state.unread.mentionTotal)
            // The number of conversations holding an unread mention of the user (the seed's meaning).
            w.raw(",\"channel_unread_mention_count\":")
            w.int(state.unread.mentionedConversations)
            w.raw(",\"is_hidden\":"); w.bool(event.conversation.hiddenBy.contains(recipient))
            w.byte(UInt8(ascii: "}"))
        }
        if let action = messageAction(event) { w.raw(",\"message_action\":"); w.string(action) }
        if options.sendbirdChannelUnreadCount {
            w.raw(",\"channel_unread_count\":"); w.int(state.unread.conversations[event.conversation.id] ?? 0)
        }
        if let call = event.call { writeCallObject(call, into: &w) }
        w.byte(UInt8(ascii: "}"))
    }

    /// CometChat's flat fields. `messageAsString`: the `message` object written as a JSON string (FCM `data`,
    /// whose values are strings) and `custom` left out.
    static func writeCometChat(
        _ event: ChatEvent, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, _ options: PayloadOptions = PayloadOptions(), messageAsString: Bool = false,
        into w: inout JSONWriter
    ) {
        let isGroup = event.conversation.type == .group
        w.raw(",\"title\":"); w.string(content.title ?? sender)
        w.raw(",\"body\":"); w.string(content.body)
        w.raw(",\"sender\":"); w.string(event.sender.id)
        w.raw(",\"senderName\":"); w.string(sender)
        if let p = event.sender.profileURL { w.raw(",\"senderAvatar\":"); w.string(p) }
        w.raw(",\"receiver\":"); w.string(isGroup ? event.conversation.id : recipient)
        if isGroup, let n = event.conversation.name {
            w.raw(",\"receiverName\":"); w.string(n)
        } else if !isGroup, let n = state.preferences.nickname ?? state.preferences.displayName {
            w.raw(",\"receiverName\":"); w.string(n)
        }
        if let avatar = event.conversation.avatarURL { w.raw(",\"receiverAvatar\":"); w.string(avatar) }
        w.raw(",\"receiverType\":"); w.raw(isGroup ? "\"group\"" : "\"user\"")
        let tag: String
        switch event.kind {
        case .message, .messageEdited, .messageDeleted: tag = event.message?.id ?? event.eventID
        case .reaction: tag = event.reaction?.messageID ?? event.message?.id ?? event.eventID
        case .groupAction, .conversationRead: tag = event.conversation.id
        case .call: tag = event.message?.id ?? event.call?.sessionID ?? event.eventID
        }
        w.raw(",\"tag\":"); w.string(tag)
        w.raw(",\"conversationId\":"); w.string(event.conversation.id)
        w.raw(",\"type\":"); w.raw(event.kind == .call ? "\"call\"" : "\"chat\"")
        if let call = event.call {
            w.raw(",\"callAction\":"); w.string(call.action.rawValue)
            w.raw(",\"sessionId\":"); w.string(call.sessionID)
            w.raw(",\"callType\":"); w.string(call.type.rawValue)
        }
        if let t = event.createdAt { w.raw(",\"sentAt\":\""); w.int(t); w.byte(UInt8(ascii: "\"")) }
        if let action = messageAction(event) { w.raw(",\"messageAction\":"); w.string(action) }
        if options.cometchatIncludeMessage, let m = event.message {
            w.raw(",\"message\":")
            if messageAsString {
                var o = JSONWriter(capacity: 512)
                writeCometChatMessage(event, m, recipient, state, sender, content, into: &o)
                w.string(o.string)
            } else {
                writeCometChatMessage(event, m, recipient, state, sender, content, into: &w)
            }
        }
        if !messageAsString, let custom = options.cometchatCustom { w.raw(",\"custom\":"); w.value(custom) }
    }

    /// CometChat's message object ("Include message object"): the message with its sender and receiver, and in
    /// `data` its text, metadata and attachments (the `file` first, then `attachments`). `text` and `url` are also
    /// kept at the top, where older clients read them.
    static func writeCometChatMessage(
        _ event: ChatEvent, _ m: ChatEvent.Message, _ recipient: String, _ state: UserState, _ sender: String,
        _ content: PayloadContent, into w: inout JSONWriter
    ) {
        let isGroup = event.conversation.type == .group
        let files = (m.file.map { [$0] } ?? []) + (content.messageExtrasDropped ? [] : m.attachments)
        let type = m.type == .file ? fileCategory(files.first?.mimeType) : "text"
        w.raw("{\"id\":"); w.string(m.id)
        w.raw(",\"conversationId\":"); w.string(event.conversation.id)
        w.raw(",\"sender\":"); w.string(event.sender.id)
        w.raw(",\"receiver\":"); w.string(isGroup ? event.conversation.id : recipient)
        w.raw(",\"receiverType\":"); w.raw(isGroup ? "\"group\"" : "\"user\"")
        w.raw(",\"category\":\"message\",\"type\":"); w.string(type)
        w.raw(",\"text\":"); w.string(content.detailText)
        if let url = files.first?.url { w.raw(",\"url\":"); w.string(url) }
        w.raw(",\"data\":{\"text\":"); w.string(content.detailText)
        if !content.messageExtrasDropped, let metadata = m.metadata { w.raw(",\"metadata\":"); w.value(metadata) }
        if !files.isEmpty {
            w.raw(",\"attachments\":[")
            for (n, f) in files.enumerated() {
                if n > 0 { w.byte(UInt8(ascii: ",")) }
                w.raw("{\"name\":"); w.string(f.name ?? "")
                w.raw(",\"mimeType\":"); w.string(f.mimeType ?? "")
                w.raw(",\"extension\":"); w.string(fileExtension(f.name))
                w.raw(",\"url\":"); w.string(f.url ?? "")
                w.byte(UInt8(ascii: "}"))
            }
            w.byte(UInt8(ascii: "]"))
        }
        w.raw(",\"entities\":{\"sender\":{\"entityType\":\"user\",\"entity\":{\"uid\":"); w.string(event.sender.id)
        w.raw(",\"name\":"); w.string(sender)
        if let avatar = event.sender.profileURL { w.raw(",\"avatar\":"); w.string(avatar) }
        w.raw("}},\"receiver\":{\"entityType\":"); w.raw(isGroup ? "\"group\"" : "\"user\"")
        w.raw(",\"entity\":{"); w.raw(isGroup ? "\"guid\":" : "\"uid\":")
        w.string(isGroup ? event.conversation.id : recipient)
        if let name = isGroup ? event.conversation.name : state.preferences.nickname ?? state.preferences.displayName {
            w.raw(",\"name\":"); w.string(name)
        }
        if let avatar = event.conversation.avatarURL {
            w.raw(isGroup ? ",\"icon\":" : ",\"avatar\":"); w.string(avatar)
        }
        w.raw("}}}}")
        if let t = event.createdAt {
            w.raw(",\"sentAt\":"); w.int(t / 1000)
            switch event.kind {
            case .messageEdited: w.raw(",\"editedAt\":"); w.int(t / 1000)
            case .messageDeleted: w.raw(",\"deletedAt\":"); w.int(t / 1000)
            default: break
            }
        }
        w.byte(UInt8(ascii: "}"))
    }

    /// A file name's extension, lower case, or "" when it has none.
    static func fileExtension(_ name: String?) -> String {
        guard let name, let dot = name.lastIndex(of: "."), dot != name.startIndex else { return "" }
        let ext = name[name.index(after: dot)...]
        return ext.isEmpty || ext.utf8.count > 16 ? "" : ext.lowercased()
    }

    /// Sendbird's `audience_type` of one push, where the event says enough: `all` when the message mentions the
    /// whole channel, `only` when it names the recipient among its mentions; nil otherwise (the app's configured
    /// value is written).
    static func audienceType(_ event: ChatEvent, recipient: String) -> String? {
        guard let m = event.message, event.kind == .message || event.kind == .messageEdited else { return nil }
        if m.mentionType == .channel { return "all" }
        if m.mentions.contains(recipient) { return "only" }
        return nil
    }

    /// CometChat's media message types by mime type.
    static func fileCategory(_ mime: String?) -> String {
        let m = (mime ?? "").lowercased()
        if m.hasPrefix("image/") { return "image" }
        if m.hasPrefix("video/") { return "video" }
        if m.hasPrefix("audio/") { return "audio" }
        return "file"
    }
}

/// The `apns-id` of a notification, derived from (event id, device token) so a
/// notification can be traced and a replay carries the same id: a UUID of
/// version 8 (RFC 9562, custom) whose bits are two FNV-1a 64-bit hashes of
/// `event_id`, a 0x00 byte, and the token (offset bases 0xcbf29ce484222325 and
/// 0x84222325cbf29ce4), with the version and variant bits set.
public enum APNsID {
    static let hex: [UInt8] = Array("0123456789ABCDEF".utf8)

    public static func derive(eventID: String, token: String) -> String {
        var (h1, h2) = mix(eventID, 0xcbf2_9ce4_8422_2325, 0x8422_2325_cbf2_9ce4)
        h1 = (h1 ^ 0) &* prime
        h2 = (h2 ^ 0x5A) &* prime
        (h1, h2) = mix(token, h1, h2)
        // Version 8 in the high nibble of byte 6, variant 10 in byte 8.
        h1 = (h1 & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_8000
        h2 = (h2 & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000
        return hex.withUnsafeBufferPointer { digits in
            String(unsafeUninitializedCapacity: 36) { out in
                var i = 0
                for index in 0..<16 {
                    let word = index < 8 ? h1 : h2
                    let byte = UInt8((word >> UInt64(56 - (index % 8) * 8)) & 0xFF)
                    if index == 4 || index == 6 || index == 8 || index == 10 { out[i] = UInt8(ascii: "-"); i += 1 }
                    out[i] = digits[Int(byte >> 4)]
                    out[i + 1] = digits[Int(byte & 0xF)]
                    i += 2
                }
                return i
            }
        }
    }

    static let prime: UInt64 = 0x0000_0100_0000_01B3

    /// Two FNV-1a-style hashes of `text`'s bytes (the second over each byte xor 0x5A), continued from `h1` and `h2`.
    /// The hashes are the loop's own locals: updated through a nested function's captures instead, a derivation took
    /// twice as long.
    @inline(__always)
    static func mix(_ text: String, _ h1: UInt64, _ h2: UInt64) -> (UInt64, UInt64) {
        var text = text
        return text.withUTF8 { bytes in
            var a = h1
            var b = h2
            for byte in bytes {
                a = (a ^ UInt64(byte)) &* prime
                b = (b ^ UInt64(byte ^ 0x5A)) &* prime
            }
            return (a, b)
        }
    }
}
