// The custom webhook provider (CometChat "custom provider"): one HTTPS POST
// per recipient and webhook, whatever the app's payload profile, in the shape
// of CometChat's samples:
// {"trigger":"push-notification-payload-generated",
//  "data":{"to":{"uid":...},"notificationDetails":{...}},
//  "appId":...,"region":...,"webhook":"custom"}

/// Builds webhook requests.
///
/// `notificationDetails` holds CometChat's flat fields (title, body, sender, senderName, senderAvatar,
/// receiver, receiverName, receiverType, tag, conversationId, type, sentAt, and for calls callAction,
/// sessionId, callType) plus one `custom`: the app's `cometchat.custom` merged with the event's `em_apns_ext.extern`. The title
/// is the sender (the group for group actions) unless the app has a title template; the body is the
/// app's template text, in the recipient's language. There is no size limit to meet, so nothing is cut.
public enum WebhookPayload {
    static func request(
        event: ChatEvent, recipient: String, state: UserState, device: Device,
        hook: WebhookCredential, app: AppConfig, senderDisplayName: String?, burst: Int? = nil,
        eventSeconds: Int64
    ) -> PushRequest {
        let payload = payload(
            event: event, recipient: recipient, state: state, app: app, region: hook.region,
            senderDisplayName: senderDisplayName, burst: burst)
        let isCall = event.kind == .call
        let (sum, overflow) = eventSeconds.addingReportingOverflow(
            isCall ? app.callExpirationSeconds : app.expirationSeconds)
        return PushRequest(
            token: device.token, environment: .production, pushType: .alert, topic: hook.providerID,
            priority: 10, collapseID: burst.map { Coalescing.collapseID(event, burst: $0) },
            expiration: overflow ? Int64.max : max(0, sum),
            apnsID: APNsID.derive(eventID: event.eventID, token: device.token), payload: payload,
            provider: .webhook, providerID: hook.providerID)
    }

    /// The POST body for one recipient.
    public static func payload(
        event: ChatEvent, recipient: String, state: UserState, app: AppConfig, region: String,
        senderDisplayName: String?, burst: Int? = nil
    ) -> [UInt8] {
        let (content, sender) = Renderer.content(
            event: event, state: state, app: app,
            senderDisplayName: senderDisplayName, cometchatTitle: true, burst: burst)
        var w = JSONWriter(capacity: 1024)
        w.raw("{\"trigger\":\"push-notification-payload-generated\",\"data\":{\"to\":{\"uid\":"); w.string(recipient)
        w.raw("},\"notificationDetails\":{")
        var fields = JSONWriter(capacity: 512)
        // One `custom` key: the app's object and the event's `extern` are merged (behaviour.md §7).
        var options = app.payloadOptions
        options.cometchatCustom = mergedCustom(app: options.cometchatCustom, event: content.extern)
        Renderer.writeCometChat(event, recipient, state, sender, content, options, into: &fields)
        w.bytes.append(contentsOf: fields.bytes.dropFirst())  // its fields start with a comma
        w.raw("}},\"appId\":"); w.string(event.appID)
        w.raw(",\"region\":"); w.string(region)
        w.raw(",\"webhook\":\"custom\"}")
        return w.bytes
    }

    /// The one `custom` value of a webhook body: the app's `cometchat.custom` object and the event's
    /// `em_apns_ext.extern`. Two objects are merged, the event's members replacing the app's of the same name
    /// (the event is the more specific); otherwise the event's value wins, and the app's object is used alone
    /// when the event has none.
    public static func mergedCustom(app: JSONValue?, event: JSONValue?) -> JSONValue? {
        guard let event else { return app }
        guard case .object(let base)? = app, case .object(let extra) = event else { return event }
        let named = Set(extra.map(\.0))
        return .object(base.filter { !named.contains($0.0) } + extra)
    }
}
