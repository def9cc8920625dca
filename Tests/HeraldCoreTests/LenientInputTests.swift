// Loose input: the forms the vendors' REST APIs send where the meaning is clear (Easemob flags as
// 1/0, CometChat's `sentAt` as a string of digits) are accepted with a warning naming the field; what is
// ambiguous is still rejected with the field named.

import Foundation
import HeraldCore
import Testing

struct LenientRow: Sendable, CustomTestStringConvertible {
    var name: String
    var text: String
    var field: String
    var check: @Sendable (ChatEvent) -> Bool
    var testDescription: String { name }
}

let lenientRows: [LenientRow] = [
    LenientRow(
        name: "em_ignore_notification: 1",
        text: replacing(#""em_ignore_notification":false"#, #""em_ignore_notification":1"#),
        field: "ext.em_ignore_notification", check: { $0.ext.ignoreNotification }),
    LenientRow(
        name: "em_ignore_notification: 0",
        text: replacing(#""em_ignore_notification":false"#, #""em_ignore_notification":0"#),
        field: "ext.em_ignore_notification", check: { !$0.ext.ignoreNotification }),
    LenientRow(
        name: "em_force_notification: \"true\"",
        text: replacing(#""em_force_notification":false"#, #""em_force_notification":"true""#),
        field: "ext.em_force_notification", check: { $0.ext.forceNotification }),
    LenientRow(
        name: "em_force_notification: \"FALSE\"",
        text: replacing(#""em_force_notification":false"#, #""em_force_notification":"FALSE""#),
        field: "ext.em_force_notification", check: { !$0.ext.forceNotification }),
    LenientRow(
        name: "em_push_mutable_content: \"1\"",
        text: replacing(
            #""em_push_content":"Custom push display""#,
            #""em_push_content":"Custom push display","em_push_mutable_content":"1""#),
        field: "ext.em_apns_ext.em_push_mutable_content", check: { $0.ext.apns.mutableContent }),
    LenientRow(
        name: "created_at as a string of digits (CometChat sentAt)",
        text: replacing(#""created_at":1732000000000"#, #""created_at":"1741847453000""#),
        field: "created_at", check: { $0.createdAt == 1_741_847_453_000 }),
]

let stillInvalidRows: [InvalidRow] = [
    InvalidRow(
        "em_ignore_notification: 2", replacing(#""em_ignore_notification":false"#, #""em_ignore_notification":2"#),
        field: "ext.em_ignore_notification"),
    InvalidRow(
        "em_ignore_notification: \"yes\"",
        replacing(#""em_ignore_notification":false"#, #""em_ignore_notification":"yes""#),
        field: "ext.em_ignore_notification"),
    InvalidRow(
        "em_force_notification: 1.0", replacing(#""em_force_notification":false"#, #""em_force_notification":1.0"#),
        field: "ext.em_force_notification"),
    InvalidRow(
        "created_at: \"-5\"", replacing(#""created_at":1732000000000"#, #""created_at":"-5""#), field: "created_at"),
    InvalidRow(
        "created_at: \"2025-03-13\"", replacing(#""created_at":1732000000000"#, #""created_at":"2025-03-13""#),
        field: "created_at"),
    InvalidRow(
        "created_at: 20 digits", replacing(#""created_at":1732000000000"#, #""created_at":"17320000000000000000""#),
        field: "created_at"),
]

@Suite("Lenient input: vendor REST forms with a warning")
struct LenientInputTests {
    @Test("accepted with one warning naming the field", arguments: lenientRows)
    func accepted(_ row: LenientRow) throws {
        var warnings: [EventDecodeWarning] = []
        let e = try ChatEvent.decode(Array(row.text.utf8), warnings: &warnings)
        #expect(row.check(e))
        #expect(warnings.map(\.field) == [row.field])
    }

    @Test("the schema's own forms give no warning")
    func strictGivesNone() throws {
        var warnings: [EventDecodeWarning] = []
        _ = try ChatEvent.decode(Array(validEvent.utf8), warnings: &warnings)
        #expect(warnings.isEmpty)
    }

    @Test("ambiguous forms are still rejected, naming the field", arguments: stillInvalidRows)
    func rejected(_ row: InvalidRow) {
        do {
            _ = try ChatEvent.decode(row.bytes)
            Issue.record("\(row.name) was accepted")
        } catch {
            #expect(error.field == row.field)
        }
    }
}
