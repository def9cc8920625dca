// The digest when Do Not Disturb or a snooze ends (docs/behaviour.md §6d): messages suppressed for a user by rule 8
// (`snoozed`) or 9 (`dnd`) in an app with `digest:` on are counted per conversation, and when the window ends the
// user gets one push, "12 new messages in 3 conversations while Do Not Disturb was on", unless they read those
// conversations meanwhile. Suppress counts (one Lua script per message on the user's own digest hash) and sends
// the due digests from its flush timer (`DigestFlusher`); render writes the text from the catalog.

import Foundation

/// An app's digest settings (`digest:` in the pipeline file). Off by default.
public struct DigestPolicy: Sendable, Hashable {
    /// Whether suppressed messages are counted and digests sent.
    public var enabled: Bool
    /// How many conversations the digest names (0 to `Digest.maxNamedConversations`).
    public var conversationsNamed: Int
    /// Whether the digest plays a sound (the app's default sound).
    public var sound: Bool
    /// A digest not sent within this long after its window ended is dropped (counted `expired`).
    public var deadlineMilliseconds: Int64

    public init(
        enabled: Bool = false, conversationsNamed: Int = 3, sound: Bool = false,
        deadlineMilliseconds: Int64 = 3_600_000
    ) {
        self.enabled = enabled
        self.conversationsNamed = conversationsNamed
        self.sound = sound
        self.deadlineMilliseconds = deadlineMilliseconds
    }

    public var isOn: Bool { enabled }
}

/// What a digest push shows, carried in its event (`ChatEvent.digest`) from suppress to render.
public struct DigestSummary: Sendable, Hashable {
    /// Which window ended.
    public enum Window: String, Sendable, Hashable, CaseIterable {
        case dnd
        case snooze
    }

    public var window: Window
    /// Messages counted.
    public var messages: Int
    /// Conversations they were in (with `more`, at least this many: some were not kept by name).
    public var conversations: Int
    /// Conversations beyond `Digest.maxConversations` were counted only in `messages`.
    public var more: Bool
    /// The names to show, most messages first (at most the app's `conversations_named`).
    public var names: [String]
    /// Whether the push plays a sound.
    public var sound: Bool

    public init(
        window: Window, messages: Int, conversations: Int, more: Bool = false, names: [String] = [],
        sound: Bool = false
    ) {
        self.window = window
        self.messages = messages
        self.conversations = conversations
        self.more = more
        self.names = names
        self.sound = sound
    }
}

public enum Digest {
    /// The explain reason of a digest produced for the user's devices.
    public static let reason = "digest"
    /// The explain reason of a digest dropped past its app's deadline.
    public static let expiredReason = "digest_expired"
    /// The explain reason of a digest with no device to go to.
    public static let noDevicesReason = "digest_no_devices"
    /// The most conversations kept by name per user; messages of further ones count only in the total.
    public static let maxConversations = 100
    /// The most `conversations_named`.
    public static let maxNamedConversations = 10
    /// The most recent counted events remembered per user, so that a replay is not counted twice.
    public static let seenEvents = 256
    /// The sender id of a digest's event (a digest comes from Herald, not from a user).
    public static let senderID = "herald"
    /// The conversation id of a digest's event when it is about more than one conversation (its APNs thread).
    public static let conversationID = "herald.digest"

    /// The window a suppression by `reason` (rule 8 or 9) at `millis` belongs to, and when it ends (epoch ms);
    /// nil for any other reason.
    public static func window(
        reason: SuppressionReason, preferences: Preferences, at millis: Int64
    ) -> (window: DigestSummary.Window, end: Int64)? {
        switch reason {
        case .snoozed:
            guard let snooze = preferences.snooze, snooze.covers(millis) else { return nil }
            return (.snooze, snooze.end)
        case .dnd:
            guard let dnd = preferences.dnd, let end = DNDClock.end(of: dnd, covering: millis) else { return nil }
            return (.dnd, end)
        default:
            return nil
        }
    }

