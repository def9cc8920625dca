// A small allocation-free JSON checker for payloads (the hot path) and a flat-object reader
// for JWT headers and claims (run once per connection and token).

public enum JSONCheck {
    /// True when `bytes` is one valid JSON object (RFC 8259, UTF-8) with optional surrounding whitespace.
    public static func isObject(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var scanner = Scanner(bytes: bytes)
        scanner.skipWhitespace()
        guard scanner.peek() == UInt8(ascii: "{") else { return false }
        guard scanner.value(depth: 0) else { return false }
        scanner.skipWhitespace()
        return scanner.index == bytes.count
    }

    public static func isObject(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { isObject($0) }
    }

    /// A scalar member of a flat JSON object.
    public enum Scalar: Equatable, Sendable {
        case string(String)
        case number(Double)
        case other
    }

    /// The top-level members of a JSON object whose scalar values are strings or numbers
    /// (nested values are reported as `.other`). Nil when the text is not a valid object.
    public static func topLevelMembers(_ bytes: [UInt8]) -> [String: Scalar]? {
        bytes.withUnsafeBytes { raw -> [String: Scalar]? in
            guard isObject(raw) else { return nil }
            var s = Scanner(bytes: raw)
            return members(&s, raw, nested: nil)?.members
        }
    }

    /// The members of the payload's `aps` object (as `topLevelMembers` reports them); nil when the payload is not a
    /// valid object or has no `aps` object.
    public static func apsMembers(_ raw: UnsafeRawBufferPointer) -> [String: Scalar]? {
        guard isObject(raw) else { return nil }
        var s = Scanner(bytes: raw)
        return members(&s, raw, nested: "aps")?.nested
    }

    /// Reads the object at the scanner (already checked valid); with `nested`, also the members of the object
    /// value of that top-level key.
    static func members(
        _ s: inout Scanner, _ raw: UnsafeRawBufferPointer, nested: String?
    ) -> (members: [String: Scalar], nested: [String: Scalar]?)? {
        var out: [String: Scalar] = [:]
        var inner: [String: Scalar]?
        s.skipWhitespace()
        s.index += 1  // {
        s.skipWhitespace()
        if s.peek() == UInt8(ascii: "}") { s.index += 1; return (out, inner) }
        while true {
            s.skipWhitespace()
            guard let key = s.decodeString() else { return nil }
            s.skipWhitespace()
            s.index += 1  // :
            s.skipWhitespace()
            let start = s.index
            switch s.peek() ?? 0 {
            case UInt8(ascii: "\""):
                guard let v = s.decodeString() else { return nil }
                out[key] = .string(v)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                guard s.number() else { return nil }
                let text = String(decoding: UnsafeRawBufferPointer(rebasing: raw[start..<s.index]), as: UTF8.self)
                out[key] = Double(text).map(Scalar.number) ?? .other
            case UInt8(ascii: "{") where key == nested:
                guard let object = members(&s, raw, nested: nil) else { return nil }
                inner = object.members
                out[key] = .other
            default:
                guard s.value(depth: 1) else { return nil }
                out[key] = .other
            }
            s.skipWhitespace()
            if s.peek() == UInt8(ascii: ",") { s.index += 1; continue }
            s.index += 1  // }
            return (out, inner)
        }
    }

    static let maxDepth = 256

    struct Scanner {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        @inline(__always) func peek() -> UInt8? {
            index < bytes.count ? bytes[index] : nil
        }

        @inline(__always) mutating func skipWhitespace() {
            while index < bytes.count {
                let c = bytes[index]
                if c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 { index += 1 } else { return }
            }
        }

        mutating func value(depth: Int) -> Bool {
            guard depth < JSONCheck.maxDepth, let c = peek() else { return false }
            switch c {
            case UInt8(ascii: "{"): return object(depth: depth)
            case UInt8(ascii: "["): return array(depth: depth)
            case UInt8(ascii: "\""): return string()
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number()
            default: return false
            }
        }

        mutating func object(depth: Int) -> Bool {
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "}") { index += 1; return true }
            while true {
                skipWhitespace()
                guard peek() == UInt8(ascii: "\""), string() else { return false }
                skipWhitespace()
                guard peek() == UInt8(ascii: ":") else { return false }
                index += 1
                skipWhitespace()
                guard value(depth: depth + 1) else { return false }
                skipWhitespace()
                switch peek() {
                case UInt8(ascii: ","): index += 1
                case UInt8(ascii: "}"): index += 1; return true
                default: return false
                }
            }
        }

        mutating func array(depth: Int) -> Bool {
            index += 1
            skipWhitespace()
            if peek() == UInt8(ascii: "]") { index += 1; return true }
            while true {
                skipWhitespace()
                guard value(depth: depth + 1) else { return false }
                skipWhitespace()
                switch peek() {
                case UInt8(ascii: ","): index += 1
                case UInt8(ascii: "]"): index += 1; return true
                default: return false
                }
            }
        }

