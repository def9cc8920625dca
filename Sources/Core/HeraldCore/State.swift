// The per-user state Herald decides with: devices, presence, preferences,
// unread counts, and conversation members. Field names are those of the
// state fixture (docs/behaviour.md §3); every field but `devices` may be absent and takes a default.

/// Where an APNs token lives: the production or the sandbox (development) host.
public enum APNsEnvironment: String, Sendable, Hashable, CaseIterable {
    case production
    case sandbox
}

/// A registered push token of one user for one app.
public struct Device: Sendable, Hashable {
    /// `apns` is a regular device token (alert pushes); `voip` a PushKit token (calls); `fcm` a
    /// Firebase Cloud Messaging registration token (Android, web, iOS through FCM); `webhook` a user
    /// reached through a custom webhook provider (one HTTPS POST per recipient).
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        case apns
        case voip
        case fcm
        case webhook
        /// A browser's Web Push subscription (`WebPushSubscription`, held in the token).
        case webpush

        /// The delivery path that serves this kind.
        public var provider: PushProvider {
            switch self {
            case .apns, .voip: .apns
            case .fcm: .fcm
            case .webhook: .webhook
            case .webpush: .webpush
            }
        }
    }

    /// Most devices of one kind (`apns`, `voip`, `fcm`, `webhook`) a user may hold per app; registering one
    /// more of that kind evicts the oldest of that kind (Sendbird's limit counts APNs tokens, not VoIP tokens).
    public static let maxPerUser = 20
    /// Longest registration token (FCM, webhook), in bytes.
    public static let maxTokenBytes = 4096
    /// Longest APNs or VoIP token, in hex digits.
    public static let maxAppleTokenDigits = 200

    /// What is wrong with a token of this kind, or nil: an `apns` or `voip` token is hex digits (at most 200),
    /// any other has no white space and at most 4096 bytes.
    public static func tokenProblem(_ token: String, kind: Kind) -> String? {
        if token.isEmpty { return "empty" }
        switch kind {
        case .apns, .voip:
            guard token.utf8.count <= maxAppleTokenDigits, token.allSatisfy(\.isHexDigit) else {
                return "an \(kind.rawValue) token is hex digits (at most \(maxAppleTokenDigits))"
            }
        case .fcm, .webhook:
            guard token.utf8.count <= maxTokenBytes, !token.contains(where: { $0.isWhitespace }) else {
                return "a registration token has no spaces and at most \(maxTokenBytes) bytes"
            }
        case .webpush:
            guard token.utf8.count <= maxTokenBytes, let subscription = WebPushSubscription(token: token) else {
                return "a webpush token is <p256dh>.<auth>.<endpoint> (register the subscription)"
            }
            return subscription.problem
        }
        return nil
    }

    public var token: String
    public var kind: Kind
    /// The APNs environment the device was registered with; nil when the registration named none (then its
    /// provider id's credential gives it, else Herald guesses production: `environment`).
    public var registeredEnvironment: APNsEnvironment?
    /// The environment, `production` when the registration named none. Setting it makes it named.
    public var environment: APNsEnvironment {
        get { registeredEnvironment ?? .production }
        set { registeredEnvironment = newValue }
    }
    /// The app bundle this token belongs to; `nil` means the bundle of the APNs credential its provider id names,
    /// else the app's first credential's bundle.
    public var bundleID: String?
    /// Registration time, milliseconds since the epoch.
    public var registeredAt: Int64
    /// The credential (CometChat's "provider id") this token belongs to; `nil` means the app's first credential
    /// of that provider. For APNs it names a credential's `provider_id`, which gives the bundle id and environment
    /// the device did not name itself.
    public var providerID: String?

    /// `environment` nil: the registration named none.
    public init(
        token: String, kind: Kind = .apns, environment: APNsEnvironment? = nil,
        bundleID: String? = nil, registeredAt: Int64 = 0, providerID: String? = nil
    ) {
        self.token = token
        self.kind = kind
        self.registeredEnvironment = environment
        self.bundleID = bundleID
        self.registeredAt = registeredAt
        self.providerID = providerID
    }
}

