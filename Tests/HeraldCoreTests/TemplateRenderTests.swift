import HeraldCore
import Testing

@Suite("Templates: literal runs and variables")
struct TemplateRenderTests {
    static func values(_ v: TemplateVariable) -> String {
        switch v {
        case .senderName: return "Zoë"
        case .message: return "你好 👋 see you at 5"
        case .channelName: return String(repeating: "long channel name ", count: 60)
        case .emoji: return "🎉"
        case .count: return ""
        default: return v.rawValue.uppercased()
        }
    }

    @Test(
        "each variable is replaced, unknown or unclosed names stay literal",
        arguments: [
            ("{sender_name}: {message}", "Zoë: 你好 👋 see you at 5"),
            ("You have a new message", "You have a new message"),
            ("", ""),
            ("{sender_name}{emoji}{sender_name}", "Zoë🎉Zoë"),
            ("{nope} and {sender_name", "{nope} and {sender_name"),
            ("{{sender_name}}", "{Zoë}"),
            ("{count} new", " new"),
            ("{filename}", "FILENAME"),
            ("in {channel_name}!", "in " + String(repeating: "long channel name ", count: 60) + "!"),
        ])
    func render(source: String, expected: String) {
        let rendered = Template(source).render(Self.values)
        #expect(rendered == expected)
        #expect(rendered.utf8.count == expected.utf8.count)
    }
}
