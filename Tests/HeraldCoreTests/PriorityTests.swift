// Priority classes: which class (and lane) each kind of event gets, with the default policy and overrides.

import Foundation
import HeraldCore
import Testing

func callJSON(type: String = "direct") -> String {
    """
    {"event_id":"call-1","app_id":"app1","kind":"call","created_at":\(t0),"sender":{"id":"6001","name":"Cindy"},
     "conversation":{"id":"c1","type":"\(type)"},"call":{"action":"initiated","session_id":"v1.1","type":"video"}}
    """
}

struct PriorityRow: Sendable, CustomTestStringConvertible {
    var name: String
    var json: String
    var memberCount: Int?
    var recipient: String?
    var expected: PriorityClass
    var rule: String
    var testDescription: String { name }
}

let priorityRows: [PriorityRow] = [
    PriorityRow(name: "call in a direct conversation", json: callJSON(), expected: .urgent, rule: "call"),
    PriorityRow(
        name: "call in a group", json: callJSON(type: "group"), memberCount: 5000, expected: .urgent, rule: "call"),
    PriorityRow(name: "direct message", json: messageJSON(type: "direct"), expected: .high, rule: "direct"),
    PriorityRow(name: "group message", json: messageJSON(), expected: .normal, rule: "group"),
    PriorityRow(
        name: "group message, members at the threshold", json: messageJSON(), memberCount: 1000,
        expected: .normal, rule: "group"),
    PriorityRow(
        name: "group message above the member threshold", json: messageJSON(), memberCount: 1001,
        expected: .bulk, rule: "members"),
    PriorityRow(name: "admin broadcast", json: messageJSON(messageType: "admin"), expected: .bulk, rule: "broadcast"),
    PriorityRow(
        name: "mention, event as a whole", json: messageJSON(mentions: ["u2"]), expected: .high, rule: "mention"),
    PriorityRow(
        name: "mention, the mentioned recipient", json: messageJSON(mentions: ["u2"]), memberCount: 5000,
        recipient: "u2", expected: .high, rule: "mention"),
    PriorityRow(
        name: "mention, another recipient", json: messageJSON(mentions: ["u2"]), recipient: "u3",
        expected: .normal, rule: "group"),
    PriorityRow(
        name: "mention, another recipient of a huge group", json: messageJSON(mentions: ["u2"]),
        memberCount: 5000, recipient: "u3", expected: .bulk, rule: "members"),
    PriorityRow(
        name: "mention of the whole channel is not a mention rule",
        json: messageJSON(mentions: ["u2"], mentionType: "channel"),
        expected: .normal, rule: "group"),
    PriorityRow(
        name: "em_force_notification", json: messageJSON(ext: #"{"em_force_notification":true}"#),
        expected: .high, rule: "force"),
    PriorityRow(
        name: "forced broadcast", json: messageJSON(messageType: "admin", ext: #"{"em_force_notification":true}"#),
        expected: .high, rule: "force"),
    PriorityRow(
        name: "a tie goes to the first rule named: direct before force",
        json: messageJSON(type: "direct", ext: #"{"em_force_notification":true}"#), expected: .high, rule: "direct"),
    PriorityRow(
        name: "a tie goes to the first rule named: mention before force",
        json: messageJSON(mentions: ["u2"], ext: #"{"em_force_notification":true}"#), recipient: "u2",
        expected: .high, rule: "mention"),
    PriorityRow(
        name: "the most urgent rule wins whatever its place: force over members",
        json: messageJSON(ext: #"{"em_force_notification":true}"#), memberCount: 5000, expected: .high,
        rule: "force"),
]

@Suite("Priority classes")
struct PriorityTests {
    @Test("default policy", arguments: priorityRows)
    func defaults(_ row: PriorityRow) throws {
        let decision = Priority.classify(try event(row.json), memberCount: row.memberCount, recipient: row.recipient)
        #expect(decision.priorityClass == row.expected)
        #expect(decision.rule == row.rule)
        #expect(decision.lane == (row.expected <= .high ? .priority : .bulk))
    }

    @Test("lanes: urgent and high share the priority lane, normal and bulk the bulk lane")
    func lanes() {
        #expect(PriorityClass.allCases.map(\.lane) == [.priority, .priority, .bulk, .bulk])
        #expect(PriorityClass.urgent < .high && PriorityClass.high < .normal && PriorityClass.normal < .bulk)
        #expect(PriorityClass.allCases.map(\.rank) == [0, 1, 2, 3])
        #expect(!(PriorityClass.bulk < .bulk) && !(PriorityClass.bulk < .urgent))
    }

    @Test("per-app overrides")
    func overrides() throws {
        var policy = PriorityPolicy()
        policy["group"] = .high
        policy["direct"] = .normal
        policy["call"] = .high
        policy.bulkMemberThreshold = 0
        #expect(
            Priority.classify(try event(messageJSON()), policy: policy, memberCount: 100_000).priorityClass == .high)
        #expect(Priority.classify(try event(messageJSON(type: "direct")), policy: policy).priorityClass == .normal)
        #expect(Priority.classify(try event(callJSON()), policy: policy).priorityClass == .high)
        policy.bulkMemberThreshold = 10
        #expect(Priority.classify(try event(messageJSON()), policy: policy, memberCount: 11).priorityClass == .bulk)
        #expect(policy["nonsense"] == nil)
    }
}
