// The values at the edges of what Herald's inputs may carry, and records built from them: the property tests throw
// them at every decoder and stage, and the fault suite's `extreme-records` scenario publishes them to a running
// stack. Each record is well-formed JSON except where the value itself is not (raw NUL, invalid UTF-8); every one
// must end in a result or a dead letter with a reason, never a trap.

/// Boundary values as JSON fragments, and the `chat.events` and `herald.registry` records that carry them.
public enum BoundaryValues {
    /// Numbers as written in JSON: 0, -1, the 32-bit, 53-bit and 64-bit limits and one past them, the unsigned
    /// limits, floats, exponents and negative zero.
    public static let numbers: [String] = [
        "0", "-0", "-1", "1",
        "2147483647", "2147483648", "-2147483648", "-2147483649",
        "4294967295", "4294967296",
        "9007199254740991", "9007199254740992", "-9007199254740991", "-9007199254740992",
        "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
        "18446744073709551615", "18446744073709551616",
        "1e308", "-1e308", "1e309", "1E3", "1e-308", "-0.0", "0.0", "1.5", "-1.5",
        "99999999999999999999999999999999999999",
    ]

    /// String contents (the bytes between the quotes): empty, braces, a NUL escaped and raw, the largest valid
    /// scalar, invalid UTF-8 (a lone continuation byte, a cut sequence, a surrogate, a scalar past U+10FFFF), and
    /// strings at and one past each byte limit (ids 256, tokens 200 hex digits and 4096 bytes, text 65536).
    public static let stringContents: [[UInt8]] = [
        [],
        Array("{}".utf8), Array("}".utf8), Array("{".utf8), Array("}u1{".utf8),
        Array("\\u0000".utf8), [0x00], Array("a\\u0000b".utf8),
        Array("\u{10FFFF}".utf8), Array("\\udbff\\udfff".utf8), Array("\\ud800".utf8),
        [0x80], [0xC3], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xFF, 0xFE],
        repeated("a", 256), repeated("a", 257),
        repeated("f", 200), repeated("f", 201),
        repeated("a", 4096), repeated("a", 4097),
        repeated("a", 65_536), repeated("a", 65_537),
    ]

    /// Every boundary value as a JSON fragment: the numbers as written, each string content in quotes.
    public static var fragments: [[UInt8]] {
        numbers.map { Array($0.utf8) } + stringContents.map { [0x22] + $0 + [0x22] }
    }

    /// A record with one field set to a boundary value: `field` names the field, `bytes` is the whole record.
    public struct Record: Sendable, Hashable {
        public var field: String
        public var bytes: [UInt8]
    }

    /// The fields of a chat event that take a boundary value, each as a template with `@` where the value goes.
    /// `id` makes the event id unique (the fault suite runs them next to other events).
    public static func chatEventTemplates(
        app: String, conversation: String, sender: String, recipient: String
    )
        -> [(field: String, template: String)]
    {
        func event(
            created: String = "1732000000000", eventID: String = "\"#ID\"", appID: String? = nil,
            senderID: String? = nil, conversationID: String? = nil, text: String = "\"hi\"",
            recipients: String? = nil, mentions: String = "[]", extra: String = ""
        ) -> String {
            """
            {"event_id":\(eventID),"app_id":\(appID ?? "\"\(app)\""),"kind":"message","created_at":\(created),\
            "sender":{"id":\(senderID ?? "\"\(sender)\""),"name":"Edge"},\
            "conversation":{"id":\(conversationID ?? "\"\(conversation)\""),"type":"group"},\
            "recipients":\(recipients ?? "[\"\(recipient)\"]"),\
            "message":{"id":"m","type":"text","text":\(text),"mentions":\(mentions)}\(extra)}
            """
        }
        return [
            ("created_at", event(created: "@")),
            ("event_id", event(eventID: "@")),
            ("app_id", event(appID: "@")),
            ("sender.id", event(senderID: "@")),
            ("conversation.id", event(conversationID: "@")),
            ("message.text", event(text: "@")),
            ("recipients[0]", event(recipients: "[@]")),
            ("message.mentions[0]", event(mentions: "[@]")),
            ("ext.em_ignore_notification", event(extra: ",\"ext\":{\"em_ignore_notification\":@}")),
            ("ext.em_apns_ext.extern", event(extra: ",\"ext\":{\"em_apns_ext\":{\"extern\":@}}")),
        ]
    }

    /// The fields of `herald.registry` records that take a boundary value, as templates with `@`.
    public static func registryTemplates(app: String, user: String) -> [(field: String, template: String)] {
        let token = String(repeating: "e", count: 64)
        let head = "\"app_id\":\"\(app)\",\"user\":\"\(user)\""
        return [
            ("set_presence.ttl_ms", "{\"op\":\"set_presence\",\(head),\"online\":[\"\(token)\"],\"ttl_ms\":@}"),
            ("set_presence.online[0]", "{\"op\":\"set_presence\",\(head),\"online\":[@],\"ttl_ms\":1000}"),
            ("mark_read.read_at", "{\"op\":\"mark_read\",\(head),\"conversation\":\"c-edge\",\"read_at\":@}"),
            ("mark_read.token", "{\"op\":\"mark_read\",\(head),\"conversation\":\"c-edge\",\"token\":@}"),
            ("set_unread.total", "{\"op\":\"set_unread\",\(head),\"unread\":{\"total\":@,\"conversations\":{}}}"),
            (
                "set_unread.conversations",
                "{\"op\":\"set_unread\",\(head),\"unread\":{\"total\":1,\"conversations\":{\"c-edge\":@}}}"
            ),
            (
                "register_device.device.registered_at",
                "{\"op\":\"register_device\",\(head),\"device\":{\"token\":\"\(token)\",\"kind\":\"apns\",\"registered_at\":@}}"
            ),
            (
                "register_device.device.bundle_id",
                "{\"op\":\"register_device\",\(head),\"device\":{\"token\":\"\(token)\",\"kind\":\"apns\",\"bundle_id\":@}}"
            ),
            (
                "register_device.device.provider_id",
                "{\"op\":\"register_device\",\(head),\"device\":{\"token\":\"\(token)\",\"kind\":\"fcm\",\"provider_id\":@}}"
            ),
            (
                "register_device.device.token",
                "{\"op\":\"register_device\",\(head),\"device\":{\"token\":@,\"kind\":\"fcm\"}}"
            ),
            ("unregister_device.token", "{\"op\":\"unregister_device\",\(head),\"token\":@}"),
            ("unregister_all.user", "{\"op\":\"unregister_all\",\"app_id\":\"\(app)\",\"user\":@}"),
            (
                "set_members.members[0]",
                "{\"op\":\"set_members\",\"app_id\":\"\(app)\",\"conversation\":\"c-edge\",\"members\":[@]}"
            ),
            (
                "patch_preferences.patch.set.snooze",
                "{\"op\":\"patch_preferences\",\(head),\"patch\":{\"set\":{\"snooze\":{\"start\":@,\"end\":@}}}}"
            ),
        ]
    }

    /// The template with every `@` replaced by `fragment` and `#ID` by `id`.
    public static func fill(_ template: String, with fragment: [UInt8], id: String = "edge") -> [UInt8] {
        var out: [UInt8] = []
        let bytes = Array(template.replacing("#ID", with: id).utf8)
        out.reserveCapacity(bytes.count + fragment.count)
        for byte in bytes {
            if byte == UInt8(ascii: "@") { out += fragment } else { out.append(byte) }
        }
        return out
    }

    /// Every chat event template filled with every boundary value; event ids are `<idPrefix>-<n>`.
    public static func chatEvents(
        app: String, conversation: String, sender: String, recipient: String, idPrefix: String
    ) -> [Record] {
        var out: [Record] = []
        var n = 0
        for (field, template) in chatEventTemplates(
            app: app, conversation: conversation, sender: sender, recipient: recipient)
        {
            for fragment in fragments {
                n += 1
                out.append(Record(field: field, bytes: fill(template, with: fragment, id: "\(idPrefix)-\(n)")))
            }
        }
        return out
    }

    /// Every registry template filled with every boundary value.
    public static func registryRecords(app: String, user: String) -> [Record] {
        registryTemplates(app: app, user: user).flatMap { field, template in
            fragments.map { Record(field: field, bytes: fill(template, with: $0)) }
        }
    }

    private static func repeated(_ c: Character, _ count: Int) -> [UInt8] {
        Array(String(repeating: c, count: count).utf8)
    }
}
