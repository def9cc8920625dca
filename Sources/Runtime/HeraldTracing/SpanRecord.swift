/// What a span measured (OTLP's `Span.SpanKind`, by its numbers there).
public enum SpanKind: UInt8, Sendable {
    case `internal` = 1
    case server = 2
    case client = 3
    case producer = 4
    case consumer = 5
}

/// An attribute's value: Herald's spans carry strings and integers only.
public enum SpanValue: Sendable, Hashable {
    case string(String)
    case int(Int64)
}

/// One span as it is exported: ids, times, attributes, events and status, nothing else.
public struct SpanRecord: Sendable {
    public var traceIDHigh: UInt64
    public var traceIDLow: UInt64
    public var spanID: UInt64
    /// The parent span's id; 0: a root span.
    public var parentSpanID: UInt64
    /// The W3C trace flags the span was recorded under (bit 0: sampled).
    public var flags: UInt8
    /// The `tracestate` the span's context carries, passed on unchanged.
    public var traceState: String?
    public var name: String
    public var kind: SpanKind
    public var startNanoseconds: UInt64
    public var endNanoseconds: UInt64 = 0
    /// In the order set; a key set again replaces its value in place.
    public var attributes: [(key: String, value: SpanValue)] = []
    public var events: [SpanEventRecord] = []
    /// Set when the span failed (OTLP status `error`), with its description: a reason code, never message text.
    public var errorDescription: String?

    public init(
        traceIDHigh: UInt64, traceIDLow: UInt64, spanID: UInt64, parentSpanID: UInt64, flags: UInt8,
        traceState: String?, name: String, kind: SpanKind, startNanoseconds: UInt64
    ) {
        self.traceIDHigh = traceIDHigh
        self.traceIDLow = traceIDLow
        self.spanID = spanID
        self.parentSpanID = parentSpanID
        self.flags = flags
        self.traceState = traceState
        self.name = name
        self.kind = kind
        self.startNanoseconds = startNanoseconds
        attributes.reserveCapacity(12)
    }

    public mutating func set(_ key: String, _ value: SpanValue) {
        if let index = attributes.firstIndex(where: { $0.key == key }) {
            attributes[index].value = value
        } else {
            attributes.append((key, value))
        }
    }

    public func attribute(_ key: String) -> SpanValue? { attributes.first { $0.key == key }?.value }
}

/// A moment in a span: its name, time and attributes (`herald.reason`, ...).
public struct SpanEventRecord: Sendable {
    public var name: String
    public var timeNanoseconds: UInt64
    public var attributes: [(key: String, value: SpanValue)]

    public init(name: String, timeNanoseconds: UInt64, attributes: [(key: String, value: SpanValue)] = []) {
        self.name = name
        self.timeNanoseconds = timeNanoseconds
        self.attributes = attributes
    }
}
