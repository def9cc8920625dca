// Unread and mention counts kept by Herald for an app that opts in (`counts: true`, docs/behaviour.md §12).
// Which events count, for whom, and what a count does to the state, as pure rules; the Redis adapter keeps the
// counts (one Lua script per event and recipient), resolve asks for them and hands the result to render.

/// One message event to count for one recipient.
public struct CountKey: Sendable, Hashable {
    public var user: String
    public var eventID: String
    public var conversation: String
    /// The recipient is mentioned (by id, or the whole channel).
    public var mentioned: Bool

    public init(user: String, eventID: String, conversation: String, mentioned: Bool) {
        self.user = user
        self.eventID = eventID
        self.conversation = conversation
        self.mentioned = mentioned
    }
}

/// The counts after counting one event for one recipient.
public struct CountsAfter: Sendable, Hashable {
    /// False when the event had been counted for this recipient before (a replay): nothing changed.
    public var counted: Bool
    public var unreadTotal: Int
    public var unreadConversation: Int
    public var mentionTotal: Int
    public var mentionConversation: Int
    /// How many conversations hold an unread mention of the user; nil when the counter did not say.
    public var mentionedConversations: Int?

    public init(
        counted: Bool, unreadTotal: Int, unreadConversation: Int, mentionTotal: Int, mentionConversation: Int,
        mentionedConversations: Int? = nil
    ) {
        self.counted = counted
        self.unreadTotal = unreadTotal
        self.unreadConversation = unreadConversation
        self.mentionTotal = mentionTotal
        self.mentionConversation = mentionConversation
        self.mentionedConversations = mentionedConversations
    }
}

public enum Counting {
    /// Whether an event counts as unread: a new message (text, file or admin), whatever happens to its push
    /// (delivered, or suppressed for any reason, including `em_ignore_notification`). Edits and deletions change
    /// a message already counted; calls, reactions and group actions are not messages.
    public static func counts(_ event: ChatEvent) -> Bool { event.kind == .message }

    /// What to count for an event: one key per recipient (never the sender), in recipient order.
    public static func keys(for event: ChatEvent, recipients: [String]) -> [CountKey] {
        guard counts(event) else { return [] }
        return recipients.filter { $0 != event.sender.id }.map {
            CountKey(
                user: $0, eventID: event.eventID, conversation: event.conversation.id, mentioned: event.mentions($0))
        }
    }

    /// A recipient's state (already scoped to the event's conversation) with the counts after this event: the
    /// badge and Sendbird's `unread_message_count`, `channel_unread_count` and mention counts read these.
    public static func applying(_ after: CountsAfter, to state: UserState, conversation: String) -> UserState {
        var s = state
        s.unread.total = after.unreadTotal
        s.unread.conversations[conversation] = after.unreadConversation
        s.unread.mentionTotal = after.mentionTotal
        s.unread.mentionConversations[conversation] = after.mentionConversation
        if let n = after.mentionedConversations { s.unread.storedMentionedConversations = n }
        return s
    }
}

/// The counting rules over an in-memory book (tests, and the reference the Redis scripts are checked against):
/// `count` once per (event, user), `markRead` per conversation or all, `setUnread` as the absolute override.
public struct CountBook: Sendable, Hashable {
    public var unread: [String: Unread] = [:]
    var counted: Set<String> = []

    public init() {}

    public mutating func count(_ key: CountKey) -> CountsAfter {
        var u = unread[key.user] ?? Unread()
        let fresh = counted.insert("\(key.user)\u{0}\(key.eventID)").inserted
        if fresh {
            u.total += 1
            u.conversations[key.conversation, default: 0] += 1
            if key.mentioned {
                u.mentionTotal += 1
                u.mentionConversations[key.conversation, default: 0] += 1
            }
            unread[key.user] = u
        }
        return CountsAfter(
            counted: fresh, unreadTotal: u.total, unreadConversation: u.conversations[key.conversation] ?? 0,
            mentionTotal: u.mentionTotal, mentionConversation: u.mentionConversations[key.conversation] ?? 0,
            mentionedConversations: u.mentionConversations.values.filter { $0 > 0 }.count)
    }

    public mutating func markRead(user: String, conversation: String?) {
        guard var u = unread[user] else { return }
        if let conversation {
            u.total = max(0, u.total - (u.conversations.removeValue(forKey: conversation) ?? 0))
            u.mentionTotal = max(0, u.mentionTotal - (u.mentionConversations.removeValue(forKey: conversation) ?? 0))
            unread[user] = u
        } else {
            unread[user] = nil
        }
    }

    /// `set_unread`: replaces the unread counts; mention counts are left alone.
    public mutating func setUnread(user: String, _ value: Unread) {
        var u = value
        u.mentionTotal = unread[user]?.mentionTotal ?? 0
        u.mentionConversations = unread[user]?.mentionConversations ?? [:]
        unread[user] = u
    }
}
