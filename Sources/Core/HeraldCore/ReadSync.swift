// Cleared on read (docs/behaviour.md §6c): when a user marks a conversation read, the user's other devices get a
// background push so the app can take that conversation's notifications off the screen and set its badge.
// herald-registry decides it (who gets it, the rate limit) and produces a `herald.deliverable` record whose event is
// of kind `conversation_read`; render builds the requests here and send delivers them like any other push.

/// An app's read sync (`read_sync:` in the pipeline file). On by default.
public struct ReadSyncPolicy: Sendable, Hashable {
    /// Send the clears at all.
    public var enabled: Bool
    /// At most one clear per (user, conversation) in this many milliseconds (at most a minute); a read inside it is not
    /// synced.
    public var conversationIntervalMilliseconds: Int64
    /// At most this many clears per user in each minute of the clock, all conversations together.
    public var perMinute: Int

    public init(enabled: Bool = true, conversationIntervalMilliseconds: Int64 = 3_000, perMinute: Int = 20) {
        self.enabled = enabled
        self.conversationIntervalMilliseconds = min(60_000, max(0, conversationIntervalMilliseconds))
        self.perMinute = max(1, perMinute)
    }

    public static let off = ReadSyncPolicy(enabled: false)
}

/// What became of one `mark_read` for its read sync (`herald_read_sync_total{outcome}`, the registry's explain line).
public enum ReadSyncOutcome: String, Sendable, Hashable, CaseIterable {
    /// A clear was produced for the user's other devices.
    case sent
    /// The conversation had a clear less than the app's interval ago.
    case rateLimited = "rate_limited"
    /// The user had the app's number of clears this minute.
    case userLimit = "user_limit"
    /// The user has no device but the one that read (or none that takes a background push).
    case noOtherDevice = "no_other_device"
    /// The app has `read_sync: off`.
    case off
    /// The app's push is off (`push: off`): no clears either.
    case appOff = "app_off"
}

/// One user's rate-limit state, as the Redis script keeps it (docs/redis-keys.md, "Read sync"): the clock minute and
/// the clears sent in it, and per conversation (`*` for everything) when its last clear was sent and for which read.
public struct ReadSyncLimiter: Sendable, Hashable {
    public struct Last: Sendable, Hashable {
        public var sentAt: Int64
        /// The `read_at` of the read that was synced (a replay of the same record is let through again).
        public var readAt: String
        public init(sentAt: Int64, readAt: String) {
            self.sentAt = sentAt
            self.readAt = readAt
        }
    }

    public var minute: Int64
    public var count: Int
    public var conversations: [String: Last]

    public init(minute: Int64 = 0, count: Int = 0, conversations: [String: Last] = [:]) {
        self.minute = minute
        self.count = count
        self.conversations = conversations
    }
}

public enum ReadSync {
    /// The conversation field of a mark-all-read (every conversation).
    public static let everything = "*"
    /// The decision of the registry's explain entry for a read (its reason is the `ReadSyncOutcome`).
    public static let explainDecision = "read_sync"
    /// The conversation `custom_type` that marks a read event for every conversation.
    static let allCustomType = "herald.read_all"
    /// How long a clear may wait at the provider: a clear that arrives an hour late has lost its point.
    public static let expirationSeconds: Int64 = 3_600

    /// The devices a clear goes to: every device of the user that takes a background push or a data message (APNs
    /// device tokens, FCM, webhooks; never VoIP tokens, which must report a call), except the one that read.
    public static func targets(_ devices: [Device], excluding readingToken: String?) -> [Device] {
        var seen: Set<String> = []
        return devices.filter { d in
            d.kind != .voip && d.token != readingToken && seen.insert(d.token).inserted
        }
    }

    /// How long each minute's limiter state is kept: it is read as "this minute" and then as "the last minute".
    public static let limiterTTLMilliseconds: Int64 = 180_000
    /// The longest `conversation_seconds`: the limiter looks back one minute of the clock.
    public static let maxIntervalSeconds = 60