    /// Whether a suppressed event is counted: a message (not an edit or a deletion) suppressed by the snooze or
    /// Do Not Disturb in an app with the digest on.
    public static func counts(_ event: ChatEvent, reason: SuppressionReason, app: AppConfig) -> Bool {
        app.digest.isOn && app.push && event.kind == .message && (reason == .snoozed || reason == .dnd)
    }

    /// The event id of a user's digest for the window ending at `end`: the same however often it is produced, so
    /// send's delivery records skip a second copy.
    public static func eventID(user: String, end: Int64) -> String {
        "digest-\(end)-" + SHA256.hex(Array(user.utf8)).prefix(24)
    }

    /// What the flush timer does with a due digest at `now`.
    public enum Due: Sendable, Hashable {
        /// Send it to these devices.
        case send(targets: [Device])
        /// The window was extended (or a new one began): look again at `end`.
        case reschedule(window: DigestSummary.Window, end: Int64)
        /// Nothing left to show (every conversation read).
        case nothing
        /// Past the app's deadline.
        case expired
        /// The app's push is off, or the digest was turned off.
        case off
        /// No device takes it.
        case noDevices
    }

    /// The decision for a digest of `messages` messages whose window ended at `end`, for a user with `state`.
    public static func due(
        messages: Int, end: Int64, recipient: String, state: UserState, app: AppConfig, now: Int64
    ) -> Due {
        if messages <= 0 { return .nothing }
        if !app.push || !app.digest.isOn { return .off }
        if let snooze = state.preferences.snooze, snooze.covers(now), snooze.end > end {
            return .reschedule(window: .snooze, end: snooze.end)
        }
        if let dnd = state.preferences.dnd, let dndEnd = DNDClock.end(of: dnd, covering: now), dndEnd > end {
            return .reschedule(window: .dnd, end: dndEnd)
        }
        if Saturating.subtract(now, end) > app.digest.deadlineMilliseconds { return .expired }
        // The devices that take a chat message (rule 3's candidates for a message).
        let message = ChatEvent(
            eventID: "", appID: app.appID, kind: .message, sender: ChatEvent.Sender(id: senderID),
            conversation: ChatEvent.Conversation(id: conversationID, type: .group))
        var targets = Suppression.pushableDevices(event: message, state: state)
        if app.webhooks.contains(where: { $0.everyRecipient }) {
            Suppression.addEveryRecipientWebhooks(to: &targets, recipient: recipient, app: app)
        }
        return targets.isEmpty ? .noDevices : .send(targets: targets)
    }

    /// The event of a digest: from Herald, in its one conversation (`conversation`; empty: `conversationID`),
    /// carrying `summary`.
    /// Its time is the window's end, like its id the same however often it is produced (send's delivery records
    /// are cut by the event's time).
    public static func event(
        app: String, user: String, end: Int64, summary: DigestSummary, conversation: String
    ) -> ChatEvent {
        let id = eventID(user: user, end: end)
        var event = ChatEvent(
            eventID: id, appID: app, kind: .message, createdAt: end, sender: ChatEvent.Sender(id: senderID),
            conversation: ChatEvent.Conversation(
                id: conversation.isEmpty ? conversationID : conversation, type: .group),
            message: ChatEvent.Message(id: id))
        event.digest = summary
        return event
    }

    /// The digest's text in the user's catalog: the count sentence, then the named conversations.
    public static func text(_ summary: DigestSummary, strings: Strings) -> String {
        let dnd = summary.window == .dnd
        let key: CatalogKey
        let oneNamed = summary.conversations == 1 && !summary.more && summary.names.count == 1
        switch (summary.messages == 1, oneNamed, summary.conversations > 1 || summary.more) {
        case (true, true, _): key = dnd ? .digestDNDOneIn : .digestSnoozeOneIn
        case (true, false, _): key = dnd ? .digestDNDOne : .digestSnoozeOne
        case (false, true, _): key = dnd ? .digestDNDIn : .digestSnoozeIn
        case (false, false, true): key = dnd ? .digestDNDMany : .digestSnoozeMany
        case (false, false, false): key = dnd ? .digestDND : .digestSnooze
        }
        let conversations = String(summary.conversations) + (summary.more ? "+" : "")
        var text = strings[key].render { v in
            switch v {
            case .count: return String(summary.messages)
            case .conversationCount: return conversations
            case .channelName: return summary.names.first ?? ""
            default: return ""
            }
        }
        if !oneNamed && !summary.names.isEmpty {
            var line = summary.names.joined(separator: ", ")
            let rest = summary.conversations - summary.names.count
            if rest > 0 || summary.more {
                let more = String(max(rest, 0)) + (summary.more ? "+" : "")
                line += ", " + strings[.digestMore].render { $0 == .count ? more : "" }
            }
            text += "\n" + line
        }
        return text
    }

