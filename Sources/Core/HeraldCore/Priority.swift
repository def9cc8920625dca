// Priority classes and lanes (docs/pipeline.md, "Priority lanes"). Ingest decides an event's class once, from
// the event and the app's policy; the class picks the lane (a set of Kafka topics and a stage loop of its own
// in every stage), so a call never waits behind a backlog of group messages.

/// How urgent a notification is. Declared from most to least urgent.
public enum PriorityClass: String, Sendable, Hashable, CaseIterable, Comparable {
    /// Calls (ringing, VoIP): useless seconds later.
    case urgent
    /// Direct messages, mentions, `em_force_notification`.
    case high
    /// Other group messages, reactions, group actions.
    case normal
    /// Admin broadcasts, conversations above the app's member threshold.
    case bulk

    /// The lane that carries the class: urgent and high share the priority lane, normal and bulk the bulk lane.
    public var lane: Lane { self == .urgent || self == .high ? .priority : .bulk }

    /// The class's place from the most urgent (0) to bulk (3), the order of `allCases`.
    public var rank: Int {
        switch self {
        case .urgent: 0
        case .high: 1
        case .normal: 2
        case .bulk: 3
        }
    }

    public static func < (a: PriorityClass, b: PriorityClass) -> Bool { a.rank < b.rank }
}

/// A path through the pipeline: its own topics and its own stage loop in every stage.
public enum Lane: String, Sendable, Hashable, CaseIterable {
    case priority
    case bulk
}

/// Which class each kind of event gets, per app (`apps.<id>.priority` in the pipeline file).
public struct PriorityPolicy: Sendable, Hashable {
    /// `kind: call`.
    public var call: PriorityClass = .urgent
    /// Messages in a `direct` conversation.
    public var direct: PriorityClass = .high
    /// Messages that mention users by id (the class of the mentioned recipients; see `Priority.classify`).
    public var mention: PriorityClass = .high
    /// Events with `em_force_notification: true`.
    public var forced: PriorityClass = .high
    /// Other group messages, reactions and group actions.
    public var group: PriorityClass = .normal
    /// Messages of type `admin` (broadcasts).
    public var broadcast: PriorityClass = .bulk
    /// A group event fanned out to more members than this is `bulk` (0: never).
    public var bulkMemberThreshold: Int = 1000

    public init() {}

    /// The policy's keys in the pipeline file, with the rule each sets.
    public static let keys = ["call", "direct", "mention", "force", "group", "broadcast"]

    public subscript(rule: String) -> PriorityClass? {
        get {
            switch rule {
            case "call": call
            case "direct": direct
            case "mention": mention
            case "force": forced
            case "group": group
            case "broadcast": broadcast
            default: nil
            }
        }
        set {
            guard let newValue else { return }
            switch rule {
            case "call": call = newValue
            case "direct": direct = newValue
            case "mention": mention = newValue
            case "force": forced = newValue
            case "group": group = newValue
            case "broadcast": broadcast = newValue
            default: break
            }
        }
    }
}

/// An event's class and the rule that gave it (for explain and simulate).
public struct PriorityDecision: Sendable, Hashable {
    public var priorityClass: PriorityClass
    /// `call`, `direct`, `mention`, `force`, `group`, `broadcast` or `members` (above the member threshold).
    public var rule: String
    public init(_ priorityClass: PriorityClass, rule: String) {
        self.priorityClass = priorityClass
        self.rule = rule
    }
    public var lane: Lane { priorityClass.lane }
}

public enum Priority {
    /// The event's class: the most urgent class any rule that matches gives it.
    ///
    /// - Parameters:
    ///   - memberCount: the conversation's member count where known (resolve); above the policy's threshold a
    ///     `group` class becomes `bulk`. Ingest passes nil.
    ///   - recipient: for a message that mentions users, the recipient whose class is asked: the `mention` rule
    ///     applies to mentioned recipients only. Nil (ingest) asks for the event as a whole, which is the class
    ///     of its most urgent recipient.
    public static func classify(
        _ event: ChatEvent, policy: PriorityPolicy = PriorityPolicy(), memberCount: Int? = nil,
        recipient: String? = nil
    ) -> PriorityDecision {
        // The most urgent rule that matches wins; on a tie the first one named. Every event matches exactly one of
        // the rules in the switch's first statements; mention and force replace it only when more urgent.
        var best: PriorityDecision
        switch event.kind {
        case .call:
            best = PriorityDecision(policy.call, rule: "call")
        case .message, .messageEdited, .messageDeleted, .reaction, .groupAction, .conversationRead:
            if event.conversation.type == .direct {
                best = PriorityDecision(policy.direct, rule: "direct")
            } else if event.kind == .message, event.message?.type == .admin {
                best = PriorityDecision(policy.broadcast, rule: "broadcast")
            } else if let memberCount, policy.bulkMemberThreshold > 0, memberCount > policy.bulkMemberThreshold {
                best = PriorityDecision(max(policy.group, .bulk), rule: "members")
            } else {
                best = PriorityDecision(policy.group, rule: "group")
            }
            if event.kind == .message, let message = event.message, message.mentionType == .users,
                !message.mentions.isEmpty, recipient.map({ message.mentions.contains($0) }) ?? true,
                policy.mention < best.priorityClass
            {
                best = PriorityDecision(policy.mention, rule: "mention")
            }
        }
        if event.ext.forceNotification, policy.forced < best.priorityClass {
            best = PriorityDecision(policy.forced, rule: "force")
        }
        return best
    }
}
