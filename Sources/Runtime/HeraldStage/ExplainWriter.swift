import HeraldCore
import HeraldPipeline
import Logging
import Synchronization

/// Writes the explain trail off the batches' path.
///
/// At most `maxWrites` writes run at once. Entries that arrive while all of them run wait in one pending list,
/// which the next write to finish takes whole, so a burst of small batches becomes a few larger writes instead of
/// lost entries. A write that fails is tried again (`retryDelays`). Entries are dropped, and counted through
/// `dropped`, only when the pending list would pass `maxPending` or a write fails on every try: a slow or absent
/// Redis never holds a batch up or grows memory without bound.
public final class ExplainWriter: Sendable {
    struct State {
        var writes = 0
        var pending: [ExplainEntry] = []
    }

    let sink: any ExplainSink
    let maxWrites: Int
    let maxPending: Int
    let retryDelays: [Duration]
    let dropped: @Sendable (Int) -> Void
    let logger: Logger
    private let state = Mutex(State())

    public static let defaultMaxWrites = 4
    public static let defaultMaxPending = 20_000

    public init(
        sink: any ExplainSink, maxWrites: Int = ExplainWriter.defaultMaxWrites,
        maxPending: Int = ExplainWriter.defaultMaxPending,
        retryDelays: [Duration] = [.milliseconds(100), .milliseconds(500)], logger: Logger,
        dropped: @escaping @Sendable (Int) -> Void
    ) {
        self.sink = sink
        self.maxWrites = max(1, maxWrites)
        self.maxPending = maxPending
        self.retryDelays = retryDelays
        self.logger = logger
        self.dropped = dropped
    }

    /// Hands `entries` over; returns at once.
    public func submit(_ entries: [ExplainEntry]) {
        if entries.isEmpty { return }
        enum Next {
            case write
            case queued
            case drop
        }
        let next = state.withLock { s -> Next in
            if s.writes < maxWrites {
                s.writes += 1
                return .write
            }
            guard s.pending.count + entries.count <= maxPending else { return .drop }
            s.pending += entries
            return .queued
        }
        switch next {
        case .write: Task { await self.run(entries) }
        case .queued: break
        case .drop: dropped(entries.count)
        }
    }

    /// Writes and entries waiting for a write (for tests and shutdown checks).
    public var backlog: (writes: Int, pending: Int) { state.withLock { ($0.writes, $0.pending.count) } }

    /// Writes `first`, then whatever waits, until nothing does.
    private func run(_ first: [ExplainEntry]) async {
        var entries = first
        while true {
            await write(entries)
            let more = state.withLock { s -> [ExplainEntry]? in
                if s.pending.isEmpty {
                    s.writes -= 1
                    return nil
                }
                defer { s.pending = [] }
                return s.pending
            }
            guard let more else { return }
            entries = more
        }
    }

    private func write(_ entries: [ExplainEntry]) async {
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
