import HeraldCore
import HeraldPipeline
import Logging
import Synchronization

/// Writes the explain trail off the batches' path, gathered into few large writes.
///
/// Entries wait up to `interval` from the first of them, so one write carries the entries of many batches: the
/// latest decisions of users whose last-decision hash is the same go in one `HSET`, the lines of one hourly log
/// in one `RPUSH`, and the whole write is one round trip (`ExplainStore.batch`). As many entries as `writeAt`
/// are written without waiting. With `interval` zero a write starts as soon as entries arrive.
///
/// At most `maxWrites` writes run at once; entries that are due while all of them run are taken whole by the next
/// write to finish. A write that fails is tried again (`retryDelays`). Entries are dropped, and counted through
/// `dropped`, only when the pending list would pass `maxPending` or a write fails on every try: a slow or absent
/// Redis never holds a batch up or grows memory without bound. `flush()` writes what waits at once (a stage calls
/// it as it stops). `changed` hears every change of the entries not yet written or dropped (as a difference: the
/// stage's `herald_explain_pending`).
public final class ExplainWriter: Sendable {
    struct State {
        var writes = 0
        var pending: [ExplainEntry] = []
        /// When the oldest pending entry arrived.
        var pendingSince: ContinuousClock.Instant?
        /// A task is waiting for the pending entries to be due.
        var timerArmed = false
        /// Calls of `flush()` under way: every pending entry is due.
        var flushing = 0
        /// `flush()` calls waiting for every write to end with nothing pending.
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
    }

    let sink: any ExplainSink
    let interval: Duration
    let writeAt: Int
    let maxWrites: Int
    let maxPending: Int
    let retryDelays: [Duration]
    let dropped: @Sendable (Int) -> Void
    let changed: @Sendable (Int) -> Void
    let logger: Logger
    private let state = Mutex(State())

    /// The pipeline file's `explain.write_interval_ms` when it says nothing.
    public static let defaultInterval: Duration = .seconds(1)
    public static let defaultWriteAt = 10_000
    public static let defaultMaxWrites = 4
    public static let defaultMaxPending = 50_000

    public init(
        sink: any ExplainSink, interval: Duration = .zero, writeAt: Int = ExplainWriter.defaultWriteAt,
        maxWrites: Int = ExplainWriter.defaultMaxWrites, maxPending: Int = ExplainWriter.defaultMaxPending,
        retryDelays: [Duration] = [.milliseconds(100), .milliseconds(500)], logger: Logger,
        changed: @escaping @Sendable (Int) -> Void = { _ in }, dropped: @escaping @Sendable (Int) -> Void
    ) {
        self.sink = sink
        self.interval = max(.zero, interval)
        self.writeAt = max(1, writeAt)
        self.maxWrites = max(1, maxWrites)
        self.maxPending = maxPending
        self.retryDelays = retryDelays
        self.logger = logger
        self.dropped = dropped
        self.changed = changed
    }

    /// Hands `entries` over; returns at once.
    public func submit(_ entries: [ExplainEntry]) {
        if entries.isEmpty { return }
        enum Next {
            case write([ExplainEntry])
            case wait
            case queued
            case drop
        }
        let next = state.withLock { s -> Next in
            guard s.pending.count + entries.count <= maxPending else { return .drop }
            // Counted before any write can take them (and count them off).
            changed(entries.count)
            if s.pending.isEmpty {
                s.pendingSince = .now
                s.pending = entries  // taken as it is: appending would copy each entry
            } else {
                s.pending += entries
            }
            if let due = takeIfDue(&s) { return .write(due) }
            guard interval > .zero, !s.timerArmed else { return .queued }
            s.timerArmed = true
            return .wait
        }
        switch next {
        case .write(let due): Task { await self.run(due) }
        case .wait: Task { await self.waitThenWrite() }
        case .queued: break
        case .drop: dropped(entries.count)
        }
    }

    /// Writes whatever waits now and returns once every write ended (or gave up) with nothing pending.
    public func flush() async {
        let due = state.withLock { s -> [ExplainEntry]? in
            s.flushing += 1
            return takeIfDue(&s)
        }
        if let due { await run(due) }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLock { s -> Bool in
                if s.writes == 0 && s.pending.isEmpty { return true }
                s.idleWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
        state.withLock { $0.flushing -= 1 }
    }

    /// Writes and entries waiting for a write (for tests and shutdown checks).
    public var backlog: (writes: Int, pending: Int) { state.withLock { ($0.writes, $0.pending.count) } }

    /// The pending entries, taken for a new write, when they are due and a write may start.
    private func takeIfDue(_ s: inout State) -> [ExplainEntry]? {
        guard !s.pending.isEmpty, s.writes < maxWrites else { return nil }
        let waited = s.pendingSince.map { ContinuousClock.now - $0 >= interval } ?? true
        guard waited || s.flushing > 0 || s.pending.count >= writeAt else { return nil }
        s.writes += 1
        s.pendingSince = nil
        defer { s.pending = [] }
        return s.pending
    }

    /// Sleeps until the pending entries are due, then writes them (the one armed timer).
    private func waitThenWrite() async {
        while true {
            let wait = state.withLock { s -> Duration? in
                guard let since = s.pendingSince else {
                    s.timerArmed = false
                    return nil
                }
                return since + interval - .now
            }
            guard let wait else { return }
            if wait > .zero { try? await Task.sleep(for: wait) }
            enum Next {
                case write([ExplainEntry])
                case again
                case done
            }
            let next = state.withLock { s -> Next in
                if let due = takeIfDue(&s) {
                    s.timerArmed = false
                    return .write(due)
                }
                // Nothing pending, or every write busy (the next to finish takes what is due): the timer ends.
                if s.pending.isEmpty || s.writes >= maxWrites || s.flushing > 0 {
                    s.timerArmed = false
                    return .done
                }
                return .again  // taken and refilled meanwhile: wait for the newer entries
            }
            switch next {
            case .write(let due):
                await run(due)
                return
            case .again: continue
            case .done: return
            }
        }
    }

    /// Writes `first`, then whatever is due, until nothing is.
    private func run(_ first: [ExplainEntry]) async {
        var entries = first
        while true {
            await write(entries)
            let (more, wait, idle) = state.withLock {
                s -> ([ExplainEntry]?, Bool, [CheckedContinuation<Void, Never>]) in
                s.writes -= 1
                if let due = takeIfDue(&s) { return (due, false, []) }
                var wait = false
                if !s.pending.isEmpty, interval > .zero, !s.timerArmed {
                    s.timerArmed = true
                    wait = true
                }
                guard s.writes == 0, s.pending.isEmpty else { return (nil, wait, []) }
                defer { s.idleWaiters = [] }
                return (nil, wait, s.idleWaiters)
            }
            idle.forEach { $0.resume() }
            if wait { Task { await self.waitThenWrite() } }
            guard let more else { return }
            entries = more
        }
    }

    private func write(_ entries: [ExplainEntry]) async {
        defer { changed(-entries.count) }
        var attempt = 0
        while true {
            do {
                try await sink.record(entries)
                return
            } catch {
                guard attempt < retryDelays.count else {
                    logger.warning(
                        "explain trail write failed",
                        metadata: [LogKey.error: "\(error)", "entries": "\(entries.count)"])
                    dropped(entries.count)
                    return
                }
                try? await Task.sleep(for: retryDelays[attempt])
                attempt += 1
            }
        }
    }
}