/// The user-wide push trigger option (Sendbird's `all` / `mention_only` / `off`).
public enum PushTrigger: String, Sendable, Hashable, CaseIterable {
    case all
    case mentionOnly = "mention_only"
    case off
}

/// A conversation's push trigger; `default` defers to the user-wide option.
public enum ConversationTrigger: String, Sendable, Hashable, CaseIterable {
    case `default`
    case all
    case mentionOnly = "mention_only"
    case off
}

/// Which template family renders the body: Sendbird's default or alternative.
public enum TemplateChoice: String, Sendable, Hashable, CaseIterable {
    case `default`
    case alternative
}

/// Easemob display style: `summary` shows the details, `simple_banner` only
/// "You have a new message". `simple` (and `simple banner`) are accepted as aliases when reading JSON.
public enum DisplayStyle: String, Sendable, Hashable, CaseIterable {
    case summary
    case simpleBanner = "simple_banner"
}

/// Per-conversation notification settings of one user.
public struct ConversationPreference: Sendable, Hashable {
    public var trigger: ConversationTrigger
    public var muted: Bool

    public init(trigger: ConversationTrigger = .default, muted: Bool = false) {
        self.trigger = trigger
        self.muted = muted
    }
}

/// A time of day, `HH:mm`, from `00:00` to `24:00` (`24:00` meaning the end of the day).
public struct ClockTime: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// Minutes since midnight, 0...1440.
    public var minutes: Int

    public init(hour: Int, minute: Int = 0) {
        minutes = hour * 60 + minute
    }

    /// Parses `H:mm` / `HH:mm`; hour 0-24, minute 0-59, `24:00` only with minute 0.
    public init?(_ text: String) {
        // Read from the UTF-8 bytes (resolve reads every do-not-disturb window it loads): one or two ASCII digits,
        // a colon, two ASCII digits.
        let parsed = text.utf8.withContiguousStorageIfAvailable { Self.minutes(of: $0) }
        guard let minutes = parsed ?? Self.minutes(of: Array(text.utf8)) else { return nil }
        self.minutes = minutes
    }

    private static func minutes(of bytes: some Collection<UInt8>) -> Int? {
        var hour = 0, minute = 0, hourDigits = 0, minuteDigits = 0, colons = 0
        for byte in bytes {
            if byte == UInt8(ascii: ":") {
                colons += 1
                guard colons == 1 else { return nil }
            } else if byte &- UInt8(ascii: "0") < 10 {
                let digit = Int(byte &- UInt8(ascii: "0"))
                if colons == 0 {
                    hourDigits += 1
                    hour = hour * 10 + digit
                } else {
                    minuteDigits += 1
                    minute = minute * 10 + digit
                }
                guard hourDigits <= 2, minuteDigits <= 2 else { return nil }
            } else {
                return nil
            }
        }
        guard colons == 1, hourDigits >= 1, minuteDigits == 2, hour <= 24, minute <= 59, !(hour == 24 && minute != 0)
        else { return nil }
        return hour * 60 + minute
    }

    public var description: String {
        let h = minutes / 60, m = minutes % 60
        return (h < 10 ? "0" : "") + String(h) + ":" + (m < 10 ? "0" : "") + String(m)
    }

    public static func < (a: ClockTime, b: ClockTime) -> Bool { a.minutes < b.minutes }
}

/// Daily do-not-disturb window in the user's IANA time zone. `start > end`
/// crosses midnight; `00:00`-`24:00` is all day; `start == end` is empty.
public struct DoNotDisturb: Sendable, Hashable {
    public var start: ClockTime
    public var end: ClockTime
    /// IANA identifier, e.g. `Asia/Seoul`; defaults to `UTC`.
    public var timezone: String

