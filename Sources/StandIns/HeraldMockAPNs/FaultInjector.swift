// Deterministic fault injection: one seeded draw per valid request picks at most one fault.

/// SplitMix64: tiny, fast, and the same sequence for the same seed everywhere.
public struct SeededRandom: Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    @inline(__always)
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    @inline(__always)
    public mutating func unit() -> Double {
        Double(next() >> 11) * (1.0 / 9_007_199_254_740_992.0)
    }
}

public struct FaultInjector: Sendable {
    private var random: SeededRandom
    private let bounds: [(Double, MockReason)]

    public init(rates: MockFaultRates, seed: UInt64) {
        random = SeededRandom(seed: seed)
        var acc = 0.0
        var b: [(Double, MockReason)] = []
        for (rate, reason) in [
            (rates.tooManyRequests, MockReason.tooManyRequests),
            (rates.internalServerError, .internalServerError),
            (rates.serviceUnavailable, .serviceUnavailable),
            (rates.unregistered, .unregistered),
            (rates.badDeviceToken, .badDeviceToken),
        ] where rate > 0 {
            acc += rate
            b.append((acc, reason))
        }
        bounds = b
    }

    public var isActive: Bool { !bounds.isEmpty }

    /// The fault to answer a valid request with, if any.
    @inline(__always)
    public mutating func draw() -> MockReason? {
        guard !bounds.isEmpty else { return nil }
        let u = random.unit()
        for (bound, reason) in bounds where u < bound { return reason }
        return nil
    }
}

/// Generates random (version 4) UUIDs as 36 lowercase ASCII bytes, without allocating.
struct UUIDWriter {
    var random: SeededRandom

    static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    mutating func write(into out: UnsafeMutableRawBufferPointer) {
        var hi = random.next()
        var lo = random.next()
        hi = (hi & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000  // version 4
        lo = (lo & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000  // variant 10
        var o = 0
        Self.hex.withUnsafeBufferPointer { h in
            for i in 0..<32 {
                if i == 8 || i == 12 || i == 16 || i == 20 { out[o] = UInt8(ascii: "-"); o += 1 }
                let word = i < 16 ? hi : lo
                let shift = UInt64(60 - (i % 16) * 4)
                out[o] = h[Int((word >> shift) & 0xF)]
                o += 1
            }
        }
    }
}
