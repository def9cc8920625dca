// Web Push messages (docs/providers.md, "Web Push"): the JSON a service worker reads in its `push` event and shows
// with `showNotification(title, {body, tag, data, ...})`, built from the same texts as the other payloads and
// shortened the same way so that the message still fits 4,096 bytes once encrypted.
import Foundation

/// Builds Web Push requests (device kind `webpush`).
///
/// Shape: `{"title":...,"body":...,"tag":...,"renotify":true,"silent":true,"badge":n,"data":{...}}` where
/// - `title`: the app's title template, else the conversation name for a group (a call: the caller), else the sender;
/// - `tag`: the collapse id when there is one (a call session, a burst, the app's `collapse_id: message`), else
///   `c-<conversation id>`, so one conversation shows one notification (`renotify` makes each new one alert);
/// - `silent`: a burst's update and every event that shows nothing on other providers (a deleted message, a call's
///   end): the service worker should not alert;
/// - `data`: `type` (the event kind), `event_id`, `conversation_id`, `conversation_type`, `sender_id`, and
///   `message_id`, `call_action` and `session_id` when the event has them.
///
/// The request's headers (set by send from these fields): `TTL` from `expiration` (the event time plus the app's
/// expiration), `Urgency` from `priority` (10 `high` for calls, 5 `normal`, 1 `low` for silent updates), `Topic`
/// from `collapseID` (at most 32 base64url characters).
public enum WebPushPayload {
    /// The most plaintext bytes whose `aes128gcm` body (86 bytes of header, a padding delimiter and a 16-byte tag)
    /// fits the 4,096 bytes every push service takes.
    public static let payloadLimit = 4096 - 86 - 1 - 16
    /// `Urgency` by `PushRequest.priority`.
    public static func urgency(priority: Int) -> String {
        priority >= 10 ? "high" : priority <= 1 ? "low" : "normal"
    }

    /// The request for one `webpush` device of one recipient.
    static func request(
        event: ChatEvent, recipient: String, state: UserState, device: Device, app: AppConfig,
        senderDisplayName: String?, burst: Int? = nil, eventSeconds: Int64
    ) throws(RenderError) -> PushRequest {
        guard app.webPush != nil else {
            throw RenderError(
                code: .noProvider, detail: "webpush device and app \(app.appID) has no webpush section")
        }
        if let problem = app.webPushProblem(device) {
            throw RenderError(code: .noProvider, detail: "webpush device refused: \(problem)")
        }
        let isCall = event.kind == .call
        let collapse = collapseID(event, burst: burst, app: app)
        let (payload, silent) = try payload(
            event: event, recipient: recipient, state: state, app: app, senderDisplayName: senderDisplayName,
            burst: burst, tag: collapse)
        let ttl = isCall ? app.callExpirationSeconds : app.expirationSeconds
        let (sum, overflow) = eventSeconds.addingReportingOverflow(ttl)
        let priority = isCall && event.call?.action.applePush == .ring ? 10 : silent ? 1 : 5
        return PushRequest(
            token: device.token, environment: .production, pushType: silent ? .background : .alert,
            topic: WebPushSubscription(token: device.token)?.origin ?? "", priority: priority,
            collapseID: collapse.map(topic), expiration: overflow ? Int64.max : max(0, sum),
            apnsID: APNsID.derive(eventID: event.eventID, token: device.token), payload: payload,
            provider: .webpush, providerID: nil)
    }

    /// The collapse id, as on APNs: the call session, the burst, or the message when the app collapses by message.
    static func collapseID(_ event: ChatEvent, burst: Int?, app: AppConfig) -> String? {
        if event.kind == .call, let call = event.call { return "call-" + call.sessionID }
        if let burst { return Coalescing.collapseID(event, burst: burst) }
        if app.collapseID == .message { return Renderer.messageCollapseID(event) }
        return nil
    }

