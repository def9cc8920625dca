// TraceSampler: the incoming sampled flag is respected; the ratio applies only to events without a context, and
// only at the entry points.

import HeraldTracing
import Testing

/// A generator that returns fixed values in turn.
struct FixedGenerator: RandomNumberGenerator {
    var values: [UInt64]
    var index = 0
    mutating func next() -> UInt64 {
        defer { index += 1 }
        return values[index % values.count]
    }
}

@Suite("Trace sampling")
struct TraceSamplerTests {
    static let sampled = TraceContext(
        traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".utf8))
    static let unsampled = TraceContext(
        traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".utf8))

    @Test("an incoming sampled context is traced, unchanged, whatever the ratio", arguments: [0.0, 0.01, 1.0])
    func incomingSampled(ratio: Double) throws {
        var generator = SplitMix64(seed: 1)
        let decided = TraceSampler(ratio: ratio).decide(incoming: Self.sampled, using: &generator)
        #expect(decided == Self.sampled)
    }

    @Test("an incoming context that is not sampled is not traced, whatever the ratio", arguments: [0.0, 0.01, 1.0])
    func incomingUnsampled(ratio: Double) {
        var generator = SplitMix64(seed: 1)
        #expect(TraceSampler(ratio: ratio).decide(incoming: Self.unsampled, using: &generator) == nil)
    }

    @Test("without a context: ratio 1 starts a sampled trace for every event, ratio 0 for none")
    func extremes() throws {
        var generator = SplitMix64(seed: 7)
        for _ in 0..<1000 {
            let context = try #require(TraceSampler(ratio: 1).decide(incoming: nil, using: &generator))
            #expect(context.isSampled && context.spanID != 0 && (context.traceIDHigh | context.traceIDLow) != 0)
            #expect(context.traceState == nil)
            #expect(TraceSampler(ratio: 0).decide(incoming: nil, using: &generator) == nil)
        }
    }

    @Test("without a context the ratio is the share sampled: a draw below ratio x 2^64 samples")
    func threshold() {
        let sampler = TraceSampler(ratio: 0.25)
        var below = FixedGenerator(values: [UInt64.max / 4 - 1, 5, 6, 7])
        #expect(sampler.decide(incoming: nil, using: &below) != nil)
        var above = FixedGenerator(values: [UInt64.max / 4 + 1])
        #expect(sampler.decide(incoming: nil, using: &above) == nil)
        // Over many draws the share is the ratio (binomial: 100,000 draws at 0.01 are 1000 +- 31.5; 6 sigma).
        var generator = SplitMix64(seed: 42)
        let count = (0..<100_000).filter { _ in
            TraceSampler(ratio: 0.01).decide(incoming: nil, using: &generator) != nil
        }.count
        #expect(abs(count - 1000) < 190, "sampled \(count) of 100,000 at 0.01")
    }

    @Test("new traces have distinct ids")
    func distinctIDs() {
        var generator = SplitMix64(seed: 3)
        let ids = (0..<1000).map { _ in TraceSampler.newTrace(using: &generator).traceIDHex }
        #expect(Set(ids).count == 1000)
    }

    @Test("past the entry points only a sampled context continues; none is started")
    func continued() {
        let sampler = TraceSampler(ratio: 1)
        #expect(sampler.continued(Self.sampled) == Self.sampled)
        #expect(sampler.continued(Self.unsampled) == nil)
        #expect(sampler.continued(nil) == nil)
    }

    @Test("ratios outside 0...1 are clamped, NaN is 0")
    func clamped() {
        #expect(TraceSampler(ratio: 2).ratio == 1 && TraceSampler(ratio: -1).ratio == 0)
        #expect(TraceSampler(ratio: .nan).ratio == 0)
    }
}
