// Herald's one JSON implementation: a small JSON value, a strict parser that never traps on any bytes, and an
// append-only writer used on the hot path (payloads and records are written byte by byte into a reserved buffer).
// Every record, payload and answer Herald reads or writes as JSON goes through here; `herald-bench json` measures
// it against Foundation's JSONDecoder/JSONEncoder (docs/architecture.md, "JSON").

/// A parsed JSON value. Objects keep their keys in document order (`JSONValue.parse` and the writer both keep it;
/// duplicate keys are kept too, and the subscript reads the first).
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    /// The number exactly as written, so 64-bit integers (and long decimals) survive unchanged. Two numbers are
    /// equal when they denote the same decimal value (`1`, `1.0` and `10e-1` are equal), compared exactly, never
    /// through `Double`: 9007199254740993 and 9007199254740992 differ.
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([(String, JSONValue)])

    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case let (.bool(x), .bool(y)): return x == y
        case let (.number(x), .number(y)):
            if x == y { return true }
            guard let l = DecimalNumber(x), let r = DecimalNumber(y) else { return false }
            return l == r
        case let (.string(x), .string(y)): return x == y
        case let (.array(x), .array(y)): return x == y
        case let (.object(x), .object(y)):
            guard x.count == y.count else { return false }
            for (l, r) in zip(x, y) where l.0 != r.0 || l.1 != r.1 { return false }
            return true
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(0)
        case .bool(let b): hasher.combine(b)
        case .number(let n):
            if let d = DecimalNumber(n) { hasher.combine(d) } else { hasher.combine(n) }
        case .string(let s): hasher.combine(s)
        case .array(let a): hasher.combine(a)
        case .object(let o):
            hasher.combine(o.count)
            for (k, v) in o { hasher.combine(k); hasher.combine(v) }
        }
    }

    /// The value for `key` of an object (first occurrence), else nil.
    public subscript(key: String) -> JSONValue? {
        guard case .object(let pairs) = self else { return nil }
        for (k, v) in pairs where k == key { return v }
        return nil
    }

    /// The string, if this is a string.
    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The number as a 64-bit integer, if this is a number with an integral value in range (`3600`, `3600.0`).
    public var int64Value: Int64? {
        guard case .number(let n) = self else { return nil }
        if let i = Int64(n) { return i }
        return DecimalNumber(n)?.int64
    }

    /// The Boolean, if this is `true` or `false`.
    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    /// A short name of the JSON type, for error messages.
    public var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "boolean"
        case .number: return "number"
        case .string: return "string"
        case .array: return "array"
        case .object: return "object"
        }
    }

    /// Serialises the value (compact, keys in stored order).
    public var serialized: String {
        var w = JSONWriter()
        w.value(self)
        return w.string
    }

    /// Parses UTF-8 JSON text.
    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(Array(bytes))
        return try parser.parseDocument()
    }

    public static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parse(Array(text.utf8))
    }

    /// Parses UTF-8 JSON text whose top-level object's member `member`, when it is an object, keeps only the
    /// members named in `keeping`; the others are checked as strictly as by `parse` (the same text is accepted or
    /// refused) but never built. For a stored document of which a reader needs a few entries of a large map.
    public static func parse(
        _ bytes: some Collection<UInt8>, pruning member: String, keeping: [String]
    ) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(Array(bytes))
        parser.pruned = member
        parser.keeping = keeping
        return try parser.parseDocument()
    }
}

/// The exact decimal value of a JSON number: sign, significant digits without leading or trailing zeros, and a
/// power of ten (value = ±digits × 10^exponent). Zero has no digits and no sign.
struct DecimalNumber: Hashable {
    var negative: Bool
    var digits: [UInt8]
    var exponent: Int