    public init(start: ClockTime, end: ClockTime, timezone: String = "UTC") {
        self.start = start
        self.end = end
        self.timezone = timezone
    }

    /// Whether the window covers a local time of day (minutes since local midnight, 0..<1440).
    public func covers(minuteOfDay m: Int) -> Bool {
        let s = start.minutes, e = end.minutes
        if s == e { return false }
        if s < e { return m >= s && m < e }
        return m >= s || m < e  // crosses midnight
    }
}

/// Snooze: no pushes from `start` (inclusive) to `end` (exclusive), epoch milliseconds.
public struct Snooze: Sendable, Hashable {
    public var start: Int64
    public var end: Int64

    public init(start: Int64, end: Int64) {
        self.start = start
        self.end = end
    }

    public func covers(_ millis: Int64) -> Bool { millis >= start && millis < end }
}

/// A user's notification preferences for one app.
public struct Preferences: Sendable, Hashable {
    /// Most preferred languages kept; the first one picks the catalog.
    public static let maxLanguages = 4

    /// The fields an app's `user_defaults` may supply: those the user never set (docs/behaviour.md §3).
    public struct Defaultable: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        public static let trigger = Defaultable(rawValue: 1)
        public static let template = Defaultable(rawValue: 2)
        public static let displayStyle = Defaultable(rawValue: 4)
        public static let all: Defaultable = [.trigger, .template, .displayStyle]
    }

    /// Which of `trigger`, `template` and `display_style` the user never set: they hold the built-in value, and an
    /// app's `user_defaults` replace it. Setting one of them (even to the built-in value) takes it out of this set.
    /// Not part of equality: two preferences with the same values are equal.
    public var unset: Defaultable

    public var trigger: PushTrigger { didSet { unset.remove(.trigger) } }
    public var conversations: [String: ConversationPreference]
    public var dnd: DoNotDisturb?
    public var snooze: Snooze?
    public var template: TemplateChoice { didSet { unset.remove(.template) } }
    public var displayStyle: DisplayStyle { didSet { unset.remove(.displayStyle) } }
    /// Easemob "push display name": replaces this user's nickname in the pushes they *send*.
    public var displayName: String?
    /// The user's own nickname, kept by the registry (Sendbird's `recipient.name`, CometChat's `receiverName` of a
    /// direct conversation).
    public var nickname: String?
    public var languages: [String]
    public var badge: Bool

    /// A field passed as nil was never set (see `unset`).
    public init(
        trigger: PushTrigger? = nil, conversations: [String: ConversationPreference] = [:],
        dnd: DoNotDisturb? = nil, snooze: Snooze? = nil, template: TemplateChoice? = nil,
        displayStyle: DisplayStyle? = nil, displayName: String? = nil,
        languages: [String] = [], badge: Bool = true, nickname: String? = nil
    ) {
        var unset = Defaultable()
        if trigger == nil { unset.insert(.trigger) }
        if template == nil { unset.insert(.template) }
        if displayStyle == nil { unset.insert(.displayStyle) }
        self.unset = unset
        self.trigger = trigger ?? .all
        self.conversations = conversations
        self.dnd = dnd
        self.snooze = snooze
        self.template = template ?? .default
        self.displayStyle = displayStyle ?? .summary
        self.displayName = displayName
        self.nickname = nickname
        self.languages = Array(languages.prefix(Preferences.maxLanguages))
        self.badge = badge
    }

    public static func == (a: Preferences, b: Preferences) -> Bool {
        a.trigger == b.trigger && a.conversations == b.conversations && a.dnd == b.dnd && a.snooze == b.snooze
            && a.template == b.template && a.displayStyle == b.displayStyle && a.displayName == b.displayName
            && a.languages == b.languages && a.badge == b.badge && a.nickname == b.nickname
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(trigger); hasher.combine(conversations); hasher.combine(dnd); hasher.combine(snooze)
        hasher.combine(template); hasher.combine(displayStyle); hasher.combine(displayName)
        hasher.combine(languages); hasher.combine(badge); hasher.combine(nickname)
    }

    /// These preferences with an app's defaults in the fields the user never set (`unset`); the result has none
    /// unset.
    public func withDefaults(_ defaults: Preferences) -> Preferences {
        var p = self
        if unset.contains(.trigger) { p.trigger = defaults.trigger }
        if unset.contains(.template) { p.template = defaults.template }
        if unset.contains(.displayStyle) { p.displayStyle = defaults.displayStyle }
        p.unset = []
        return p
    }

    /// The setting for one conversation (default trigger, not muted when absent).
    public func conversation(_ id: String) -> ConversationPreference {
        conversations[id] ?? ConversationPreference()
    }
}