    /// The `Topic` header of a collapse id: itself when it is at most 32 base64url characters, else 32 characters of
    /// the base64url SHA-256 of it.
    public static func topic(_ collapseID: String) -> String {
        let safe = collapseID.utf8.allSatisfy { c in
            (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || (c >= 0x30 && c <= 0x39) || c == 0x2D || c == 0x5F
        }
        if safe && !collapseID.isEmpty && collapseID.utf8.count <= 32 { return collapseID }
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        let digest = SHA256.digest(Array(collapseID.utf8))
        var out: [UInt8] = []
        var bits = 0
        var value = 0
        for byte in digest where out.count < 32 {
            value = value << 8 | Int(byte)
            bits += 8
            while bits >= 6 && out.count < 32 {
                bits -= 6
                out.append(alphabet[(value >> bits) & 0x3F])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The payload for one recipient within `payloadLimit`, and whether it is silent.
    public static func payload(
        event: ChatEvent, recipient: String, state: UserState, app: AppConfig, senderDisplayName: String?,
        burst: Int? = nil, tag: String? = nil
    ) throws(RenderError) -> (bytes: [UInt8], silent: Bool) {
        var (content, sender) = Renderer.content(
            event: event, state: state, app: app, senderDisplayName: senderDisplayName, cometchatTitle: false,
            burst: burst)
        let silent =
            content.silent || event.kind == .messageDeleted
            || (event.kind == .call && event.call?.action.applePush == .background)
        if content.title == nil {
            content.title =
                event.conversation.type != .direct && event.kind != .call
                ? (event.conversation.name.flatMap { $0.isEmpty ? nil : $0 } ?? sender) : sender
        }
        let prefs = app.effectivePreferences(state.preferences)
        let shape = Shape(
            event: event, tag: tag ?? ("c-" + event.conversation.id), renotify: tag == nil && !silent,
            silent: silent, badge: app.badge(for: state, preferences: prefs))
        // Too large: the body is cut, then the title (nothing is optional here).
        let bytes = try PayloadFit(limit: payloadLimit, drops: [], floor: 0).fit(content, what: "Web Push message") {
            shape.write($0)
        }
        return (bytes, silent)
    }

    /// The message a push service refused as too large (413), made to fit `limit` bytes by cutting its `body` (then
    /// its `title`), or nil when it cannot be made that small or is not a message of this shape. A push service may
    /// take less than the 4,096 bytes every one must take; send retries once with half the size it refused.
    public static func shrunk(_ payload: [UInt8], toFit limit: Int) -> [UInt8]? {
        guard payload.count > limit, case .object(let fields)? = try? JSONValue.parse(payload) else { return nil }
        func write(_ field: String, _ text: String, in fields: [(String, JSONValue)]) -> [(String, JSONValue)] {
            fields.map { $0.0 == field ? ($0.0, .string(text)) : $0 }
        }
        var current = fields
        for field in ["body", "title"] {
            guard let text = current.first(where: { $0.0 == field })?.1.stringValue, !text.isEmpty else { continue }
            let length = JSONWriter.escapedLength(text) - 2
            if let fitted = PayloadFit.largestFitting(
                low: 0, high: length, limit: limit,
                { level in
                    Array(
                        JSONValue.object(write(field, Renderer.shorten(text, by: length - level), in: current))
                            .serialized.utf8)
                })
            {
                return fitted
            }
            current = write(field, Renderer.shorten(text, by: length), in: current)
        }
        return nil
    }

    /// Everything but the shortenable texts.
    struct Shape {
        let event: ChatEvent
        let tag: String
        let renotify: Bool
        let silent: Bool
        let badge: Int?

        func write(_ content: PayloadContent) -> [UInt8] {
            var w = JSONWriter(capacity: 512)
            w.raw("{\"title\":"); w.string(content.title ?? "")
            w.raw(",\"body\":"); w.string(content.body)
            w.raw(",\"tag\":"); w.string(tag)
            if renotify { w.raw(",\"renotify\":true") }
            if silent { w.raw(",\"silent\":true") }
            if let badge { w.raw(",\"badge\":"); w.int(badge) }
            w.raw(",\"data\":{\"type\":"); w.string(event.kind.rawValue)
            w.raw(",\"event_id\":"); w.string(event.eventID)
            w.raw(",\"conversation_id\":"); w.string(event.conversation.id)
            w.raw(",\"conversation_type\":"); w.string(event.conversation.type.rawValue)
            w.raw(",\"sender_id\":"); w.string(event.sender.id)
            if let id = event.message?.id { w.raw(",\"message_id\":"); w.string(id) }
            if let call = event.call {
                w.raw(",\"call_action\":"); w.string(call.action.rawValue)
                w.raw(",\"session_id\":"); w.string(call.sessionID)
            }
            w.raw("}}")
            return w.bytes
        }
    }
}

/// What a push service's answer to a Web Push request means (RFC 8030 §5, §8.3; RFC 8292 §4): 201 (and any 2xx)
/// delivered; 404 and 410 the subscription is gone (the device is removed); 429 and 5xx retried, honouring
/// `Retry-After`; 413 the body is too large; 400, 401, 403 and every other status permanent. Failures below HTTP
/// are retried.
public enum WebPushAnswerTable {
    public static func classify(status: Int) -> PushAnswerClass {
        switch status {
        case 200...299: .delivered
        case 404, 410: .tokenDead(unregisteredAt: nil)
        case 408, 429, 500...599: .retryable
        default: .permanent
        }
    }

    /// The reason text for metrics, logs and the DLQ: what the push service said, by status.
    public static func reasonText(status: Int) -> String {
        switch status {
        case 200...299: ""
        case 400: "BadRequest"
        case 401: "VapidUnauthorized"
        case 403: "VapidForbidden"
        case 404: "SubscriptionNotFound"
        case 410: "SubscriptionGone"
        case 413: "PayloadTooLarge"
        case 429: "TooManyRequests"
        default: "HTTP\(status)"
        }
    }

    /// What an error answer's body says, on one line and at most 160 characters: a JSON object's `reason`,
    /// `detail`, `message` or `title` (RFC 7807 problem details and the push services' own shapes), else the text.
    public static func detail(_ body: [UInt8]) -> String {
        guard !body.isEmpty else { return "" }
        var text = String(decoding: body.prefix(4096), as: UTF8.self)
        if let object = try? JSONValue.parse(body) {
            text = ["reason", "detail", "message", "title"].lazy.compactMap { object[$0]?.stringValue }.first ?? ""
        }
        let line = text.split(whereSeparator: \.isNewline).joined(separator: " ").trimmingCharacters(in: .whitespaces)
        return line.count > 160 ? String(line.prefix(160)) + "…" : line
    }
}
