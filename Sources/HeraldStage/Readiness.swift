import Foundation

/// The named checks behind `/readyz`: the stage is ready only when every registered check passes.
///
/// A check is either an async probe (`register(_:timeout:check:)`, e.g. a Redis PING) evaluated on every request
/// with a timeout, or a flag the component sets itself (`set(_:ready:)`, e.g. "broker connected" from the consumer's
/// rebalance callback). Once shutdown begins (`beginShutdown()`), `/readyz` fails with `shutting_down` so load
/// balancers and orchestrators stop sending work while in-flight work drains.
public final class ReadinessChecks: Sendable {
    public typealias Probe = @Sendable () async -> Bool

    private struct Entry: Sendable {
        var probe: Probe?
        var flag: Bool
        var timeout: Duration
    }

    private struct State: Sendable {
        var entries: [String: Entry] = [:]
        var shuttingDown = false
    }

    private let state = Locked(State())

    public init() {}

    /// Registers (or replaces) an async probe. A probe that does not answer within `timeout` counts as failing.
    public func register(_ name: String, timeout: Duration = .seconds(1), check: @escaping Probe) {
        state.withLock { $0.entries[name] = Entry(probe: check, flag: false, timeout: timeout) }
    }

    /// Sets a flag check (registering it on first use).
    public func set(_ name: String, ready: Bool) {
        state.withLock { $0.entries[name] = Entry(probe: nil, flag: ready, timeout: .zero) }
    }

    /// Removes a check.
    public func remove(_ name: String) {
        state.withLock { _ = $0.entries.removeValue(forKey: name) }
    }

    /// Marks the process as shutting down: `/readyz` answers 503 from now on.
    public func beginShutdown() {
        state.withLock { $0.shuttingDown = true }
    }

    public var isShuttingDown: Bool { state.withLock { $0.shuttingDown } }

    /// The outcome of every check.
    public struct Report: Sendable, Equatable {
        /// Check name -> passed.
        public var checks: [String: Bool]
        public var shuttingDown: Bool

        public var isReady: Bool { !shuttingDown && checks.values.allSatisfy { $0 } }
        /// The failing check names, sorted (plus `shutting_down` while shutting down).
        public var failing: [String] {
            checks.filter { !$0.value }.map(\.key).sorted() + (shuttingDown ? ["shutting_down"] : [])
        }
    }

    /// Evaluates every check concurrently.
    public func evaluate() async -> Report {
        let (entries, shuttingDown) = state.withLock { ($0.entries, $0.shuttingDown) }
        var results: [String: Bool] = [:]
        await withTaskGroup(of: (String, Bool).self) { group in
            for (name, entry) in entries {
                guard let probe = entry.probe else {
                    results[name] = entry.flag
                    continue
                }
                group.addTask {
                    (name, await Self.withTimeout(entry.timeout, probe))
                }
            }
            for await (name, passed) in group {
                results[name] = passed
            }
        }
        return Report(checks: results, shuttingDown: shuttingDown)
    }

    private static func withTimeout(_ timeout: Duration, _ probe: @escaping Probe) async -> Bool {
        await withTaskGroup(of: Bool?.self) { group in
            group.addTask { await probe() }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first ?? false
        }
    }
}