/// Unread message counts, for the badge and the Sendbird payload; mention counts when Herald keeps them
/// (docs/behaviour.md §12). In JSON the mention counts appear only when not zero:
/// `{"total": 5, "conversations": {"c1": 2}, "mention_total": 1, "mention_conversations": {"c1": 1}}`.
///
/// The total may be unknown: nothing ever set it (no `set_unread`, no count kept by Herald). An unknown total reads
/// as 0, but the badge is left out of the push rather than set to 0, which would clear the app icon's badge
/// (`AppConfig.badge(for:)`).
public struct Unread: Sendable, Hashable {
    /// The total unread count; nil when it was never set.
    public var storedTotal: Int?
    /// The total unread count, 0 when unknown. Setting it makes it known.
    public var total: Int {
        get { storedTotal ?? 0 }
        set { storedTotal = newValue }
    }
    /// Whether something set the total (`set_unread`, Herald's own count, or a fixture or record that names it).
    public var totalKnown: Bool { storedTotal != nil }
    public var conversations: [String: Int]
    /// Unread messages that mention the user (Sendbird's `total_unread_mention_count`).
    public var mentionTotal: Int
    /// Per conversation.
    public var mentionConversations: [String: Int]
    /// How many conversations hold an unread mention of the user (Sendbird's `channel_unread_mention_count`), as
    /// Herald's count answered it; nil: not told, and the conversations in `mentionConversations` with a count
    /// are counted instead.
    public var storedMentionedConversations: Int?

    /// Sendbird's `channel_unread_mention_count`: the conversations with an unread mention of the user.
    public var mentionedConversations: Int {
        storedMentionedConversations ?? mentionConversations.values.reduce(0) { $0 + ($1 > 0 ? 1 : 0) }
    }

    /// `total` nil: the total is unknown (nothing set it).
    public init(
        total: Int? = nil, conversations: [String: Int] = [:], mentionTotal: Int = 0,
        mentionConversations: [String: Int] = [:], mentionedConversations: Int? = nil
    ) {
        self.storedTotal = total
        self.conversations = conversations
        self.mentionTotal = mentionTotal
        self.mentionConversations = mentionConversations
        self.storedMentionedConversations = mentionedConversations
    }
}

/// Everything Herald knows about one user of one app.
public struct UserState: Sendable, Hashable {
    /// The state's values, behind one reference (`CopyOnWrite`): a state is copied into resolved and deliverable
    /// records and their decisions, and a copy is then one retain.
    struct Values: Sendable, Hashable {
        var devices: [Device]
        var online: [String]
        var preferences: Preferences
        var unread: Unread
    }

    private var values: CopyOnWrite<Values>

    /// Registered tokens, oldest first.
    public var devices: [Device] {
        get { values.value.devices }
        set { values.modify { $0.devices = newValue } }
        _modify { yield &values.value.devices }
    }
    /// Tokens of devices holding a live connection to the chat server.
    public var online: [String] {
        get { values.value.online }
        set { values.modify { $0.online = newValue } }
        _modify { yield &values.value.online }
    }
    public var preferences: Preferences {
        get { values.value.preferences }
        set { values.modify { $0.preferences = newValue } }
        _modify { yield &values.value.preferences }
    }
    public var unread: Unread {
        get { values.value.unread }
        set { values.modify { $0.unread = newValue } }
        _modify { yield &values.value.unread }
    }