    /// Reads a number in JSON's grammar (`-?int(.frac)?([eE][+-]?exp)?`); nil for anything else.
    init?(_ text: String) {
        var bytes = Array(text.utf8)[...]
        negative = bytes.first == UInt8(ascii: "-")
        if negative { bytes = bytes.dropFirst() }
        func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }
        let integral = bytes.prefix(while: isDigit)
        guard !integral.isEmpty else { return nil }
        bytes = bytes.dropFirst(integral.count)
        var fraction: ArraySlice<UInt8> = []
        if bytes.first == UInt8(ascii: ".") {
            fraction = bytes.dropFirst().prefix(while: isDigit)
            guard !fraction.isEmpty else { return nil }
            bytes = bytes.dropFirst(1 + fraction.count)
        }
        var exponent = 0
        if let e = bytes.first, e == UInt8(ascii: "e") || e == UInt8(ascii: "E") {
            bytes = bytes.dropFirst()
            var negativeExponent = false
            if let sign = bytes.first, sign == UInt8(ascii: "+") || sign == UInt8(ascii: "-") {
                negativeExponent = sign == UInt8(ascii: "-")
                bytes = bytes.dropFirst()
            }
            let written = bytes.prefix(while: isDigit)
            guard !written.isEmpty else { return nil }
            bytes = bytes.dropFirst(written.count)
            for d in written {
                // Clamped: an exponent beyond a billion only has to compare unequal to ordinary numbers.
                exponent = min(exponent * 10 + Int(d - UInt8(ascii: "0")), 1_000_000_000)
            }
            if negativeExponent { exponent = -exponent }
        }
        guard bytes.isEmpty else { return nil }
        var all = Array(integral) + Array(fraction)
        exponent -= fraction.count
        let leading = all.prefix(while: { $0 == UInt8(ascii: "0") }).count
        all.removeFirst(leading)
        while all.last == UInt8(ascii: "0") {
            all.removeLast()
            exponent += 1
        }
        if all.isEmpty {
            negative = false
            exponent = 0
        }
        digits = all
        self.exponent = exponent
    }

    /// The value as an `Int64`, when it is an integer in range.
    var int64: Int64? {
        guard exponent >= 0, digits.count + exponent <= 19 else { return digits.isEmpty ? 0 : nil }
        var magnitude: UInt64 = 0
        for d in digits + Array(repeating: UInt8(ascii: "0"), count: exponent) {
            let (m, o1) = magnitude.multipliedReportingOverflow(by: 10)
            let (n, o2) = m.addingReportingOverflow(UInt64(d - UInt8(ascii: "0")))
            if o1 || o2 { return nil }
            magnitude = n
        }
        if negative { return magnitude <= UInt64(Int64.max) + 1 ? Int64(truncatingIfNeeded: 0 &- magnitude) : nil }
        return magnitude <= UInt64(Int64.max) ? Int64(magnitude) : nil
    }
}

/// Why bytes are not JSON: a message and the byte offset.
public struct JSONParseError: Error, Sendable, Hashable, CustomStringConvertible {
    public var message: String
    public var offset: Int
    public var description: String { "\(message) at byte \(offset)" }
}

/// Recursive-descent parser over bytes. Rejects invalid UTF-8, lone surrogates,
/// control characters in strings, trailing garbage, and nesting beyond `maxDepth`.
struct JSONParser {
    static let maxDepth = 64
    let bytes: [UInt8]
    var i = 0
    /// Where the input ends: `bytes.count`, or the end of the range being read.
    let limit: Int
    /// The top-level member whose object keeps only the keys in `keeping` (`JSONValue.parse(_:pruning:keeping:)`).
    var pruned: String?
    var keeping: [String] = []

    init(_ bytes: [UInt8]) {
        self.bytes = bytes
        self.limit = bytes.count
    }

    /// A parser of `range` of `bytes` only (one line of a stored field): it starts at the range's start and sees
    /// the input end at its end.
    init(_ bytes: [UInt8], range: Range<Int>) {
        self.bytes = bytes
        self.i = range.lowerBound
        self.limit = range.upperBound
    }

    mutating func parseDocument() throws(JSONParseError) -> JSONValue {
        // Skip a UTF-8 byte order mark.
        if limit - i >= 3, bytes[i] == 0xEF, bytes[i + 1] == 0xBB, bytes[i + 2] == 0xBF { i += 3 }
        let value = try parseValue(depth: 0)
        skipSpace()
        if i != limit { throw fail("unexpected data after the JSON value") }
        return value
    }

    func fail(_ message: String) -> JSONParseError { JSONParseError(message: message, offset: i) }

    mutating func skipSpace() {
        while i < limit {
            switch bytes[i] {
            case 0x20, 0x09, 0x0A, 0x0D: i += 1
            default: return
            }
        }
    }

    mutating func parseValue(depth: Int) throws(JSONParseError) -> JSONValue {
        guard depth <= JSONParser.maxDepth else { throw fail("nesting deeper than \(JSONParser.maxDepth)") }
        skipSpace()
        guard i < limit else { throw fail("unexpected end of input") }
        switch bytes[i] {
        case UInt8(ascii: "{"): return try parseObject(depth: depth)
        case UInt8(ascii: "["): return try parseArray(depth: depth)
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default: throw fail("unexpected character")
        }
    }

