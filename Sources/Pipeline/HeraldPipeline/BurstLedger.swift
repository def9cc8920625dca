import Foundation
import HeraldCore
import Synchronization

/// Where suppress keeps bursts (Redis in the stage, `MemoryBurstLedger` in tests and previews;
/// docs/behaviour.md §6a).
public protocol BurstLedger: Sendable {
    /// The step of each message, in order; one round trip for the whole list.
    func step(_ messages: [BurstMessage]) async throws -> [BurstStep]
    /// The held bursts of `app` whose flush is due at `now`, each taken for a lease (another process may take it
    /// again once the lease passes without a confirmation); ended bursts are forgotten.
    func claimDue(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst]
    /// Records the flushes as shown, once their records were produced.
    func confirm(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws
}

/// Bursts and flood guards kept in memory, with the rules of `Coalescing` and `FloodGuard` (the Redis scripts do the
/// same).
public final class MemoryBurstLedger: BurstLedger {
    private let bursts = Mutex<[Key: Entry]>([:])

    struct Key: Hashable {
        var app: String
        var user: String
        var conversation: String
    }

    struct Entry {
        var state: BurstState
        var lane: Lane
        var record: [UInt8]
        /// The context of the latest traced message held since the burst last showed (nil: none traced).
        var trace: HeldTrace?
        /// When the flush timer looks at it next; a claimed flush's lease.
        var due: Int64
    }

    public init() {}

    public func step(_ messages: [BurstMessage]) async throws -> [BurstStep] {
        bursts.withLock { bursts in
            messages.map { m in
                let key = Key(app: m.appID, user: m.user, conversation: m.conversation)
                let previous = bursts[key]
                let flood = m.conversation.isEmpty
                let timing = flood ? FloodGuard.timing : m.policy
                let (step, state) =
                    flood
                    ? FloodGuard.step(previous?.state, at: m.at, policy: m.flood)
                    : Coalescing.step(previous?.state, at: m.at, policy: m.policy)
                var entry = previous ?? Entry(state: state, lane: m.lane, record: [], due: 0)
                entry.state = state
                if case .held = step {
                    entry.lane = m.lane
                    entry.record = m.record
                    // The latest traced message wins; an untraced one keeps the context held before it.
                    if let trace = m.trace {
                        entry.trace = trace
                    } else if previous?.state.pending != true {
                        entry.trace = nil
                    }
                    if previous?.state.pending == true { bursts[key] = entry; return step }
                } else {
                    entry.record = []
                    entry.trace = nil
                }
                entry.due = Coalescing.due(state, policy: timing)
                bursts[key] = entry
                return step
            }
        }
    }

    public func claimDue(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        bursts.withLock { bursts in
            var out: [HeldBurst] = []
            for (key, entry) in bursts where key.app == app && entry.due <= now {
                let timing = key.conversation.isEmpty ? FloodGuard.timing : policy
                switch Coalescing.flush(entry.state, now: now, policy: timing) {
                case .show(let count):
                    out.append(
                        HeldBurst(
                            user: key.user, conversation: key.conversation, count: count, lane: entry.lane,
                            record: entry.record, trace: entry.trace))
                    bursts[key]?.due = now + 10_000
                case .end:
                    bursts[key] = nil
                case .wait:
                    bursts[key]?.due = Coalescing.due(entry.state, policy: timing)
                }
            }
            return out.sorted { ($0.user, $0.conversation) < ($1.user, $1.conversation) }
        }
    }

    public func confirm(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        bursts.withLock { bursts in
            for b in flushed {
                let key = Key(app: app, user: b.user, conversation: b.conversation)
                guard var entry = bursts[key] else { continue }
                let before = entry.state
                let flood = key.conversation.isEmpty
                entry.state =
                    flood
                    ? FloodGuard.flushed(before, count: b.count, now: now)
                    : Coalescing.flushed(before, count: b.count, now: now)
                if entry.state == before { continue }
                if !entry.state.pending {
                    entry.record = []
                    entry.trace = nil
                }
                entry.due = Coalescing.due(entry.state, policy: flood ? FloodGuard.timing : policy)
                bursts[key] = entry
            }
        }
    }
}