    public init(
        devices: [Device] = [], online: [String] = [], preferences: Preferences = Preferences(),
        unread: Unread = Unread()
    ) {
        values = CopyOnWrite(Values(devices: devices, online: online, preferences: preferences, unread: unread))
    }

    /// Registers (or refreshes) a token. A token already present is replaced and
    /// becomes the newest; beyond `Device.maxPerUser` devices of the same kind the
    /// oldest registrations of that kind (smallest `registered_at`, earliest listed
    /// on ties) are evicted and returned so the caller can delete them from
    /// storage. `unique` (Sendbird's `unique: true`) evicts every other device of
    /// the same kind.
    @discardableResult
    public mutating func register(_ device: Device, unique: Bool = false) -> [Device] {
        devices.removeAll { $0.token == device.token }
        devices.append(device)
        let ordered = devices.enumerated().sorted {
            ($0.element.registeredAt, $0.offset) < ($1.element.registeredAt, $1.offset)
        }.map(\.element)
        let sameKind = ordered.filter { $0.kind == device.kind }
        let excess = unique ? sameKind.count - 1 : max(0, sameKind.count - Device.maxPerUser)
        let evicted = Array(sameKind.filter { !unique || $0.token != device.token }.prefix(excess))
        let gone = Set(evicted.map(\.token))
        devices = ordered.filter { !gone.contains($0.token) }
        if !evicted.isEmpty { online.removeAll { gone.contains($0) } }
        return evicted
    }

    /// Removes one token; returns the removed device, if it was registered.
    @discardableResult
    public mutating func unregister(token: String) -> Device? {
        guard let index = devices.firstIndex(where: { $0.token == token }) else { return nil }
        online.removeAll { $0 == token }
        return devices.remove(at: index)
    }

    /// Removes every token of the user; returns what was removed.
    @discardableResult
    public mutating func unregisterAll() -> [Device] {
        let removed = devices
        devices = []
        online = []
        return removed
    }

    /// Whether the device holding `token` has a live connection.
    public func isOnline(_ token: String) -> Bool { online.contains(token) }
}

/// Members of one conversation, used when an event names no recipients.
public struct ConversationState: Sendable, Hashable {
    public var members: [String]

    public init(members: [String] = []) {
        self.members = members
    }
}

/// The state fixture (docs/behaviour.md §3): what `heraldctl` loads into Redis and
/// what `simulate` reads. Users absent from `users` have no devices.
public struct StateFixture: Sendable, Hashable {
    public var users: [String: UserState]
    public var conversations: [String: ConversationState]

    public init(users: [String: UserState] = [:], conversations: [String: ConversationState] = [:]) {
        self.users = users
        self.conversations = conversations
    }

    /// The user's state, or an empty state (no devices) when unknown.
    public func user(_ id: String) -> UserState { users[id] ?? UserState() }
}

extension UserState {
    /// The state as an event in `conversation` needs it: the rules and rendering read only that conversation's
    /// preference and unread count, so the others are left out of the records between stages (a user in
    /// thousands of conversations would otherwise carry all of them through every hop).
    public func scoped(to conversation: String) -> UserState {
        // Already scoped (resolve reads only the batch's conversations of each user): the same state, uncopied.
        func only<V>(_ map: [String: V]) -> Bool { map.isEmpty || map.count == 1 && map[conversation] != nil }
        if only(preferences.conversations), only(unread.conversations), only(unread.mentionConversations) {
            return self
        }
        var scoped = self
        scoped.preferences.conversations = preferences.conversations[conversation].map { [conversation: $0] } ?? [:]
        scoped.unread.conversations = unread.conversations[conversation].map { [conversation: $0] } ?? [:]
        scoped.unread.mentionConversations = unread.mentionConversations[conversation].map { [conversation: $0] } ?? [:]
        return scoped
    }
}