    /// A string value at `i`, or nil (and `i` unchanged) when the value there is not a valid string.
    mutating func flatString() -> String? {
        guard i < limit, bytes[i] == UInt8(ascii: "\"") else { return nil }
        let start = i
        guard let s = try? parseString() else {
            i = start
            return nil
        }
        return s
    }

    /// The bytes of a string at `i` written without escapes or control characters (a key as Herald writes it),
    /// with `i` moved past its closing quote; nil (and `i` unchanged) for anything else.
    mutating func plainKey() -> Range<Int>? {
        guard i < limit, bytes[i] == UInt8(ascii: "\"") else { return nil }
        var end = i + 1
        while end < limit {
            let byte = bytes[end]
            if byte == UInt8(ascii: "\"") { break }
            if byte == UInt8(ascii: "\\") || byte < 0x20 { return nil }
            end += 1
        }
        guard end < limit else { return nil }
        defer { i = end + 1 }
        return (i + 1)..<end
    }

    // Steps of the flat readers (a stored device, stored preferences): each skips white space first, and fails
    // with nil or false, leaving the caller to read the bytes through the JSON reader instead.

    /// Whether `byte` comes next; if so, `i` moves past it.
    mutating func take(_ byte: Unicode.Scalar) -> Bool {
        skipSpace()
        guard i < limit, bytes[i] == UInt8(ascii: byte) else { return false }
        i += 1
        return true
    }

    /// An object member's key written without escapes, and its colon.
    mutating func memberKey() -> Range<Int>? {
        skipSpace()
        guard let key = plainKey(), take(":") else { return nil }
        return key
    }

    /// Whether the next member's key is `word` (with its colon).
    mutating func key(_ word: StaticString) -> Bool {
        guard let key = memberKey() else { return false }
        return isKey(key, word)
    }

    mutating func plainString() -> String? {
        skipSpace()
        return flatString()
    }

    mutating func plainInteger() -> Int64? {
        skipSpace()
        return flatInteger()
    }

    mutating func plainBool() -> Bool? {
        skipSpace()
        if (try? literal("true")) != nil { return true }
        if (try? literal("false")) != nil { return false }
        return nil
    }

    /// Whether the bytes in `range` (from `plainKey`) are `word`'s.
    func isKey(_ range: Range<Int>, _ word: StaticString) -> Bool {
        guard range.count == word.utf8CodeUnitCount else { return false }
        let p = word.utf8Start
        for k in 0..<range.count where bytes[range.lowerBound + k] != p[k] { return false }
        return true
    }

    /// A plain integer at `i` (`-`? digits, no fraction or exponent) that fits in 64 bits, or nil.
    mutating func flatInteger() -> Int64? {
        // Up to 18 digits, no leading zero, and then neither a fraction nor an exponent: read as it stands.
        var end = i
        let negative = end < limit && bytes[end] == UInt8(ascii: "-")
        if negative { end += 1 }
        var value: Int64 = 0
        let digitsStart = end
        while end < limit, end - digitsStart < 18, bytes[end] &- UInt8(ascii: "0") < 10 {
            value = value * 10 + Int64(bytes[end] &- UInt8(ascii: "0"))
            end += 1
        }
        let digits = end - digitsStart
        let next = end < limit ? bytes[end] : 0
        if digits > 0, digits < 18, bytes[digitsStart] != UInt8(ascii: "0") || digits == 1,
            next &- UInt8(ascii: "0") >= 10, next != UInt8(ascii: "."), next != UInt8(ascii: "e"),
            next != UInt8(ascii: "E")
        {
            i = end
            return negative ? -value : value
        }
        let start = i
        guard i < limit, let text = try? parseNumber(), let n = Int64(text) else {
            i = start
            return nil
        }
        return n
    }

    mutating func literal(_ word: StaticString) throws(JSONParseError) {
        let n = word.utf8CodeUnitCount
        guard i + n <= limit else { throw fail("unexpected end of input") }
        let p = word.utf8Start
        for k in 0..<n where bytes[i + k] != p[k] { throw fail("invalid literal") }
        i += n
    }

    /// Which members of an object are built: all, those whose key is in `keeping`, or none (the others are
    /// checked and skipped).
    enum Members { case all, kept, none }

