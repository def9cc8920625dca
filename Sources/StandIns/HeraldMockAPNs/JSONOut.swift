/// JSON output helpers for the record file (bytes in, bytes out).
enum JSONOut {
    static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    /// A JSON string of the bytes, or null. The bytes are read as UTF-8: every character is written as itself
    /// (non-ASCII ones as their UTF-8 bytes, which JSON allows), except `"` and `\`, which get a backslash, and
    /// control characters (below U+0020, and DEL), which become `\u00XX`. A byte that is not part of valid
    /// UTF-8 becomes U+FFFD (`\ufffd`), so the record file is always valid UTF-8 JSON.
    static func appendString(_ out: inout [UInt8], _ value: UnsafeRawBufferPointer?) {
        guard let value else { out.append(contentsOf: "null".utf8); return }
        out.append(UInt8(ascii: "\""))
        var bytes = value.makeIterator()
        var decoder = UTF8()
        decoding: while true {
            switch decoder.decode(&bytes) {
            case .scalarValue(let scalar):
                switch scalar.value {
                case 0x22, 0x5C:
                    out.append(UInt8(ascii: "\\"))
                    out.append(UInt8(scalar.value))
                case 0..<0x20, 0x7F:
                    out.append(contentsOf: "\\u00".utf8)
                    out.append(hex[Int(scalar.value >> 4)])
                    out.append(hex[Int(scalar.value & 0xF)])
                default:
                    UTF8.encode(scalar, into: { out.append($0) })
                }
            case .error:
                out.append(contentsOf: "\\ufffd".utf8)
            case .emptyInput:
                break decoding
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Digits as a JSON number; anything else as a string; absent as null.
    static func appendNumberOrString(_ out: inout [UInt8], _ value: UnsafeRawBufferPointer?) {
        if let value, !value.isEmpty, value.count <= 18, value.allSatisfy({ $0 &- 0x30 < 10 }),
            !(value.count > 1 && value[0] == UInt8(ascii: "0"))
        {
            out.append(contentsOf: value)
        } else {
            appendString(&out, value)
        }
    }

    /// A valid JSON text on one line: CR/LF (only possible as whitespace) become spaces.
    static func appendCompactJSON(_ out: inout [UInt8], _ json: UnsafeRawBufferPointer) {
        func isSpace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 }
        var lo = 0, hi = json.count
        while lo < hi, isSpace(json[lo]) { lo += 1 }
        while hi > lo, isSpace(json[hi - 1]) { hi -= 1 }
        for c in json[lo..<hi] {
            out.append(c == 0x0A || c == 0x0D ? 0x20 : c)
        }
    }
}
