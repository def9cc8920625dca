import Foundation
import HeraldCore
import Testing

/// Herald-kept counts (docs/behaviour.md §12): which events count for whom, and what counting, marking read and
/// `set_unread` do, as a table; then the badge and Sendbird fields that read the counts.
@Suite("Counts kept by Herald")
struct CountsTests {
    struct Row: CustomTestStringConvertible, Sendable {
        var name: String
        var event: String
        var recipients: [String]
        /// (user, mentioned) counted, in order.
        var expected: [(String, Bool)]
        var testDescription: String { name }
    }

    static let rows: [Row] = [
        Row(
            name: "a message counts for every recipient but the sender", event: messageJSON(sender: "u1"),
            recipients: ["u1", "u2", "u3"], expected: [("u2", false), ("u3", false)]),
        Row(
            name: "a mention by id marks only that recipient mentioned",
            event: messageJSON(sender: "u1", mentions: ["u3"]),
            recipients: ["u2", "u3"], expected: [("u2", false), ("u3", true)]),
        Row(
            name: "a channel mention marks everyone mentioned",
            event: messageJSON(sender: "u1", mentionType: "channel"),
            recipients: ["u2", "u3"], expected: [("u2", true), ("u3", true)]),
        Row(
            name: "a file message counts",
            event: messageJSON(
                sender: "u1", messageType: "file", text: "",
                file: #"{"name":"a.png","mime_type":"image/png","url":"https://x/a.png"}"#),
            recipients: ["u2"], expected: [("u2", false)]),
        Row(
            name: "an admin message counts",
            event: messageJSON(sender: "u1", messageType: "admin", text: "Maintenance at 10"),
            recipients: ["u2"], expected: [("u2", false)]),
        Row(
            name: "a message whose push is ignored still counts (unread is not about pushes)",
            event: messageJSON(sender: "u1", ext: #"{"em_ignore_notification": true}"#), recipients: ["u2"],
            expected: [("u2", false)]),
        Row(
            name: "an edit does not count again",
            event: messageJSON(sender: "u1").replacingOccurrences(
                of: #""kind":"message""#, with: #""kind":"message_edited""#),
            recipients: ["u2"], expected: []),
        Row(
            name: "a deletion does not count",
            event: messageJSON(sender: "u1").replacingOccurrences(
                of: #""kind":"message""#, with: #""kind":"message_deleted""#),
            recipients: ["u2"], expected: []),
        Row(
            name: "a call does not count",
            event:
                #"{"event_id":"e9","app_id":"app1","kind":"call","created_at":1732000000000,"sender":{"id":"u1","name":"A"},"conversation":{"id":"c1","type":"direct"},"call":{"action":"initiated","session_id":"s1","type":"audio"}}"#,
            recipients: ["u2"], expected: []),
        Row(
            name: "a reaction does not count",
            event:
                #"{"event_id":"e9","app_id":"app1","kind":"reaction","created_at":1732000000000,"sender":{"id":"u1","name":"A"},"conversation":{"id":"c1","type":"group"},"reaction":{"emoji":"👍","message_id":"m1"}}"#,
            recipients: ["u2"], expected: []),
    ]

    @Test("which events count, for whom, mentioned or not", arguments: rows)
    func keys(_ row: Row) throws {
        let e = try event(row.event)
        let keys = Counting.keys(for: e, recipients: row.recipients)
        #expect(keys.map(\.user) == row.expected.map(\.0))
        #expect(keys.map(\.mentioned) == row.expected.map(\.1))
        #expect(keys.allSatisfy { $0.eventID == e.eventID && $0.conversation == e.conversation.id })
    }

    @Test("counting, replays, mark_read and set_unread, step by step")
    func book() {
        var book = CountBook()
        func k(_ user: String, _ event: String, _ conv: String, mentioned: Bool = false) -> CountKey {
            CountKey(user: user, eventID: event, conversation: conv, mentioned: mentioned)
        }
        // Each new event adds one to the total and its conversation; mentions count apart.
        #expect(
            book.count(k("u2", "e1", "c1"))
                == CountsAfter(
                    counted: true, unreadTotal: 1, unreadConversation: 1, mentionTotal: 0, mentionConversation: 0,
                    mentionedConversations: 0))
        #expect(
            book.count(k("u2", "e2", "c1", mentioned: true))
                == CountsAfter(
                    counted: true, unreadTotal: 2, unreadConversation: 2, mentionTotal: 1, mentionConversation: 1,
                    mentionedConversations: 1))
        #expect(
            book.count(k("u2", "e3", "c2"))
                == CountsAfter(
                    counted: true, unreadTotal: 3, unreadConversation: 1, mentionTotal: 1, mentionConversation: 0,
                    mentionedConversations: 1))
        // A replay counts nothing and answers the current counts.
        #expect(
            book.count(k("u2", "e2", "c1", mentioned: true))
                == CountsAfter(
                    counted: false, unreadTotal: 3, unreadConversation: 2, mentionTotal: 1, mentionConversation: 1,
                    mentionedConversations: 1))
        // The same event counts once per recipient.
        #expect(book.count(k("u3", "e2", "c1")).counted)
        // mark_read of one conversation takes its counts off the totals.
        book.markRead(user: "u2", conversation: "c1")
        #expect(book.unread["u2"] == Unread(total: 1, conversations: ["c2": 1]))
        // set_unread is the absolute override; mention counts stay.
        #expect(book.count(k("u2", "e4", "c1", mentioned: true)).mentionTotal == 1)
        book.setUnread(user: "u2", Unread(total: 10, conversations: ["c1": 7, "c2": 3]))
        #expect(
            book.count(k("u2", "e5", "c2"))
                == CountsAfter(
                    counted: true, unreadTotal: 11, unreadConversation: 4, mentionTotal: 1, mentionConversation: 0,
                    mentionedConversations: 1))
        // mark_read without a conversation resets everything.
        book.markRead(user: "u2", conversation: nil)
        #expect(book.unread["u2"] == nil)
        #expect(book.count(k("u2", "e6", "c1")).unreadTotal == 1)
        // Marking read never drives a total below zero (a set_unread total smaller than a conversation's count).
        book.setUnread(user: "u4", Unread(total: 1, conversations: ["c1": 5]))
        book.markRead(user: "u4", conversation: "c1")
        #expect(book.unread["u4"]?.total == 0)
    }

    @Test(
        "the badge, Sendbird's unread_message_count, channel_unread_count and mention counts read the counts after the event"
    )
    func payloadsReadCounts() throws {
        let app = AppConfig(
            appID: "sb", payloadProfile: .sendbird(key: "sendbird"), credentials: sendbirdApp.credentials,
            payloadOptions: {
                var o = PayloadOptions(); o.sendbirdMentionedUsers = true; return o
            }())
        let e = try event(messageJSON(sender: "u1", conversation: "c1", mentions: ["u2"]))
        let after = CountsAfter(
            counted: true, unreadTotal: 7, unreadConversation: 3, mentionTotal: 2, mentionConversation: 1)
        let state = Counting.applying(after, to: user(unread: 1).scoped(to: "c1"), conversation: "c1")
        let (_, requests) = try run(e, to: "u2", state: state, app: app)
        let p = try payload(try #require(requests.first))
        #expect(p["aps"]?["badge"] == .number("7"))
        #expect(p["sendbird"]?["unread_message_count"] == .number("7"))
        #expect(p["sendbird"]?["channel_unread_count"] == .number("3"))
        #expect(p["sendbird"]?["mentioned_users"]?["total_unread_mention_count"] == .number("2"))
        #expect(p["sendbird"]?["mentioned_users"]?["channel_unread_mention_count"] == .number("1"))
    }

    @Test("mention counts survive the binary records between stages, and a version 2 record still reads")
    func mentionCountsOnTheWire() throws {
        let e = try event(messageJSON(sender: "u1", conversation: "c1"))
        var state = user(unread: 4)
        state.unread.mentionTotal = 2
        state.unread.mentionConversations = ["c1": 1]
        let record = ResolvedRecord(event: e, recipient: "u2", state: state)
        let wire = record.wireBytes()
        #expect(try StageCodec.decode(ResolvedRecord.self, from: wire) == record)
        #expect(try StageCodec.decode(ResolvedRecord.self, from: record.jsonBytes()) == record)
        // Version 2 (before mention counts): version 6's bytes without the two zero counts after the unread counts
        // and version 4's byte of unset preferences (7: none set) (here just before the last byte, the absent
        // sender display name).
        let plain = ResolvedRecord(event: e, recipient: "u2", state: user(unread: 4))
        var v2 = try version6Bytes(plain)
        #expect(Array(v2.suffix(4)) == [0, 0, 7, 0])
        v2[2] = 2
        v2.removeSubrange((v2.count - 4)..<(v2.count - 1))
        #expect(try StageCodec.decode(ResolvedRecord.self, from: v2) == plain)
    }
}