    /// The limiter's answer for one read at `now` (epoch ms) of `conversation` (`everything` for all), and the state
    /// after it. A replay of the read that took the conversation's last slot (same `readAt`) is `sent` again
    /// without counting, so a redelivered record is delivered (send's delivery records keep it from arriving twice).
    /// What the limiter knows of a conversation lasts to the end of the next clock minute, as the Redis state does
    /// (`ReadSyncScript`, which is this function in Lua).
    public static func admit(
        _ previous: ReadSyncLimiter?, conversation: String, readAt: String, now: Int64, policy: ReadSyncPolicy
    ) -> (ReadSyncOutcome, ReadSyncLimiter) {
        var state = previous ?? ReadSyncLimiter()
        let minute = now - now % 60_000
        if let last = state.conversations[conversation], last.sentAt >= minute - 60_000 {
            if !readAt.isEmpty && last.readAt == readAt { return (.sent, state) }
            if now - last.sentAt < policy.conversationIntervalMilliseconds { return (.rateLimited, state) }
        }
        if state.minute != minute {
            state.minute = minute
            state.count = 0
        }
        if state.count >= policy.perMinute { return (.userLimit, state) }
        state.count += 1
        state.conversations[conversation] = ReadSyncLimiter.Last(sentAt: now, readAt: readAt)
        return (.sent, state)
    }

    /// The event a clear carries through render and send: its id is derived from (user, conversation, read time),
    /// so a redelivered `mark_read` makes the same `apns-id` and send's delivery records skip it.
    public static func event(app: String, user: String, conversation: String?, readAt: Int64) -> ChatEvent {
        let id = APNsID.derive(eventID: "read\u{0}\(user)\u{0}\(conversation ?? everything)\u{0}\(readAt)", token: "")
        return ChatEvent(
            eventID: "read-" + id, appID: app, kind: .conversationRead, createdAt: readAt,
            sender: ChatEvent.Sender(id: user),
            conversation: ChatEvent.Conversation(
                id: conversation ?? user, type: .direct, customType: conversation == nil ? allCustomType : nil))
    }

    /// The conversation a read event is about; nil when it is about every conversation.
    public static func conversation(of event: ChatEvent) -> String? {
        event.conversation.customType == allCustomType ? nil : event.conversation.id
    }

    /// The collapse id of a clear: a newer clear of the same conversation replaces one not yet delivered.
    static func collapseID(_ conversation: String?) -> String {
        guard let conversation else { return "r-*" }
        let id = "r-" + conversation
        return id.utf8.count <= 64 ? id : "r-" + APNsID.derive(eventID: id, token: "")
    }

    // MARK: Requests (docs/behaviour.md §6c)

