// iOS 15+ interruption levels and relevance scores (docs/behaviour.md §7, "Interruption level and relevance"):
// how loudly a notification may break into what the user is doing, and where it ranks in the notification
// summary. Both follow the rule that gave the push its priority class (`Priority.classify` for the recipient).

/// `aps.interruption-level`.
public enum InterruptionLevel: String, Sendable, Hashable, CaseIterable {
    /// Added to the list without lighting the screen or playing a sound.
    case passive
    /// The system default: sound and screen.
    case active
    /// Breaks through a Focus that allows time-sensitive notifications.
    case timeSensitive = "time-sensitive"
    /// Ignores the mute switch and every Focus; needs Apple's critical-alert entitlement, so it is only used when an
    /// app configures it.
    case critical
}

/// The level and relevance score of each rule of `Priority.classify`, per app (`interruption_level` and
/// `relevance_score` in the pipeline file).
public struct InterruptionPolicy: Sendable, Hashable {
    /// Level per rule (`call`, `direct`, `mention`, `force`, `group`, `broadcast`, `members`); nil: no
    /// `interruption-level` key (the app turned it off).
    public var levels: [String: InterruptionLevel]?
    /// Relevance score per rule, in hundredths (0 to 100); nil: no `relevance-score` key.
    public var relevance: [String: Int]?

    /// Calls and direct messages break through a Focus; a sender's forced message too (configurable); broadcasts
    /// and conversations above the member threshold arrive quietly; everything else is active.
    public static let defaultLevels: [String: InterruptionLevel] = [
        "call": .timeSensitive, "direct": .timeSensitive, "force": .timeSensitive, "mention": .active,
        "group": .active, "broadcast": .passive, "members": .passive,
    ]
    /// Calls first, then what was addressed to the user, then group chatter, then broadcasts.
    public static let defaultRelevance: [String: Int] = [
        "call": 100, "direct": 80, "force": 80, "mention": 70, "group": 40, "broadcast": 10, "members": 10,
    ]
    /// The rules a level or score may be set for.
    public static let rules = ["call", "direct", "mention", "force", "group", "broadcast", "members"]

    public init(
        levels: [String: InterruptionLevel]? = InterruptionPolicy.defaultLevels,
        relevance: [String: Int]? = InterruptionPolicy.defaultRelevance
    ) {
        self.levels = levels
        self.relevance = relevance
    }

    /// What an alert to `recipient` carries: the level and score of the rule that classed it.
    public func attention(_ event: ChatEvent, recipient: String, priority: PriorityPolicy) -> Attention {
        if levels == nil && relevance == nil { return Attention() }
        let rule = Priority.classify(event, policy: priority, recipient: recipient).rule
        return Attention(level: levels.map { $0[rule] ?? .active }, relevance: relevance?[rule])
    }
}

/// The interruption level and relevance score of one alert (nil: the key is left out).
public struct Attention: Sendable, Hashable {
    public var level: InterruptionLevel?
    /// Hundredths, 0 to 100.
    public var relevance: Int?

    public init(level: InterruptionLevel? = nil, relevance: Int? = nil) {
        self.level = level
        self.relevance = relevance
    }

    /// Appends `,"interruption-level":...,"relevance-score":...` (what is set) inside an `aps` object.
    func write(into w: inout JSONWriter) {
        if let level { w.raw(",\"interruption-level\":"); w.string(level.rawValue) }
        if let relevance { w.raw(",\"relevance-score\":"); w.bytes.append(contentsOf: Self.decimal(relevance).utf8) }
    }

    /// Hundredths as a JSON number: `0`, `0.05`, `0.4`, `1`.
    static func decimal(_ hundredths: Int) -> String {
        let v = min(100, max(0, hundredths))
        if v == 100 { return "1" }
        if v == 0 { return "0" }
        let digits = v < 10 ? "0" + String(v) : String(v)
        return "0." + (digits.hasSuffix("0") ? String(digits.dropLast()) : digits)
    }
}
