// W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` and `tracestate` headers, read from and
// written to the bytes of a Kafka record header.

/// The trace an event belongs to, as its `traceparent` and `tracestate` headers carry it.
///
/// `traceparent` is `version-traceid-parentid-flags` in lowercase hex: `00-` + 32 digits + `-` + 16 digits + `-` +
/// 2 digits, 55 bytes. A version above `00` may append fields after a `-`; they are ignored and the context is
/// written back as version `00`. Version `ff`, an all-zero trace or parent id, upper-case digits or any other
/// shape make the header invalid: the event is then treated as one without a context.
public struct TraceContext: Sendable, Hashable {
    /// The trace id's 16 bytes as two big-endian halves (never both zero).
    public var traceIDHigh: UInt64
    public var traceIDLow: UInt64
    /// The parent (span) id: the span of the sender that this context continues (never zero).
    public var spanID: UInt64
    /// The trace flags; bit 0 is `sampled`.
    public var flags: UInt8
    /// The `tracestate` header as received (vendors' entries, passed on unchanged), or nil when there was none or
    /// it was not valid.
    public var traceState: String?

    public static let traceparentHeader = "traceparent"
    public static let tracestateHeader = "tracestate"
    /// The most bytes of `tracestate` passed on (the W3C limit is 32 entries; 512 bytes is what a receiver must
    /// at least accept). A longer one is dropped, not cut, since a cut entry would be a different one.
    public static let maxTraceStateBytes = 512

    public init(traceIDHigh: UInt64, traceIDLow: UInt64, spanID: UInt64, flags: UInt8, traceState: String? = nil) {
        self.traceIDHigh = traceIDHigh
        self.traceIDLow = traceIDLow
        self.spanID = spanID
        self.flags = flags
        self.traceState = traceState
    }

    /// True when the sender recorded its part of the trace (flag bit 0): Herald then records its own.
    public var isSampled: Bool { flags & 0x01 != 0 }

    /// The trace id in the 32 lowercase hex digits logs and trace viewers show.
    public var traceIDHex: String { Hex.string(traceIDHigh) + Hex.string(traceIDLow) }
    /// The parent id in 16 lowercase hex digits.
    public var spanIDHex: String { Hex.string(spanID) }

    /// The context's `traceparent` value (version 00).
    public var traceparent: String {
        "00-" + traceIDHex + "-" + spanIDHex + "-" + Hex.string(flags)
    }

    /// The `traceparent` value's bytes (55).
    public var traceparentBytes: [UInt8] { Array(traceparent.utf8) }

    /// The same trace continued from another span: what a stage passes on once it recorded a span of its own.
    public func continued(from spanID: UInt64) -> TraceContext {
        var next = self
        next.spanID = spanID
        return next
    }

    /// Reads a `traceparent` value and, when given, a `tracestate` value; nil when `traceparent` is not valid.
    /// A `tracestate` that is not valid is dropped (the context stays).
    public init?(traceparent: some Collection<UInt8>, tracestate: (some Collection<UInt8>)? = [UInt8]?.none) {
        let bytes = Array(traceparent)
        // version "-" trace-id "-" parent-id "-" flags, and for a later version possibly "-" more.
        guard bytes.count >= 55, bytes[2] == UInt8(ascii: "-"), bytes[35] == UInt8(ascii: "-"),
            bytes[52] == UInt8(ascii: "-"), let version = Hex.byte(bytes[0], bytes[1]), version != 0xFF
        else { return nil }
        if version == 0 {
            guard bytes.count == 55 else { return nil }
        } else if bytes.count > 55 {
            guard bytes[55] == UInt8(ascii: "-") else { return nil }
        }
        guard let high = Hex.uint64(bytes, from: 3), let low = Hex.uint64(bytes, from: 19),
            let span = Hex.uint64(bytes, from: 36), let flags = Hex.byte(bytes[53], bytes[54]),
            high != 0 || low != 0, span != 0
        else { return nil }
        self.init(
            traceIDHigh: high, traceIDLow: low, spanID: span, flags: flags,
            traceState: tracestate.flatMap(Self.validTraceState))
    }

    /// `bytes` as a `tracestate` value when it is one Herald passes on: printable ASCII, at most
    /// `maxTraceStateBytes`, at most 32 comma-separated members, each `key=value` with a non-empty key and value.
    /// Empty (only spaces and commas) is nil: there is nothing to pass on.
    static func validTraceState(_ value: some Collection<UInt8>) -> String? {
        guard value.count <= maxTraceStateBytes, value.allSatisfy({ $0 >= 0x20 && $0 <= 0x7E }) else { return nil }
        var members = 0
        for member in value.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: false) {
            let trimmed = member.drop { $0 == 0x20 || $0 == 0x09 }
            if trimmed.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }  // empty members are allowed
            guard let equals = trimmed.firstIndex(of: UInt8(ascii: "=")), equals != trimmed.startIndex,
                trimmed.index(after: equals) != trimmed.endIndex
            else { return nil }
            members += 1
        }
        guard members > 0, members <= 32 else { return nil }
        return String(decoding: value, as: UTF8.self)
    }
}

/// Lowercase hex, as W3C Trace Context requires.
enum Hex {
    private static let digits = Array("0123456789abcdef".utf8)

    static func string(_ value: UInt64) -> String {
        String(unsafeUninitializedCapacity: 16) { buffer in
            for index in 0..<16 { buffer[index] = digits[Int((value >> (60 - 4 * index)) & 0xF)] }
            return 16
        }
    }

    static func string(_ value: UInt8) -> String {
        String(unsafeUninitializedCapacity: 2) { buffer in
            buffer[0] = digits[Int(value >> 4)]
            buffer[1] = digits[Int(value & 0xF)]
            return 2
        }
    }

    /// A lowercase hex digit's value; nil for anything else (upper case included).
    static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        default: nil
        }
    }

    static func byte(_ high: UInt8, _ low: UInt8) -> UInt8? {
        guard let h = nibble(high), let l = nibble(low) else { return nil }
        return h << 4 | l
    }

    /// The 16 hex digits at `start` as a number.
    static func uint64(_ bytes: [UInt8], from start: Int) -> UInt64? {
        var value: UInt64 = 0
        for index in start..<start + 16 {
            guard let n = nibble(bytes[index]) else { return nil }
            value = value << 4 | UInt64(n)
        }
        return value
    }
}
