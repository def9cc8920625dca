// Rendering (docs/behaviour.md §7): picks template, language and translation for one recipient and builds one
// request per target device, for its provider. The texts are in RenderText.swift, the payload and its fit to the
// provider's limit in RenderPayload.swift, the payload profiles' own fields in PayloadProfiles.swift.

import Foundation

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
}
