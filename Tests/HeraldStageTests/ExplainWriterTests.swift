import HeraldCore
import HeraldPipeline
import HeraldStage
import HeraldTestSupport
import Logging
import Synchronization
import Testing

/// A sink that holds every write until opened, and can fail its first writes.
final class GatedSink: ExplainSink {
    struct State {
        var open = false
        var waiting: [CheckedContinuation<Void, Never>] = []
        var calls = 0
        var failuresLeft = 0
        var recorded: [ExplainEntry] = []
    }
    let state: Mutex<State>

    init(open: Bool = false, failures: Int = 0) {
        state = Mutex(State(open: open, failuresLeft: failures))
    }

    func record(_ entries: [ExplainEntry]) async throws {
        await withCheckedContinuation { continuation in
            let go = state.withLock { s -> Bool in
                s.calls += 1
                if s.open { return true }
                s.waiting.append(continuation)
                return false
            }
            if go { continuation.resume() }
        }
        let fail = state.withLock { s -> Bool in
            if s.failuresLeft > 0 {
                s.failuresLeft -= 1
                return true
            }
            s.recorded += entries
            return false
        }
        if fail { throw TestSupportError("refused") }
    }

    func open() {
        let waiting = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.open = true
            defer { s.waiting = [] }
            return s.waiting
        }
        for c in waiting { c.resume() }
    }

    var waitingCount: Int { state.withLock { $0.waiting.count } }
    var calls: Int { state.withLock { $0.calls } }
    var recorded: [ExplainEntry] { state.withLock { $0.recorded } }
}

@Suite("The explain writer: bounded background writes that keep what arrives while they run")
struct ExplainWriterTests {
    static func entries(_ batch: Int, count: Int) -> [ExplainEntry] {
        (0..<count).map {
            ExplainEntry(
                appID: "a", eventID: "e\(batch)", user: "u\($0)", stage: "suppress", decision: "suppress",
                reason: "snoozed", at: 1)
        }
    }

    @Test("batches that arrive while every write runs wait, and the next write to finish takes them all")
    func pendingEntriesAreWrittenNotDropped() async throws {
        let sink = GatedSink()
        let dropped = Mutex(0)
        let writer = ExplainWriter(sink: sink, maxWrites: 4, logger: Logger(label: "test")) { n in
            dropped.withLock { $0 += n }
        }
        for batch in 0..<14 { writer.submit(Self.entries(batch, count: 3)) }
        try await waitUntil("4 writes waiting at the sink") { sink.waitingCount == 4 }
        #expect(writer.backlog.writes == 4)
        #expect(writer.backlog.pending == 30)
        sink.open()
        try await waitUntil("every entry written") { sink.recorded.count == 42 && writer.backlog.writes == 0 }
        #expect(sink.calls == 5, "the 10 waiting batches went as one write")
        #expect(dropped.withLock { $0 } == 0)
        let users = Set(sink.recorded.map { "\($0.eventID)/\($0.user ?? "")" })
        #expect(users.count == 42)
    }

    @Test("past the pending bound entries are dropped and counted")
    func pendingBoundDropsAndCounts() async throws {
        let sink = GatedSink()
        let dropped = Mutex(0)
        let pending = Mutex(0)
        let writer = ExplainWriter(
            sink: sink, maxWrites: 1, maxPending: 5, logger: Logger(label: "test"),
            changed: { change in pending.withLock { $0 += change } }, dropped: { n in dropped.withLock { $0 += n } })
        writer.submit(Self.entries(0, count: 2))
        writer.submit(Self.entries(1, count: 4))
        writer.submit(Self.entries(2, count: 2))
        #expect(dropped.withLock { $0 } == 2)
        #expect(writer.backlog.pending == 4)
        sink.open()
        try await waitUntil("the kept entries written") { sink.recorded.count == 6 && writer.backlog.writes == 0 }
        #expect(!sink.recorded.contains { $0.eventID == "e2" })
        // Dropped entries were never pending; the written ones are no longer.
        #expect(pending.withLock { $0 } == 0)
    }

