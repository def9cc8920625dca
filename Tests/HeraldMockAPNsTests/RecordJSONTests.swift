import Foundation
import Testing

@testable import HeraldMockAPNs

/// What the stand-in writes into its record file for one header value.
private func recorded(_ bytes: [UInt8]?) -> [UInt8] {
    var out: [UInt8] = []
    if let bytes {
        bytes.withUnsafeBytes { JSONOut.appendString(&out, $0) }
    } else {
        JSONOut.appendString(&out, nil)
    }
    return out
}

/// Parses one JSON string the way a reader of the record file would.
private func parsed(_ json: [UInt8]) throws -> String? {
    try JSONSerialization.jsonObject(with: Data(json), options: [.fragmentsAllowed]) as? String
}

@Suite("Record file: JSON strings")
struct RecordJSONTests {
    @Test(
        "non-ASCII text is written as UTF-8 and reads back unchanged",
        arguments: [
            "café", "Grüße aus Köln", "日本語のテキスト", "Привет", "emoji 😎 and 👩‍👩‍👧", "€ 10", "ascii only",
        ])
    func unicodeRoundTrips(_ text: String) throws {
        let json = recorded(Array(text.utf8))
        #expect(try parsed(json) == text)
        // Written as itself, not as escaped bytes (`\u00c3\u00a9` for é would read back as "Ã©").
        #expect(json == Array("\"\(text)\"".utf8))
    }

    @Test("quotes, backslashes and control characters are escaped; the result reads back unchanged")
    func escapes() throws {
        let text = "a\"b\\c\nd\te\u{1}f\u{7F}g"
        let json = recorded(Array(text.utf8))
        #expect(String(decoding: json, as: UTF8.self) == #""a\"b\\c\u000ad\u0009e\u0001f\u007fg""#)
        #expect(try parsed(json) == text)
    }

    @Test("bytes that are not UTF-8 become U+FFFD and the line stays valid JSON")
    func invalidUTF8() throws {
        // A lone continuation byte, a truncated two-byte sequence, and an overlong encoding of "/".
        let json = recorded([0x61, 0x80, 0x62, 0xC3, 0x63, 0xC0, 0xAF])
        #expect(String(validating: json, as: UTF8.self) != nil)
        let value = try #require(try parsed(json))
        #expect(value.hasPrefix("a\u{FFFD}b\u{FFFD}c"))
        #expect(!value.contains("/"))
    }

    @Test("an absent value is null")
    func absent() {
        #expect(recorded(nil) == Array("null".utf8))
    }
}