    mutating func parseObject(depth: Int, keep: Members = .all) throws(JSONParseError) -> JSONValue {
        i += 1
        var pairs: [(String, JSONValue)] = []
        skipSpace()
        if i < limit, bytes[i] == UInt8(ascii: "}") { i += 1; return .object(pairs) }
        while true {
            skipSpace()
            guard i < limit, bytes[i] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
            let key = try parseString()
            skipSpace()
            guard i < limit, bytes[i] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            i += 1
            if keep == .none || (keep == .kept && !keeping.contains(key)) {
                try skipValue(depth: depth + 1)
            } else if depth == 0, let pruned, key == pruned, nextIsObject() {
                pairs.append((key, try parseObject(depth: depth + 1, keep: .kept)))
            } else {
                pairs.append((key, try parseValue(depth: depth + 1)))
            }
            skipSpace()
            guard i < limit else { throw fail("unexpected end of input") }
            if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
            if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(pairs) }
            throw fail("expected ',' or '}'")
        }
    }

    /// Whether the next value (after white space) is an object; moves to it.
    mutating func nextIsObject() -> Bool {
        skipSpace()
        return i < limit && bytes[i] == UInt8(ascii: "{")
    }

    /// Moves past one value, refusing what `parseValue` refuses, without building its objects and arrays.
    mutating func skipValue(depth: Int) throws(JSONParseError) {
        guard depth <= JSONParser.maxDepth else { throw fail("nesting deeper than \(JSONParser.maxDepth)") }
        skipSpace()
        guard i < limit else { throw fail("unexpected end of input") }
        switch bytes[i] {
        case UInt8(ascii: "{"): _ = try parseObject(depth: depth, keep: .none)
        case UInt8(ascii: "["): _ = try parseArray(depth: depth, building: false)
        default: _ = try parseValue(depth: depth)
        }
    }

    /// An array; without `building`, its items are checked and skipped (and the answer is empty).
    mutating func parseArray(depth: Int, building: Bool = true) throws(JSONParseError) -> JSONValue {
        i += 1
        var items: [JSONValue] = []
        skipSpace()
        if i < limit, bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
        while true {
            if building { items.append(try parseValue(depth: depth + 1)) } else { try skipValue(depth: depth + 1) }
            skipSpace()
            guard i < limit else { throw fail("unexpected end of input") }
            if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
            if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
            throw fail("expected ',' or ']'")
        }
    }

    mutating func parseNumber() throws(JSONParseError) -> String {
        let start = i
        if bytes[i] == UInt8(ascii: "-") { i += 1 }
        func digits(_ p: inout JSONParser) -> Int {
            let s = p.i
            while p.i < p.limit, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(p.bytes[p.i]) { p.i += 1 }
            return p.i - s
        }
        guard i < limit else { throw fail("invalid number") }
        if bytes[i] == UInt8(ascii: "0") {
            i += 1
        } else if digits(&self) == 0 {
            throw fail("invalid number")
        }
        if i < limit, bytes[i] == UInt8(ascii: ".") {
            i += 1
            if digits(&self) == 0 { throw fail("invalid number") }
        }
        if i < limit, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            i += 1
            if i < limit, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            if digits(&self) == 0 { throw fail("invalid number") }
        }
        return String(decoding: bytes[start..<i], as: UTF8.self)
    }

    mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard i + 4 <= limit else { throw fail("truncated \\u escape") }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[i]
            let d: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw fail("invalid \\u escape")
            }
            v = v << 4 | d
            i += 1
        }
        return v
    }

    mutating func parseString() throws(JSONParseError) -> String {
        i += 1  // opening quote
        // Filled only once an escape is met: a string without one is made straight from its bytes.
        var out: [UInt8] = []
        var escaped = false
        var plainStart = i
        while true {
            guard i < limit else { throw fail("unterminated string") }
            let c = bytes[i]
            if c == UInt8(ascii: "\"") {
                if !escaped {
                    let text = String(decoding: bytes[plainStart..<i], as: UTF8.self)
                    i += 1
                    return text
                }
                out.append(contentsOf: bytes[plainStart..<i])
                i += 1
                break
            }
            if c == UInt8(ascii: "\\") {
                if !escaped {
                    escaped = true
                    out.reserveCapacity(i - plainStart + 16)
                }
                out.append(contentsOf: bytes[plainStart..<i])
                i += 1
                guard i < limit else { throw fail("unterminated string") }
                let e = bytes[i]
                i += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard i + 6 <= limit, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u")
                        else {
                            throw fail("lone surrogate in \\u escape")
                        }
                        i += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw fail("invalid surrogate pair") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw fail("lone surrogate in \\u escape")
                    }
                    guard let u = Unicode.Scalar(scalar) else { throw fail("invalid \\u escape") }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                default:
                    throw fail("invalid escape")
                }
                plainStart = i
                continue
            }
            if c < 0x20 { throw fail("control character in string") }
            if c < 0x80 { i += 1; continue }
            // Validate one multi-byte UTF-8 sequence.
            let len: Int
            var minScalar: UInt32
            var scalar: UInt32
            switch c {
            case 0xC2...0xDF: len = 2; scalar = UInt32(c & 0x1F); minScalar = 0x80
            case 0xE0...0xEF: len = 3; scalar = UInt32(c & 0x0F); minScalar = 0x800
            case 0xF0...0xF4: len = 4; scalar = UInt32(c & 0x07); minScalar = 0x10000
            default: throw fail("invalid UTF-8")
            }
            guard i + len <= limit else { throw fail("invalid UTF-8") }
            for k in 1..<len {
                let b = bytes[i + k]
                guard b & 0xC0 == 0x80 else { throw fail("invalid UTF-8") }
                scalar = scalar << 6 | UInt32(b & 0x3F)
            }
            guard scalar >= minScalar, scalar <= 0x10FFFF, !(0xD800...0xDFFF).contains(scalar) else {
                throw fail("invalid UTF-8")
            }
            minScalar = 0
            i += len
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Appends compact JSON to a byte buffer. Strings are escaped per RFC 8259;
/// non-ASCII is written as raw UTF-8 (Swift strings are always valid UTF-8).
public struct JSONWriter: Sendable {
    public var bytes: [UInt8]