        mutating func literal(_ word: StaticString) -> Bool {
            let n = word.utf8CodeUnitCount
            guard index + n <= bytes.count else { return false }
            let w = word.utf8Start
            for i in 0..<n where bytes[index + i] != w[i] { return false }
            index += n
            return true
        }

        @inline(__always) mutating func digits() -> Bool {
            let start = index
            while index < bytes.count, bytes[index] &- 0x30 < 10 { index += 1 }
            return index > start
        }

        mutating func number() -> Bool {
            if peek() == UInt8(ascii: "-") { index += 1 }
            guard let c = peek() else { return false }
            if c == UInt8(ascii: "0") {
                index += 1
            } else {
                guard digits() else { return false }
            }
            if peek() == UInt8(ascii: ".") {
                index += 1
                guard digits() else { return false }
            }
            if let e = peek(), e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
                index += 1
                if let s = peek(), s == UInt8(ascii: "+") || s == UInt8(ascii: "-") { index += 1 }
                guard digits() else { return false }
            }
            return true
        }

        /// Validates a string (escapes and UTF-8) starting at the opening quote.
        mutating func string() -> Bool {
            index += 1
            let count = bytes.count
            while index < count {
                // Fast path: plain ASCII text.
                var i = index
                while i < count {
                    let c = bytes[i]
                    if c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") || c < 0x20 || c >= 0x80 { break }
                    i += 1
                }
                index = i
                guard index < count else { return false }
                let c = bytes[index]
                if c == UInt8(ascii: "\"") { index += 1; return true }
                if c == UInt8(ascii: "\\") {
                    index += 1
                    guard let e = peek() else { return false }
                    switch e {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"),
                        UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                        index += 1
                    case UInt8(ascii: "u"):
                        guard index + 4 < bytes.count else { return false }
                        for i in 1...4 where !isHex(bytes[index + i]) { return false }
                        index += 5
                    default:
                        return false
                    }
                } else if c < 0x20 {
                    return false
                } else if c < 0x80 {
                    index += 1
                } else {
                    guard utf8Sequence() else { return false }
                }
            }
            return false
        }

        /// One multi-byte UTF-8 sequence (no overlongs, no surrogates, at most U+10FFFF).
        mutating func utf8Sequence() -> Bool {
            let c = bytes[index]
            let n: Int
            var lo: UInt8 = 0x80, hi: UInt8 = 0xBF
            switch c {
            case 0xC2...0xDF: n = 1
            case 0xE0: n = 2; lo = 0xA0
            case 0xE1...0xEC, 0xEE...0xEF: n = 2
            case 0xED: n = 2; hi = 0x9F
            case 0xF0: n = 3; lo = 0x90
            case 0xF1...0xF3: n = 3
            case 0xF4: n = 3; hi = 0x8F
            default: return false
            }
            guard index + n < bytes.count else { return false }
            let b1 = bytes[index + 1]
            guard b1 >= lo && b1 <= hi else { return false }
            if n > 1 { for i in 2...n where bytes[index + i] & 0xC0 != 0x80 { return false } }
            index += n + 1
            return true
        }

        /// Decodes a string at the opening quote (for the flat reader; not the hot path).
        mutating func decodeString() -> String? {
            guard peek() == UInt8(ascii: "\"") else { return nil }
            var out: [UInt8] = []
            index += 1
            while index < bytes.count {
                let c = bytes[index]
                if c == UInt8(ascii: "\"") { index += 1; return String(decoding: out, as: UTF8.self) }
                if c == UInt8(ascii: "\\") {
                    index += 1
                    guard let e = peek() else { return nil }
                    index += 1
                    switch e {
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "u"):
                        guard index + 4 <= bytes.count else { return nil }
                        var v: UInt32 = 0
                        for i in 0..<4 { v = v << 4 | UInt32(hexValue(bytes[index + i])) }
                        index += 4
                        let scalar = Unicode.Scalar(v) ?? "\u{FFFD}"
                        out.append(contentsOf: Array(String(Character(scalar)).utf8))
                    default: out.append(e)
                    }
                } else {
                    out.append(c)
                    index += 1
                }
            }
            return nil
        }
    }

    @inline(__always) static func isHex(_ c: UInt8) -> Bool {
        (c &- 0x30 < 10) || ((c | 0x20) &- 0x61 < 6)
    }

    @inline(__always) static func hexValue(_ c: UInt8) -> UInt8 {
        c &- 0x30 < 10 ? c &- 0x30 : ((c | 0x20) &- 0x61) &+ 10
    }
}

extension JSONCheck.Scanner {
    func isHex(_ c: UInt8) -> Bool { JSONCheck.isHex(c) }
    func hexValue(_ c: UInt8) -> UInt8 { JSONCheck.hexValue(c) }
}
