import Foundation
import Synchronization

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

    private let state = Mutex(State())

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

    /// The probe's answer, or false once `timeout` has passed, whichever comes first.
    ///
    /// The caller is resumed by whichever comes first and never waits for the other: a probe that ignores
    /// cancellation (a Redis PING waits on the connection's own thread) keeps running in a task of its own, is
    /// cancelled, and its late answer is dropped. A task group would not do: it waits for every child before it
    /// returns, so the timeout would only be as good as the probe's cooperation.
    /// `otherwise` is the answer once `timeout` has passed (false: a probe that does not answer in time fails).
    static func withTimeout(_ timeout: Duration, otherwise: Bool = false, _ probe: @escaping Probe) async -> Bool {
        let answer = FirstAnswer()
        let probing = Task { answer.resolve(await probe()) }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            answer.resolve(otherwise)
        }
        let passed = await answer.value()
        probing.cancel()
        timer.cancel()
        return passed
    }
}

/// The first of several answers: `value()` returns it as soon as one is resolved; later ones are ignored.
private final class FirstAnswer: Sendable {
    private enum State {
        case open(waiting: CheckedContinuation<Bool, Never>?)
        case answered(Bool)
    }

    private let state = Mutex(State.open(waiting: nil))

    func resolve(_ value: Bool) {
        let waiting = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard case .open(let waiting) = state else { return nil }
            state = .answered(value)
            return waiting
        }
        waiting?.resume(returning: value)
    }

    func value() async -> Bool {
        await withCheckedContinuation { continuation in
            let early = state.withLock { state -> Bool? in
                switch state {
                case .answered(let value): return value
                case .open: state = .open(waiting: continuation); return nil
                }
            }
            if let early { continuation.resume(returning: early) }
        }
    }
}

/// A readiness probe answered from a cache: the probe runs at most once per `maxAge`, and requests that arrive
/// while it runs share that run instead of starting their own. `/readyz` and `/metrics` then cost the dependency
/// nothing per request, however often they are scraped.
///
/// A request never waits long for a refresh: once the answer is older than `maxAge`, a request starts a new run and
/// waits for it at most `grace`; a slower run (a broker probe makes a client, connects and asks for metadata: up to
/// a second on a busy host) leaves the request with the last answer, and the next request gets the new one. A run
/// still going after `patience` (`maxAge` by default) is waited for again, so a dependency that hangs fails the
/// caller's timeout.
public final class CachedProbe: Sendable {
    private struct State: Sendable {
        var last: (at: ContinuousClock.Instant, up: Bool)?
        var running: (since: ContinuousClock.Instant, task: Task<Bool, Never>)?
    }

    public let maxAge: Duration
    public let grace: Duration
    public let patience: Duration
    private let probe: ReadinessChecks.Probe
    private let state = Mutex(State())

    /// The interval of Herald's own cached probes (`kafka`, `redis`).
    public static let defaultMaxAge = Duration.seconds(5)
    /// How long a request waits for a refresh before it takes the last answer.
    public static let defaultGrace = Duration.milliseconds(50)

    public init(
        maxAge: Duration = defaultMaxAge, grace: Duration = defaultGrace, patience: Duration? = nil,
        probe: @escaping ReadinessChecks.Probe
    ) {
        self.maxAge = maxAge
        self.grace = grace
        self.patience = patience ?? maxAge
        self.probe = probe
    }

    /// The last answer while it is younger than `maxAge`; else a fresh one, or the last one when the fresh one takes
    /// longer than `grace`.
    public func isUp() async -> Bool {
        enum Next {
            case cached(Bool)
            case wait(Task<Bool, Never>)
            case waitBriefly(Task<Bool, Never>, otherwise: Bool)
        }
        let next = state.withLock { s -> Next in
            let now = ContinuousClock.now
            if let last = s.last, now - last.at < maxAge { return .cached(last.up) }
            let run: (since: ContinuousClock.Instant, task: Task<Bool, Never>)
            if let running = s.running {
                run = running
            } else {
                run = (
                    now,
                    Task { [self] in
                        let up = await self.probe()
                        self.state.withLock {
                            $0.last = (ContinuousClock.now, up)
                            $0.running = nil
                        }
                        return up
                    }
                )
                s.running = run
            }
            guard let last = s.last, now - run.since < patience else { return .wait(run.task) }
            return .waitBriefly(run.task, otherwise: last.up)
        }
        switch next {
        case .cached(let up): return up
        case .wait(let run): return await run.value
        case .waitBriefly(let run, let otherwise):
            return await ReadinessChecks.withTimeout(grace, otherwise: otherwise) { await run.value }
        }
    }
}