    /// One request per target: APNs a background push (priority 5, `content-available`, the conversation as
    /// `thread-id`, `read` with the conversation and badge), FCM a data-only message, webhooks one `conversation-read`
    /// POST per provider.
    static func render(
        event: ChatEvent, recipient: String, state: UserState, targets: [Device], app: AppConfig
    ) throws(RenderError) -> [PushRequest] {
        let conversation = conversation(of: event)
        let prefs = app.effectivePreferences(state.preferences)
        // After a read of every conversation nothing is unread, whether or not the total was known before.
        var after = state
        if conversation == nil { after.unread.total = 0 }
        let badge = app.badge(for: after, preferences: prefs)
        let readAt = event.createdAt ?? 0
        let expiration = Saturating.add(readAt / 1000, expirationSeconds)
        let collapse = collapseID(conversation)
        var out: [PushRequest] = []
        var webhookProviders: Set<String> = []
        for device in targets {
            let apnsID = APNsID.derive(eventID: event.eventID, token: device.token)
            switch device.kind {
            case .voip:
                continue
            case .apns:
                let route = app.apnsRoute(device)
                guard let bundle = route.bundleID, !bundle.isEmpty else {
                    throw RenderError.noTopic(device, app: app)
                }
                var w = JSONWriter(capacity: 256)
                w.raw("{\"aps\":{\"content-available\":1")
                if let conversation { w.raw(",\"thread-id\":"); w.string(conversation) }
                w.raw("},\"read\":")
                writeReadObject(conversation, badge, into: &w)
                w.byte(UInt8(ascii: "}"))
                out.append(
                    PushRequest(
                        token: device.token, environment: route.environment, pushType: .background, topic: bundle,
                        priority: 5, collapseID: collapse, expiration: expiration, apnsID: apnsID, payload: w.bytes,
                        guesses: route.guesses))
            case .fcm:
                guard let credential = app.fcmCredential(device.providerID) else {
                    throw RenderError.noFCMCredential(device, app: app)
                }
                var w = JSONWriter(capacity: 512)
                w.raw("{\"message\":{\"token\":"); w.string(device.token)
                w.raw(",\"data\":{\"type\":\"read\"")
                if let conversation {
                    w.raw(",\"conversation\":"); w.string(conversation)
                } else {
                    w.raw(",\"all\":\"true\"")
                }
                if let badge { w.raw(",\"badge\":\""); w.int(badge); w.byte(UInt8(ascii: "\"")) }
                w.raw("},\"android\":{\"priority\":\"normal\",\"ttl\":\""); w.int(expirationSeconds)
                w.raw("s\",\"collapse_key\":"); w.string(collapse)
                // iOS apps reached through FCM: the same background push as above.
                w.raw(
                    "},\"apns\":{\"headers\":{\"apns-push-type\":\"background\",\"apns-priority\":\"5\"},\"payload\":{\"aps\":{\"content-available\":1"
                )
                if let conversation { w.raw(",\"thread-id\":"); w.string(conversation) }
                w.raw("}}}}}")
                out.append(
                    PushRequest(
                        token: device.token, environment: .production, pushType: .alert,
                        topic: credential.providerID, priority: 5, collapseID: collapse, expiration: expiration,
                        apnsID: apnsID, payload: w.bytes, provider: .fcm, providerID: credential.providerID))
            case .webhook:
                guard let hook = app.webhook(device.providerID) else { throw RenderError.noWebhook(device, app: app) }
                if !webhookProviders.insert(hook.providerID).inserted { continue }
                var w = JSONWriter(capacity: 256)
                w.raw("{\"trigger\":\"conversation-read\",\"data\":{\"to\":{\"uid\":"); w.string(recipient)
                w.raw("},\"type\":\"read\"")
                if let conversation {
                    w.raw(",\"conversationId\":"); w.string(conversation)
                } else {
                    w.raw(",\"all\":true")
                }
                if let badge { w.raw(",\"badge\":"); w.int(badge) }
                w.raw(",\"readAt\":"); w.int(readAt)
                w.raw("},\"appId\":"); w.string(event.appID)
                w.raw(",\"region\":"); w.string(hook.region)
                w.raw(",\"webhook\":\"custom\"}")
                out.append(
                    PushRequest(
                        token: device.token, environment: .production, pushType: .alert, topic: hook.providerID,
                        priority: 5, collapseID: collapse, expiration: expiration, apnsID: apnsID, payload: w.bytes,
                        provider: .webhook, providerID: hook.providerID))
            case .webpush:
                // A browser must show a notification for every push it receives: no silent clear is sent.
                continue
            }
        }
        return out
    }

    /// `{"conversation":"c1","badge":2}`, or `{"all":true,"badge":0}` for every conversation; no badge when badges
    /// are off for the app or the user.
    static func writeReadObject(_ conversation: String?, _ badge: Int?, into w: inout JSONWriter) {
        if let conversation {
            w.raw("{\"conversation\":"); w.string(conversation)
        } else {
            w.raw("{\"all\":true")
        }
        if let badge { w.raw(",\"badge\":"); w.int(badge) }
        w.byte(UInt8(ascii: "}"))
    }
}
