import Foundation
import HeraldCore
import Testing

/// The helpers every module writes through: decimal digits, FNV-1a, epoch milliseconds.
@Suite("Shared helpers: decimal digits, FNV-1a, epoch milliseconds")
struct SharedHelperTests {
    static let decimalRows: [(Int64, String)] = [
        (0, "0"), (7, "7"), (-7, "-7"), (10, "10"), (-10, "-10"), (99, "99"), (100, "100"), (-1, "-1"),
        (1_234_567_890, "1234567890"), (-987_654_321, "-987654321"),
        (Int64.max, "9223372036854775807"), (Int64.min, "-9223372036854775808"),
        (Int64.max - 1, "9223372036854775806"), (Int64.min + 1, "-9223372036854775807"),
    ]

    @Test("appended digits match String(value), at 0, the extremes and negatives", arguments: decimalRows)
    func appendsDecimal(value: Int64, text: String) {
        var out: [UInt8] = [UInt8(ascii: "x")]
        DecimalASCII.append(value, to: &out)
        #expect(String(decoding: out, as: UTF8.self) == "x" + text)
        #expect(DecimalASCII.length(of: value) == text.utf8.count)
        #expect(text == String(value))
    }

    @Test(
        "write puts the digits just before the end it is given and leaves the bytes before them", arguments: decimalRows
    )
    func writesBackwards(value: Int64, text: String) {
        var buffer = [UInt8](repeating: UInt8(ascii: "."), count: DecimalASCII.maxLength + 2)
        let count = buffer.withUnsafeMutableBufferPointer { b in
            DecimalASCII.write(value, endingAt: b.baseAddress! + DecimalASCII.maxLength + 1)
        }
        #expect(count == text.utf8.count)
        let expected = String(repeating: ".", count: DecimalASCII.maxLength + 1 - count) + text + "."
        #expect(String(decoding: buffer, as: UTF8.self) == expected)
    }

    @Test("every length from one digit to nineteen, both signs")
    func everyLength() {
        var low: Int64 = 1
        for digits in 1...19 {
            let high = digits < 19 ? low * 10 - 1 : Int64.max
            for value in [low, high, -low, -high] {
                var out: [UInt8] = []
                DecimalASCII.append(value, to: &out)
                #expect(String(decoding: out, as: UTF8.self) == String(value))
                #expect(DecimalASCII.length(of: value) == (value < 0 ? digits + 1 : digits))
            }
            if digits < 19 { low *= 10 }
        }
    }

    @Test("JSONWriter.int writes what the shared writer writes")
    func jsonIntegers() {
        for (value, text) in Self.decimalRows {
            var w = JSONWriter(capacity: 8)
            w.int(value)
            #expect(w.string == text)
        }
    }

    /// Stored as shard numbers, delivery fields and translation fingerprints: these never change.
    @Test("FNV-1a 64 keeps its published values")
    func fnvPinned() {
        #expect(FNV1a.hash("") == 0xcbf2_9ce4_8422_2325)
        #expect(FNV1a.hash("a") == 0xaf63_dc4c_8601_ec8c)
        #expect(FNV1a.hash("foobar") == 0x8594_4171_f739_67e8)
        #expect(FNV1a.hash(Array("foobar".utf8)) == 0x8594_4171_f739_67e8)
        #expect(FNV1a.hash("bar", continuing: FNV1a.hash("foo")) == FNV1a.hash("foobar"))
        #expect(FNV1a.hash("foo", then: "bar") == FNV1a.hash("foo\u{0}bar"))
        #expect(FNV1a.hash("foo", then: "bar") != FNV1a.hash("foobar"))
        // A bridged (non-native) string hashes its UTF-8 bytes all the same.
        let bridged = NSString(string: "événement-42") as String
        #expect(FNV1a.hash(bridged) == FNV1a.hash(Array("événement-42".utf8)))
    }

    @Test("epoch milliseconds round down, before 1970 too")
    func milliseconds() {
        #expect(Date(timeIntervalSince1970: 0).millisecondsSince1970 == 0)
        #expect(Date(timeIntervalSince1970: 1_700_000_000.1239).millisecondsSince1970 == 1_700_000_000_123)
        #expect(Date(timeIntervalSince1970: -0.0005).millisecondsSince1970 == -1)
        #expect(Date(timeIntervalSince1970: -1.5).millisecondsSince1970 == -1500)
    }
}