    @Test("a failed write is tried again; one that fails every try is dropped and counted")
    func failedWritesAreRetriedThenCounted() async throws {
        let flaky = GatedSink(open: true, failures: 1)
        let dropped = Mutex(0)
        let writer = ExplainWriter(
            sink: flaky, retryDelays: [.milliseconds(1)], logger: Logger(label: "test")
        ) { n in dropped.withLock { $0 += n } }
        writer.submit(Self.entries(0, count: 3))
        try await waitUntil("the retried write") { flaky.recorded.count == 3 && writer.backlog.writes == 0 }
        #expect(flaky.calls == 2)
        #expect(dropped.withLock { $0 } == 0)

        let down = GatedSink(open: true, failures: 100)
        let lost = Mutex(0)
        let failing = ExplainWriter(
            sink: down, retryDelays: [.milliseconds(1), .milliseconds(1)], logger: Logger(label: "test")
        ) { n in lost.withLock { $0 += n } }
        failing.submit(Self.entries(1, count: 5))
        try await waitUntil("the write given up") { lost.withLock { $0 } == 5 && failing.backlog.writes == 0 }
        #expect(down.calls == 3)
        #expect(down.recorded.isEmpty)
    }

    @Test("entries gather for the interval and go in one write; flush writes them at once")
    func entriesGatherIntoOneWrite() async throws {
        let sink = GatedSink(open: true)
        let pending = Mutex(0)
        let writer = ExplainWriter(
            sink: sink, interval: .seconds(3600), logger: Logger(label: "test"),
            changed: { change in pending.withLock { $0 += change } }, dropped: { _ in })
        for batch in 0..<5 { writer.submit(Self.entries(batch, count: 3)) }
        // An hour to go: nothing is written yet.
        #expect(sink.calls == 0)
        #expect(writer.backlog.pending == 15)
        #expect(pending.withLock { $0 } == 15, "what `changed` reports (herald_explain_pending)")
        await writer.flush()
        #expect(sink.calls == 1, "the 5 batches went as one write")
        #expect(sink.recorded.count == 15)
        #expect(writer.backlog.writes == 0 && writer.backlog.pending == 0)
        #expect(pending.withLock { $0 } == 0)
        // Flushing with nothing to write returns at once.
        await writer.flush()
        #expect(sink.calls == 1)
    }

    @Test("as many entries as writeAt are written without waiting for the interval")
    func enoughEntriesAreWrittenAtOnce() async throws {
        let sink = GatedSink(open: true)
        let writer = ExplainWriter(
            sink: sink, interval: .seconds(3600), writeAt: 5, logger: Logger(label: "test")
        ) { _ in }
        writer.submit(Self.entries(0, count: 3))
        #expect(sink.calls == 0)
        writer.submit(Self.entries(1, count: 3))
        try await waitUntil("the 6 entries written") { sink.recorded.count == 6 && writer.backlog.writes == 0 }
        #expect(sink.calls == 1)
        #expect(writer.backlog.pending == 0)
    }

    @Test("at the interval's end what waits is written; later entries wait for their own interval")
    func theIntervalEndsInAWrite() async throws {
        let sink = GatedSink(open: true)
        let writer = ExplainWriter(sink: sink, interval: .milliseconds(50), logger: Logger(label: "test")) { _ in }
        writer.submit(Self.entries(0, count: 3))
        writer.submit(Self.entries(1, count: 2))
        try await waitUntil("the first interval's entries written") { sink.recorded.count == 5 }
        #expect(sink.calls == 1)
        writer.submit(Self.entries(2, count: 4))
        try await waitUntil("the second interval's entries written") {
            sink.recorded.count == 9 && writer.backlog.writes == 0
        }
        #expect(sink.calls == 2)
    }

    @Test("flush returns only once the running writes ended, and writes what arrived meanwhile")
    func flushWaitsForRunningWrites() async throws {
        let sink = GatedSink()
        let writer = ExplainWriter(sink: sink, maxWrites: 1, logger: Logger(label: "test")) { _ in }
        writer.submit(Self.entries(0, count: 2))
        try await waitUntil("the write waiting at the sink") { sink.waitingCount == 1 }
        writer.submit(Self.entries(1, count: 3))
        let flushed = Mutex(false)
        let flushing = Task {
            await writer.flush()
            flushed.withLock { $0 = true }
        }
        #expect(writer.backlog.pending == 3)
        #expect(!flushed.withLock { $0 }, "flush returned while a write was held")
        sink.open()
        await flushing.value
        #expect(sink.recorded.count == 5)
        #expect(writer.backlog.writes == 0 && writer.backlog.pending == 0)
    }
}
