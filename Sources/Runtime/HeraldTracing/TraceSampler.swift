/// Decides which events Herald traces, and so which carry a trace context through the internal topics.
///
/// - An event that arrives with a `traceparent` keeps the sender's decision: sampled, it is traced in the sender's
///   trace; not sampled, it is not traced (and its context is not passed on: the internal topics carry contexts of
///   sampled events only, so untraced traffic pays nothing).
/// - An event that arrives without one, at an entry point (ingest's `chat.events`, the registry's `herald.registry`),
///   starts a new trace with probability `ratio`.
/// - Past the entry points a record without a context is one that is not traced: `continued(_:)` never samples.
public struct TraceSampler: Sendable {
    /// The share of events without an incoming context that start a trace, 0 to 1.
    public let ratio: Double
    /// A uniform 64-bit draw below this samples (ratio × 2^64); `ratio` 1 samples every draw.
    private let threshold: UInt64
    private let always: Bool

    public static let defaultRatio = 0.01

    public init(ratio: Double) {
        let clamped = ratio.isNaN ? 0 : min(max(ratio, 0), 1)
        self.ratio = clamped
        always = clamped >= 1
        threshold = always ? .max : UInt64(clamped * 18_446_744_073_709_551_616.0)
    }

    /// The context an event entering Herald is traced under, or nil when it is not traced. `incoming` is its
    /// `traceparent` (nil when absent or invalid); a new trace takes its ids from `generator`.
    public func decide(incoming: TraceContext?, using generator: inout some RandomNumberGenerator) -> TraceContext? {
        if let incoming { return incoming.isSampled ? incoming : nil }
        guard always || generator.next() < threshold else { return nil }
        return Self.newTrace(using: &generator)
    }

    /// The context of an event inside Herald (read from an internal topic): traced only when it carries a sampled
    /// context.
    public func continued(_ incoming: TraceContext?) -> TraceContext? {
        guard let incoming, incoming.isSampled else { return nil }
        return incoming
    }

    /// A new sampled trace: random trace and span ids (never zero), no `tracestate`.
    public static func newTrace(using generator: inout some RandomNumberGenerator) -> TraceContext {
        var high: UInt64 = 0
        var low: UInt64 = 0
        while high == 0 && low == 0 {
            high = generator.next()
            low = generator.next()
        }
        return TraceContext(traceIDHigh: high, traceIDLow: low, spanID: newSpanID(using: &generator), flags: 0x01)
    }

    /// A random span id (never zero).
    public static func newSpanID(using generator: inout some RandomNumberGenerator) -> UInt64 {
        var id: UInt64 = 0
        while id == 0 { id = generator.next() }
        return id
    }
}

/// SplitMix64: a fast 64-bit generator for the sampler's draws and new ids. Seeded by the system's generator it
/// costs no system call per draw; seeded by a number (tests) its draws are reproducible.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public var state: UInt64

    public init(seed: UInt64) { state = seed }

    /// A generator seeded from the system's random source.
    public static func seededBySystem() -> SplitMix64 {
        var system = SystemRandomNumberGenerator()
        return SplitMix64(seed: system.next())
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
