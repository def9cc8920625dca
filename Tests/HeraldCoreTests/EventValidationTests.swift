// Chat event validation: every invalid input names its field; nothing traps.

import Foundation
import HeraldCore
import Testing

let validEvent = """
    {"event_id":"e-9f2c","app_id":"app1","kind":"message","created_at":1732000000000,
     "sender":{"id":"u1","name":"Cindy","profile_url":"https://cdn.example/u1.png"},
     "conversation":{"id":"c1","type":"group","name":"Hiking","custom_type":"support"},
     "recipients":["u2","u3"],
     "message":{"id":"373360335316321408","type":"text","text":"Bye!","custom_type":"","data":"",
       "file":{"name":"hello_world.jpg","mime_type":"image/jpeg","url":"https://cdn.example/f.jpg"},
       "mentions":["u2"],"mention_type":"users","language":"en","translations":{"fr":"Au revoir !"}},
     "call":{"action":"initiated","session_id":"v1.123.aik2","type":"audio"},
     "reaction":{"emoji":"😎","message_id":"58"},
     "group_action":{"action":"left","actor_name":"Andrew Joseph"},
     "ext":{"em_ignore_notification":false,"em_force_notification":false,
            "em_apns_ext":{"em_push_content":"Custom push display","extern":"custom push extension"}}}
    """

/// Replaces one part of the valid event: (name, json text, expected field).
struct InvalidRow: Sendable, CustomTestStringConvertible {
    var name: String
    var bytes: [UInt8]
    var field: String
    var testDescription: String { name }

    init(_ name: String, _ text: String, field: String) {
        self.name = name
        self.bytes = Array(text.utf8)
        self.field = field
    }

    init(_ name: String, bytes: [UInt8], field: String) {
        self.name = name
        self.bytes = bytes
        self.field = field
    }
}

func replacing(_ old: String, _ new: String) -> String {
    validEvent.replacingOccurrences(of: old, with: new)
}

