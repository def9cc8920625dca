import Foundation
import HeraldCore
import Testing

@Suite("JSON values")
struct JSONValueTests {
    @Test("numbers compare exactly: 64-bit integers that Double cannot tell apart differ")
    func exactNumbers() throws {
        #expect(JSONValue.number("9007199254740993") != .number("9007199254740992"))
        #expect(JSONValue.number("9223372036854775807") != .number("9223372036854775806"))
        #expect(JSONValue.number("1") == .number("1.0"))
        #expect(JSONValue.number("1") == .number("10e-1"))
        #expect(JSONValue.number("-0") == .number("0"))
        #expect(JSONValue.number("120") == .number("1.2e2"))
        #expect(JSONValue.number("0.1") != .number("0.10000000000000001"))
        #expect(Set([JSONValue.number("2"), .number("2.00"), .number("3")]).count == 2)
        let parsed = try JSONValue.parse(#"{"offset":9223372036854775807}"#)
        #expect(parsed["offset"]?.int64Value == Int64.max)
        #expect(parsed.serialized == #"{"offset":9223372036854775807}"#)
    }

    @Test("integer accessors: integral values in range only")
    func integers() {
        #expect(JSONValue.number("3600").int64Value == 3600)
        #expect(JSONValue.number("3.6e3").int64Value == 3600)
        #expect(JSONValue.number("3600.5").int64Value == nil)
        #expect(JSONValue.number("-9223372036854775808").int64Value == Int64.min)
        #expect(JSONValue.number("9223372036854775808").int64Value == nil)
        #expect(JSONValue.string("1").int64Value == nil)
    }

    @Test("objects keep document order, duplicates included; the subscript reads the first, and so does writing")
    func documentOrder() throws {
        let v = try JSONValue.parse(#"{"b":1,"a":2,"b":3}"#)
        guard case .object(let pairs) = v else { Issue.record("not an object"); return }
        #expect(pairs.map(\.0) == ["b", "a", "b"])
        #expect(v["b"] == .number("1"))
        // What Herald writes never holds a name twice (docs/behaviour.md §7): the first value is written.
        #expect(v.serialized == #"{"b":1,"a":2}"#)
    }

    @Test("strings: plain ones as they are, escapes anywhere in them, and invalid ones refused")
    func strings() throws {
        let read: [(String, String)] = [
            (#""""#, ""), (#""plain""#, "plain"), (#""é 日本 🙂""#, "é 日本 🙂"),
            (#""\n""#, "\n"), (#""a\"b""#, "a\"b"), (#""\\lead""#, "\\lead"), (#""trail\t""#, "trail\t"),
            (#""x\u00e9y\ud83d\ude42z""#, "xéy🙂z"), (#""\/\b\f\r""#, "/\u{8}\u{C}\r"),
            (#""\u0041\u0042""#, "AB"),
            (
                #""long \"quoted\" text beyond any small string""#,
                "long \"quoted\" text beyond any small string"
            ),
        ]
        for (json, text) in read {
            #expect(try JSONValue.parse(json) == .string(text), "\(json)")
            #expect(try JSONValue.parse("[\(json),\(json)]") == .array([.string(text), .string(text)]), "\(json)")
        }
        for bad in [#""open"#, #""bad \x escape""#, "\"ctl\u{1}\"", #""\ud83d alone""#, #""\"#] {
            #expect(throws: JSONParseError.self, "\(bad)") { try JSONValue.parse(bad) }
        }
        #expect(throws: JSONParseError.self) { try JSONValue.parse([0x22, 0xC3, 0x28, 0x22]) }  // invalid UTF-8
    }

    @Test("one escaper: quotes, backslash and control characters; line-safe also DEL, U+2028, U+2029")
    func escaping() {
        #expect(JSONWriter.quoted("a\"b\\c\nd\u{1}é") == #""a\"b\\c\nd\u0001é""#)
        #expect(JSONWriter.quoted("x\u{2028}y\u{7F}") == "\"x\u{2028}y\u{7F}\"")
        #expect(JSONWriter.quoted("x\u{2028}y\u{2029}z\u{7F}", lineSafe: true) == #""x\u2028y\u2029z\u007f""#)
        #expect(JSONWriter.quoted("日本語 🥾", lineSafe: true) == "\"日本語 🥾\"")
        let text = "mixed \"é\" \u{2028}\t"
        #expect((try? JSONValue.parse(JSONWriter.quoted(text, lineSafe: true))) == .string(text))
    }

    @Test("the escaper's eight-bytes-at-a-time scan writes what escaping each character on its own writes")
    func escapingMatchesCharacterByCharacter() {
        // Every character class the escaper treats apart, at every offset within an eight-byte word.
        let specials: [String] = [
            "\"", "\\", "\n", "\r", "\t", "\u{0}", "\u{1F}", "\u{7F}", "\u{2028}", "\u{2029}", "\u{2027}", "é", "🥾",
            " ",
            "~",
        ]
        func reference(_ text: String, lineSafe: Bool) -> String {
            var out = "\""
            for scalar in text.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
                case _ where lineSafe && scalar.value == 0x7F: out += "\\u007f"
                case _ where lineSafe && scalar.value == 0x2028: out += "\\u2028"
                case _ where lineSafe && scalar.value == 0x2029: out += "\\u2029"
                default: out.unicodeScalars.append(scalar)
                }
            }
            return out + "\""
        }
        var generator = SystemRandomNumberGenerator()
        for lineSafe in [false, true] {
            for special in specials {
                for offset in 0..<17 {
                    let text = String(repeating: "a", count: offset) + special + String(repeating: "b", count: 9)
                    #expect(JSONWriter.quoted(text, lineSafe: lineSafe) == reference(text, lineSafe: lineSafe))
                }
            }
            for _ in 0..<300 {
                let count = Int.random(in: 0..<40, using: &generator)
                let text = (0..<count).map { _ in
                    Bool.random(using: &generator) ? "x" : specials.randomElement(using: &generator)!
                }.joined()
                #expect(JSONWriter.quoted(text, lineSafe: lineSafe) == reference(text, lineSafe: lineSafe), "\(text)")
            }
        }
    }

    @Test("a pruned parse keeps the named entries of one member and accepts and refuses exactly what a parse does")
    func prunedParse() throws {
        let documents = [
            #"{"trigger":"all","conversations":{"a":{"trigger":"off"},"b":{"muted":true,"x":[1,2.5e3,null,{"y":"\u00e9"}]},"c":{}},"badge":false}"#,
            #"{"conversations":{}}"#,
            #"{"conversations":[1,2]}"#,
            #"{"conversations":"none","other":{"a":1}}"#,
            #"{"nested":{"conversations":{"a":1,"b":2}},"conversations":{"b":{"deep":[[[]]]}}}"#,
            #" { "conversations" : { "a" : 1 , "b" : 2 } } "#,
            #"[{"conversations":{"a":1}}]"#,
        ]
        for text in documents {
            let whole = try JSONValue.parse(text)
            let pruned = try JSONValue.parse(Array(text.utf8), pruning: "conversations", keeping: ["a", "zz"])
            // The same document with the member's object filtered to the kept keys.
            var expected = whole
            if case .object(let pairs) = whole {
                expected = .object(
                    pairs.map { key, value in
                        guard key == "conversations", case .object(let inner) = value else { return (key, value) }
                        return (key, .object(inner.filter { ["a", "zz"].contains($0.0) }))
                    })
            }
            #expect(pruned == expected, "\(text)")
        }
        // Broken text inside a skipped entry is refused, as a whole parse refuses it.
        let broken = [
            #"{"conversations":{"b":{"trigger":tru}}}"#,
            #"{"conversations":{"b":{"trigger":"off"}"#,
            #"{"conversations":{"b":"\x"}}"#,
            #"{"conversations":{"b":[1,]}}"#,
            #"{"conversations":{"b":01}}"#,
            #"{"conversations":{"b":1}} x"#,
            "{\"conversations\":{\"b\":" + String(repeating: "[", count: 70) + String(repeating: "]", count: 70) + "}}",
        ]
        for text in broken {
            #expect(throws: JSONParseError.self, "\(text)") { try JSONValue.parse(text) }
            #expect(throws: JSONParseError.self, "\(text)") {
                try JSONValue.parse(Array(text.utf8), pruning: "conversations", keeping: ["a"])
            }
        }
    }

    @Test("stored preferences read for some conversations: those conversations' settings and everything else")
    func preferencesForConversations() throws {
        var stored = Preferences()
        stored.trigger = .mentionOnly
        stored.displayName = "Ann"
        stored.languages = ["de"]
        for k in 0..<40 { stored.conversations["c\(k)"] = ConversationPreference(trigger: .off, muted: k % 2 == 0) }
        let bytes = stored.jsonBytes()
        var expected = stored
        expected.conversations = ["c3": stored.conversations["c3"]!, "c8": stored.conversations["c8"]!]
        #expect(try Preferences.fromJSON(bytes, conversations: ["c3", "c8", "c99"]) == expected)
        expected.conversations = [:]
        #expect(try Preferences.fromJSON(bytes, conversations: []) == expected)
        #expect(try Preferences.fromJSON(bytes) == stored)
        #expect(throws: StageRecordError.self) {
            try Preferences.fromJSON(Array("{\"trigger\":".utf8), conversations: [])
        }
    }
}
