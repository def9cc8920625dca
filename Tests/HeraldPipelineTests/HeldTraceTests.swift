// Trace contexts on the records suppress's timers make (docs/operations.md "Tracing"): a traced message held by its
// burst or its user's flood guard, or counted for a digest, keeps its context (`StageInput.trace`) with the held
// state, and the flush, summary or digest record carries the latest traced one's; an untraced one carries none.

import Foundation
import HeraldCore
import HeraldPipeline
import Testing

@Suite("Trace contexts on flushes and digests")
struct HeldTraceTests {
    static let a = TracePropagation(
        traceparent: Array("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".utf8),
        tracestate: Array("vendor=x".utf8))
    static let b = TracePropagation(
        traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".utf8))

    /// `inputs` with the trace contexts of `traces` by index.
    static func traced(_ inputs: [StageInput], _ traces: [Int: TracePropagation]) -> [StageInput] {
        inputs.enumerated().map { n, input in
            var input = input
            input.trace = traces[n]
            return input
        }
    }

    /// Five messages of a burst (the first goes on, four are held) with `traces`; the flush's trace contexts.
    static func flushTraces(_ traces: [Int: TracePropagation]) async throws -> [TracePropagation?] {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: BurstStageTests.app())
        let ledger = MemoryBurstLedger()
        suppress.bursts = ledger
        let inputs = Self.traced(try BurstStageTests.inputs(5), traces)
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(results.map(\.outputs.count) == [1, 0, 0, 0, 0])
        let produced = Produced()
        let flusher = BurstFlusher(ledger: ledger) { lane in "deliverable.\(lane.rawValue)" }
        let pass = try await flusher.pass(
            apps: BurstStageTests.app(), now: BatchContext.millis(fixedNow) + 4_000, produce: produced.add)
        #expect(pass.flushed == 1)
        #expect(try StageCodec.decode(DeliverableRecord.self, from: produced.outputs[0].value).burst == 5)
        return produced.traces
    }

    @Test("a burst's flush carries the latest traced held message's context, tracestate and all")
    func burstFlush() async throws {
        #expect(try await Self.flushTraces([1: Self.a]) == [Self.a])
        #expect(try await Self.flushTraces([1: Self.a, 3: Self.b]) == [Self.b], "the later traced one wins")
        // The first message went on in the batch with its own context: the flush shows the held ones.
        #expect(try await Self.flushTraces([0: Self.a]) == [nil])
    }

    @Test("an untraced burst's flush carries no context, and its held message keeps none")
    func untracedBurst() async throws {
        #expect(try await Self.flushTraces([:]) == [nil])
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: BurstStageTests.app())
        let spy = SpyBurstLedger()
        suppress.bursts = spy
        _ = await suppress.process(Self.traced(try BurstStageTests.inputs(3), [2: Self.b]), context: fixedContext)
        #expect(spy.messages.map(\.trace) == [nil, nil, Self.b.held])
    }

    @Test("the flood guard's summary carries the latest traced held push's context")
    func floodSummary() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: FloodStageTests.app())
        let ledger = MemoryBurstLedger()
        suppress.bursts = ledger
        // 3 go on (the second traced: its own output carries it), 4 are held (the fifth traced), the call rings.
        let inputs = Self.traced(try FloodStageTests.inputs(7), [1: Self.b, 4: Self.a])
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(results.map(\.outputs.count) == [1, 1, 1, 0, 0, 0, 0, 1])
        let produced = Produced()
        let flusher = BurstFlusher(ledger: ledger) { _ in "d" }
        let now = BatchContext.millis(fixedNow)
        let pass = try await flusher.pass(
            apps: FloodStageTests.app(), now: now - now % 60_000 + 60_000, produce: produced.add)
        #expect(pass.summaries == 1 && produced.traces == [Self.a])

        // Untraced pushes: the summary has no context.
        var untraced = SuppressProcessor(deliverableTopic: "d", apps: FloodStageTests.app())
        let other = MemoryBurstLedger()
        untraced.bursts = other
        _ = await untraced.process(try FloodStageTests.inputs(7), context: fixedContext)
        let none = Produced()
        _ = try await BurstFlusher(ledger: other) { _ in "d" }.pass(
            apps: FloodStageTests.app(), now: now - now % 60_000 + 60_000, produce: none.add)
        #expect(none.outputs.count == 1 && none.traces == [nil])
    }

    @Test("a digest carries the latest traced counted message's context; an untraced user's digest none")
    func digest() async throws {
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: DigestStageTests.app())
        let ledger = MemoryDigestLedger()
        suppress.digests = ledger
        // Five messages to u2 and u3, interleaved (u2 at even indexes): u2's second and fourth traced.
        let inputs = Self.traced(try DigestStageTests.inputs(to: ["u2", "u3"]), [2: Self.a, 6: Self.b])
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(results.allSatisfy { $0.outputs.isEmpty })
        ledger.states.withLock { $0 = ["u2": DigestStageTests.state(), "u3": DigestStageTests.state()] }
        let produced = Produced()
        let flusher = DigestFlusher(ledger: ledger) { lane in "deliverable.\(lane.rawValue)" }
        let pass = try await flusher.pass(
            apps: DigestStageTests.app(), now: DigestStageTests.end, produce: produced.add)
        #expect(pass.sent == 2)
        let recipients = produced.outputs.map(\.key)
        let traces = Dictionary(uniqueKeysWithValues: zip(recipients, produced.traces))
        #expect(traces["u2"] == .some(Self.b))
        #expect(traces["u3"] == .some(nil))
    }
}