    /// The summary of a user's counts: `conversations` are (name, messages) of the conversations kept by name.
    public static func summary(
        window: DigestSummary.Window, messages: Int, conversations: [(name: String, count: Int)], more: Bool,
        policy: DigestPolicy
    ) -> DigestSummary {
        let live = conversations.filter { $0.count > 0 }
        let named =
            live
            .filter { !$0.name.isEmpty }
            .sorted { ($0.count, $1.name) > ($1.count, $0.name) }
            .prefix(policy.conversationsNamed)
            .map(\.name)
        return DigestSummary(
            window: window, messages: messages, conversations: max(live.count + (more ? 1 : 0), 1), more: more,
            names: Array(named), sound: policy.sound)
    }
}

extension DNDClock {
    /// When the do-not-disturb window covering `millis` ends (epoch ms, the first minute after it in the user's time
    /// zone); nil when it does not cover `millis`. An all-day window (`00:00`-`24:00`) ends at the next local
    /// midnight (and covers the next day again, so a digest then waits for a window that ends).
    public static func end(of dnd: DoNotDisturb, covering millis: Int64) -> Int64? {
        guard covers(dnd, millis: millis) else { return nil }
        let minute: Int64 = 60_000
        // Saturating: a record's time may be anything an internal topic carries, and a trap here is a crash loop.
        let start = Saturating.subtract(millis, ((millis % minute) + minute) % minute)
        let m = minuteOfDay(millis: start, timezone: dnd.timezone)
        var delta = ((dnd.end.minutes % 1440) - m + 1440) % 1440
        if delta == 0 { delta = 1440 }
        var candidate = Saturating.add(start, Int64(delta) * minute)
        // Across a daylight saving change the local clock moved: correct by the change of the offset.
        let z = zone(dnd.timezone)
        let before = z.secondsFromGMT(for: Date(timeIntervalSince1970: Double(start) / 1000))
        let after = z.secondsFromGMT(for: Date(timeIntervalSince1970: Double(candidate) / 1000))
        candidate = Saturating.add(candidate, Int64(before - after) * 1000)
        if candidate <= millis { candidate = Saturating.add(start, minute) }
        // Then the first minute the window does not cover (a local time skipped by the change, or an all-day window).
        var steps = 0
        while covers(dnd, millis: candidate) && steps < 180 && !(dnd.start.minutes == 0 && dnd.end.minutes >= 1440) {
            candidate = Saturating.add(candidate, minute)
            steps += 1
        }
        return candidate
    }
}

extension Digest {
    /// A digest's payload texts (every provider and payload profile starts from them, `Renderer.content`): the
    /// digest's text as the body, no title, and a sound only if the app asks for one.
    static func shape(_ content: inout PayloadContent, _ summary: DigestSummary, strings: Strings) {
        content.body = text(summary, strings: strings)
        content.title = nil
        content.detailText = content.body
        content.silent = !summary.sound
    }
}

// MARK: The digest in records

extension DigestSummary {
    /// The binary form at the end of an event (BinaryRecord.swift): 0, or 1 then the window, the counts, the more
    /// flag, the names and the sound flag.
    static func write(_ summary: DigestSummary?, into w: inout BinaryWriter) {
        guard let summary else { w.bool(false); return }
        w.bool(true)
        w.string(summary.window.rawValue); w.int(summary.messages); w.int(summary.conversations)
        w.bool(summary.more); w.strings(summary.names); w.bool(summary.sound)
    }