let invalidRows: [InvalidRow] = [
    InvalidRow("missing event_id", replacing(#""event_id":"e-9f2c","#, ""), field: "event_id"),
    InvalidRow("empty event_id", replacing(#""event_id":"e-9f2c""#, #""event_id":"""#), field: "event_id"),
    InvalidRow(
        "event_id of the wrong type", replacing(#""event_id":"e-9f2c""#, #""event_id":{"a":1}"#), field: "event_id"),
    InvalidRow("missing app_id", replacing(#""app_id":"app1","#, ""), field: "app_id"),
    InvalidRow("unknown kind", replacing(#""kind":"message""#, #""kind":"poke""#), field: "kind"),
    InvalidRow("kind is a number", replacing(#""kind":"message""#, #""kind":3"#), field: "kind"),
    InvalidRow(
        "created_at is a string", replacing(#""created_at":1732000000000"#, #""created_at":"yesterday""#),
        field: "created_at"),
    InvalidRow(
        "created_at is negative", replacing(#""created_at":1732000000000"#, #""created_at":-5"#), field: "created_at"),
    InvalidRow(
        "created_at is fractional", replacing(#""created_at":1732000000000"#, #""created_at":1.5"#), field: "created_at"
    ),
    InvalidRow(
        "sender missing",
        replacing(#""sender":{"id":"u1","name":"Cindy","profile_url":"https://cdn.example/u1.png"},"#, ""),
        field: "sender"),
    InvalidRow("sender id missing", replacing(#""sender":{"id":"u1","#, #""sender":{"#), field: "sender.id"),
    InvalidRow("sender name is a number", replacing(#""name":"Cindy""#, #""name":7"#), field: "sender.name"),
    InvalidRow(
        "conversation type unknown", replacing(#""type":"group""#, #""type":"broadcast""#), field: "conversation.type"),
    InvalidRow("conversation id missing", replacing(#""id":"c1","#, ""), field: "conversation.id"),
    InvalidRow(
        "recipients not an array", replacing(#""recipients":["u2","u3"]"#, #""recipients":"u2""#), field: "recipients"),
    InvalidRow(
        "recipient not a string", replacing(#""recipients":["u2","u3"]"#, #""recipients":["u2",true]"#),
        field: "recipients[1]"),
    InvalidRow("message missing for kind message", replacing(#""message":{"#, #""not_message":{"#), field: "message"),
    InvalidRow("message id missing", replacing(#""id":"373360335316321408","#, ""), field: "message.id"),
    InvalidRow("message type unknown", replacing(#""type":"text""#, #""type":"sticker""#), field: "message.type"),
    InvalidRow("message text is an array", replacing(#""text":"Bye!""#, #""text":["Bye!"]"#), field: "message.text"),
    InvalidRow(
        "oversized text", replacing(#""text":"Bye!""#, "\"text\":\"" + String(repeating: "x", count: 65_537) + "\""),
        field: "message.text"),
    InvalidRow(
        "mention_type unknown", replacing(#""mention_type":"users""#, #""mention_type":"everyone""#),
        field: "message.mention_type"),
    InvalidRow(
        "mentions contains a number array", replacing(#""mentions":["u2"]"#, #""mentions":[["u2"]]"#),
        field: "message.mentions[0]"),
    InvalidRow(
        "translation not a string", replacing(#""translations":{"fr":"Au revoir !"}"#, #""translations":{"fr":1}"#),
        field: "message.translations.fr"),
    InvalidRow(
        "file message without file",
        replacing(#""type":"text","text":"Bye!""#, #""type":"file","text":"Bye!""#)
            .replacingOccurrences(
                of: #""file":{"name":"hello_world.jpg","mime_type":"image/jpeg","url":"https://cdn.example/f.jpg"},"#,
                with: ""),
        field: "message.file"),
    InvalidRow(
        "call action unknown", replacing(#""action":"initiated""#, #""action":"dialing""#), field: "call.action"),
    InvalidRow("call session missing", replacing(#""session_id":"v1.123.aik2","#, ""), field: "call.session_id"),
    InvalidRow("call type unknown", replacing(#""type":"audio""#, #""type":"hologram""#), field: "call.type"),
    InvalidRow("reaction emoji missing", replacing(#""emoji":"😎","#, ""), field: "reaction.emoji"),
    InvalidRow(
        "group action unknown", replacing(#""action":"left""#, #""action":"sang""#), field: "group_action.action"),
    InvalidRow(
        "em_ignore_notification is a string",
        replacing(#""em_ignore_notification":false"#, #""em_ignore_notification":"yes""#),
        field: "ext.em_ignore_notification"),
    InvalidRow(
        "em_push_mutable_content is a number other than 1 or 0",
        replacing(#""em_push_content":"Custom push display""#, #""em_push_mutable_content":2"#),
        field: "ext.em_apns_ext.em_push_mutable_content"),
    InvalidRow(
        "loc args not strings",
        replacing(#""em_push_content":"Custom push display""#, #""em_push_body_loc_args":[1,2]"#),
        field: "ext.em_apns_ext.em_push_body_loc_args[0]"),
    InvalidRow("not JSON", "hello", field: "(event)"),
    InvalidRow("empty input", "", field: "(event)"),
    InvalidRow("top level array", "[1,2,3]", field: "(event)"),
    InvalidRow("truncated", String(validEvent.prefix(100)), field: "(event)"),
    InvalidRow("trailing garbage", validEvent + "}", field: "(event)"),
    InvalidRow(
        "invalid UTF-8 in a string",
        bytes: Array(replacing(#""text":"Bye!""#, #""text":"Bye@!""#).utf8)
            .map { $0 == UInt8(ascii: "@") ? 0xFF : $0 }, field: "(event)"),
    InvalidRow(
        "overlong UTF-8", bytes: Array(#"{"event_id":""#.utf8) + [0xC0, 0xAF] + Array(#""}"#.utf8), field: "(event)"),
    InvalidRow("lone surrogate escape", #"{"event_id":"\ud800"}"#, field: "(event)"),
    InvalidRow(
        "nesting too deep", String(repeating: "[", count: 200) + String(repeating: "]", count: 200), field: "(event)"),
]

@Suite("Chat event validation")
struct EventValidationTests {
    @Test("the example event of the product definition is valid and keeps every field")
    func specExample() throws {
        let e = try event(validEvent)
        #expect(e.eventID == "e-9f2c" && e.appID == "app1" && e.kind == .message && e.createdAt == 1_732_000_000_000)
        #expect(e.sender == ChatEvent.Sender(id: "u1", name: "Cindy", profileURL: "https://cdn.example/u1.png"))
        #expect(e.conversation == ChatEvent.Conversation(id: "c1", type: .group, name: "Hiking", customType: "support"))
        #expect(e.recipients == ["u2", "u3"])
        let m = try #require(e.message)
        #expect(m.text == "Bye!" && m.file?.name == "hello_world.jpg" && m.mentions == ["u2"] && m.language == "en")
        #expect(m.translation("fr") == "Au revoir !")
        #expect(e.call == ChatEvent.Call(action: .initiated, sessionID: "v1.123.aik2", type: .audio))
        #expect(e.reaction == ChatEvent.Reaction(emoji: "😎", messageID: "58"))
        #expect(e.groupAction == ChatEvent.GroupAction(action: .left, actorName: "Andrew Joseph"))
        #expect(e.ext.apns.pushContent == "Custom push display")
        #expect(e.ext.apns.extern == .string("custom push extension"))
    }

    @Test(arguments: invalidRows)
    func invalidNamesTheField(_ row: InvalidRow) {
        do {
            _ = try ChatEvent.decode(row.bytes)
            Issue.record("accepted an invalid event")
        } catch {
            #expect(error.field == row.field, "\(error)")
            #expect(!error.description.contains("\n"))
            if row.name.contains("UTF-8") { #expect(error.message.contains("invalid UTF-8")) }
        }
    }

    @Test("the normalised JSON decodes to the same event (herald.ingested round trip)")
    func roundTrip() throws {
        let e = try event(validEvent)
        let again = try ChatEvent.decode(e.jsonBytes)
        #expect(again == e)
        #expect(try ChatEvent(validating: JSONValue.parse(e.jsonBytes)) == e)
    }

    @Test("numeric ids are accepted and kept as written; conversation url stands for id")
    func numericIDs() throws {
        let e = try event(
            #"{"event_id":17,"app_id":"a","kind":"message","sender":{"id":6001},"conversation":{"url":"sendbird_group_channel_1","type":"direct"},"message":{"id":373360335316321408,"text":"hi"}}"#
        )
        #expect(e.eventID == "17" && e.sender.id == "6001" && e.message?.id == "373360335316321408")
        #expect(e.conversation.id == "sendbird_group_channel_1")
    }

    @Test("ingest drops open and supergroup channels with channel_type, invalid input with invalid")
    func admission() {
        for type in ["open", "supergroup"] {
            guard
                case .drop(.channelType, _) = Ingest.admit(
                    Array(replacing(#""type":"group""#, "\"type\":\"\(type)\"").utf8))
            else {
                Issue.record("\(type) not dropped"); continue
            }
        }
        for type in ["direct", "group"] {
            guard case .admit = Ingest.admit(Array(replacing(#""type":"group""#, "\"type\":\"\(type)\"").utf8)) else {
                Issue.record("\(type) not admitted"); continue
            }
        }
        guard case .drop(.invalid, let detail) = Ingest.admit(Array("{}".utf8)) else {
            Issue.record("not invalid"); return
        }
        #expect(detail.hasPrefix("event_id"))
        // Nothing to push: empty text, no push content, no loc key.
        guard
            case .drop(.invalid, let d2) = Ingest.admit(
                Array(
                    replacing(#""text":"Bye!""#, #""text":"""#)
                        .replacingOccurrences(of: #""em_push_content":"Custom push display","#, with: "").utf8))
        else {
            Issue.record("empty text admitted"); return
        }
        #expect(d2.hasPrefix("message.text"))
    }

    @Test("fan-out: explicit recipients else members, deduplicated; the sender is a candidate but not a recipient")
    func fanOut() throws {
        let explicit = try event(validEvent)
        #expect(FanOut.candidates(of: explicit, members: ["x"]) == ["u2", "u3"])
        let byMembers = try event(replacing(#""recipients":["u2","u3"],"#, ""))
        #expect(FanOut.candidates(of: byMembers, members: ["u1", "u2", "u2", "u3"]) == ["u1", "u2", "u3"])
        #expect(FanOut.recipients(of: byMembers, members: ["u1", "u2", "u2", "u3"]) == ["u2", "u3"])
    }
}

@Suite("Event JSON Schema")
struct EventSchemaTests {
    @Test("docs/event-schema.json parses and its enums match the decoder")
    func schemaMatchesDecoder() throws {
        let data = try Data(contentsOf: repoRoot.appendingPathComponent("docs/event-schema.json"))
        let schema = try JSONValue.parse(Array(data))
        func enumValues(_ v: JSONValue?) -> [String] {
            guard case .array(let a)? = v?["enum"] else { return [] }
            return a.compactMap { if case .string(let s) = $0 { return s } else { return nil } }
        }
        let props = schema["properties"]
        #expect(enumValues(props?["kind"]) == ChatEvent.Kind.published.map(\.rawValue))
        #expect(enumValues(props?["conversation"]?["properties"]?["type"]) == ConversationType.allCases.map(\.rawValue))
        #expect(enumValues(props?["message"]?["properties"]?["type"]) == MessageType.allCases.map(\.rawValue))
        #expect(enumValues(props?["message"]?["properties"]?["mention_type"]) == MentionType.allCases.map(\.rawValue))
        #expect(enumValues(props?["call"]?["properties"]?["action"]) == ChatEvent.CallAction.allCases.map(\.rawValue))
        #expect(
            Set(enumValues(props?["group_action"]?["properties"]?["action"]))
                == Set(ChatEvent.GroupActionKind.allCases.map(\.rawValue) + ["kicked"]))
    }
}