    public init(capacity: Int = 512) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    public var string: String { String(decoding: bytes, as: UTF8.self) }
    public var count: Int { bytes.count }

    @inline(__always) public mutating func raw(_ s: StaticString) {
        s.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    @inline(__always) public mutating func byte(_ b: UInt8) { bytes.append(b) }

    static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    /// Writes a quoted, escaped JSON string.
    public mutating func string(_ s: String) {
        bytes.append(0x22)
        escapeContents(s)
        bytes.append(0x22)
    }

    /// A quoted, escaped JSON string literal: Herald's one string escaper, for code that builds JSON text
    /// (log lines, JWT headers and claims). `lineSafe` also escapes DEL, U+2028 and U+2029, which some
    /// line-oriented readers take for line breaks (log lines use it; payloads do not, to keep their size).
    public static func quoted(_ s: String, lineSafe: Bool = false) -> String {
        var w = JSONWriter(capacity: s.utf8.count + 8)
        w.byte(0x22)
        w.escapeContents(s, lineSafe: lineSafe)
        w.byte(0x22)
        return w.string
    }

    /// Writes the escaped contents of a string without quotes: `"`, `\` and control characters (RFC 8259);
    /// with `lineSafe`, DEL, U+2028 and U+2029 too.
    public mutating func escapeContents(_ s: String, lineSafe: Bool = false) {
        var s = s
        s.withUTF8 { buf in
            var start = 0
            var k = 0
            let n = buf.count
            guard let base = buf.baseAddress.map(UnsafeRawPointer.init) else { return }
            while k < n {
                // Eight bytes at a time past those that need nothing (most text), one at a time near the rest.
                if k + 8 <= n, !Self.mayNeedEscape(base.loadUnaligned(fromByteOffset: k, as: UInt64.self), lineSafe) {
                    k += 8
                    continue
                }
                let c = buf[k]
                if c >= 0x20 && c != 0x22 && c != 0x5C {
                    if lineSafe {
                        var escape: [UInt8]?
                        if c == 0x7F {
                            escape = Array(#"\u007f"#.utf8)
                        } else if c == 0xE2, k + 2 < n, buf[k + 1] == 0x80, buf[k + 2] == 0xA8 || buf[k + 2] == 0xA9 {
                            escape = Array((buf[k + 2] == 0xA8 ? #"\u2028"# : #"\u2029"#).utf8)
                        }
                        if let escape {
                            if k > start { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: buf[start..<k])) }
                            bytes.append(contentsOf: escape)
                            k += c == 0x7F ? 1 : 3
                            start = k
                            continue
                        }
                    }
                    k += 1
                    continue
                }
                if k > start { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: buf[start..<k])) }
                switch c {
                case 0x22: bytes.append(0x5C); bytes.append(0x22)
                case 0x5C: bytes.append(0x5C); bytes.append(0x5C)
                case 0x0A: bytes.append(0x5C); bytes.append(UInt8(ascii: "n"))
                case 0x0D: bytes.append(0x5C); bytes.append(UInt8(ascii: "r"))
                case 0x09: bytes.append(0x5C); bytes.append(UInt8(ascii: "t"))
                default:
                    bytes.append(contentsOf: [
                        0x5C, UInt8(ascii: "u"), 0x30, 0x30,
                        JSONWriter.hex[Int(c >> 4)], JSONWriter.hex[Int(c & 0xF)],
                    ])
                }
                k += 1
                start = k
            }
            if n > start { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: buf[start..<n])) }
        }
    }

    /// Whether any of the eight bytes of `w` may need escaping: a control character, `"` or `\`; with `lineSafe`,
    /// also DEL or any byte of a multi-byte character (U+2028 and U+2029 are among those). Never false for a byte
    /// that needs it (a true answer only sends those bytes through the one-at-a-time path).
    @inline(__always)
    static func mayNeedEscape(_ w: UInt64, _ lineSafe: Bool) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        // A byte of `v` is zero (a byte below 0x20, for the first test) when the subtraction borrows into its high
        // bit while that bit of `v` (of `w`) was clear.
        @inline(__always) func anyZero(_ v: UInt64) -> Bool { (v &- ones) & ~v & highs != 0 }
        if (w &- ones &* 0x20) & ~w & highs != 0 { return true }
        if anyZero(w ^ (ones &* 0x22)) || anyZero(w ^ (ones &* 0x5C)) { return true }
        return lineSafe && (w & highs != 0 || anyZero(w ^ (ones &* 0x7F)))
    }

    /// The number of bytes `string(s)` would write, quotes included.
    public static func escapedLength(_ s: String) -> Int {
        var total = 2
        for c in s.utf8 {
            if c >= 0x20 && c != 0x22 && c != 0x5C {
                total += 1
            } else if c == 0x22 || c == 0x5C || c == 0x0A || c == 0x0D || c == 0x09 {
                total += 2
            } else {
                total += 6
            }
        }
        return total
    }

    /// Writes `"key":`.
    @inline(__always) public mutating func key(_ k: StaticString) {
        bytes.append(0x22)
        k.withUTF8Buffer { bytes.append(contentsOf: $0) }
        bytes.append(0x22)
        bytes.append(0x3A)
    }

    public mutating func key(_ k: String) {
        string(k)
        bytes.append(0x3A)
    }

    public mutating func int(_ v: Int64) { DecimalASCII.append(v, to: &bytes) }

    public mutating func int(_ v: Int) { int(Int64(v)) }

    public mutating func bool(_ v: Bool) {
        if v { raw("true") } else { raw("false") }
    }

    public mutating func null() { raw("null") }

    public mutating func value(_ v: JSONValue) {
        switch v {
        case .null: null()
        case .bool(let b): bool(b)
        case .number(let n): bytes.append(contentsOf: n.utf8)
        case .string(let s): string(s)
        case .array(let a):
            byte(UInt8(ascii: "["))
            for (k, item) in a.enumerated() {
                if k > 0 { byte(UInt8(ascii: ",")) }
                value(item)
            }
            byte(UInt8(ascii: "]"))
        case .object(let o):
            // A parsed object may hold a name twice; what Herald writes never does. The first one is kept, the one
            // `JSONValue`'s subscript reads.
            byte(UInt8(ascii: "{"))
            var seen: Set<String>? = o.count > 1 ? [] : nil
            var first = true
            for pair in o {
                if seen != nil, !seen!.insert(pair.0).inserted { continue }
                if !first { byte(UInt8(ascii: ",")) }
                first = false
                key(pair.0)
                value(pair.1)
            }
            byte(UInt8(ascii: "}"))
        }
    }

    public mutating func stringArray(_ items: [String]) {
        byte(UInt8(ascii: "["))
        for (k, item) in items.enumerated() {
            if k > 0 { byte(UInt8(ascii: ",")) }
            string(item)
        }
        byte(UInt8(ascii: "]"))
    }
}