    static func read(_ r: inout BinaryReader) throws(StageRecordError) -> DigestSummary? {
        guard try r.bool() else { return nil }
        let window = try r.enumValue(Window.self)
        let messages = try r.int(), conversations = try r.int()
        guard messages >= 0, conversations >= 0, messages <= Int64(Int32.max), conversations <= Int64(Int32.max)
        else { throw r.fail("digest: a count out of range") }
        return DigestSummary(
            window: window, messages: Int(messages), conversations: Int(conversations), more: try r.bool(),
            names: try r.strings(), sound: try r.bool())
    }

    /// The JSON form (`digest` in an event's JSON).
    var json: JSONValue {
        .object([
            ("window", .string(window.rawValue)), ("messages", .number(String(messages))),
            ("conversations", .number(String(conversations))), ("more", .bool(more)),
            ("names", .array(names.map { .string($0) })), ("sound", .bool(sound)),
        ])
    }

    init(validating f: Fields) throws(FieldError) {
        let raw = try f.requiredString("window", limit: 16)
        guard let window = Window(rawValue: raw) else {
            throw FieldError(field: f.field("window"), message: "unknown window \"\(raw)\" (dnd, snooze)")
        }
        func count(_ key: String) throws(FieldError) -> Int {
            guard case .number(let text)? = f.value(key), let n = Int(text), n >= 0, n <= Int(Int32.max) else {
                throw FieldError(field: f.field(key), message: "expected a count")
            }
            return n
        }
        let names = try f.optionalStringArray("names") ?? []
        guard names.count <= Digest.maxNamedConversations else {
            throw FieldError(field: f.field("names"), message: "more than \(Digest.maxNamedConversations) names")
        }
        self.init(
            window: window, messages: try count("messages"), conversations: try count("conversations"),
            more: try f.optionalBool("more") ?? false, names: names, sound: try f.optionalBool("sound") ?? false)
    }
}

// MARK: The digest ledger's records

/// One suppressed message to count for a user's digest.
public struct DigestCount: Sendable, Hashable {
    public var appID: String
    public var user: String
    public var eventID: String
    public var conversation: String
    /// The conversation's name ("" when it has none).
    public var name: String
    public var window: DigestSummary.Window
    /// When the window ends (epoch ms).
    public var end: Int64
    public var deadlineMilliseconds: Int64
    /// A traced message's context (`StageInput.trace`): the digest carries the context of the latest traced message
    /// counted in it. nil for an untraced one (nothing is kept).
    public var trace: HeldTrace?

    public init(
        appID: String, user: String, eventID: String, conversation: String, name: String,
        window: DigestSummary.Window, end: Int64, deadlineMilliseconds: Int64, trace: HeldTrace? = nil
    ) {
        self.trace = trace
        self.appID = appID
        self.user = user
        self.eventID = eventID
        self.conversation = conversation
        self.name = name
        self.window = window
        self.end = end
        self.deadlineMilliseconds = deadlineMilliseconds
    }
}

/// A user's digest taken by the flush timer.
public struct DueDigest: Sendable, Hashable {
    public var user: String
    /// When its window ends (0: the hash was gone: read, expired or already sent).
    public var end: Int64
    public var window: DigestSummary.Window
    public var messages: Int
    /// Conversations kept by name: id, name, messages.
    public var conversations: [Conversation]
    /// Messages of conversations beyond `Digest.maxConversations`.
    public var other: Int
    /// The score the claim gave it (its lease), which the confirmation checks.
    public var lease: Int64
    /// The context of the latest traced message counted (`DigestCount.trace`), which the digest's record carries; nil
    /// when none was traced.
    public var trace: HeldTrace?

    public struct Conversation: Sendable, Hashable {
        public var id: String
        public var name: String
        public var count: Int

        public init(id: String, name: String, count: Int) {
            self.id = id
            self.name = name
            self.count = count
        }
    }

    public init(
        user: String, end: Int64, window: DigestSummary.Window, messages: Int, conversations: [Conversation],
        other: Int, lease: Int64, trace: HeldTrace? = nil
    ) {
        self.trace = trace
        self.user = user
        self.end = end
        self.window = window
        self.messages = messages
        self.conversations = conversations
        self.other = other
        self.lease = lease
    }
}
