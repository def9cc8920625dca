// Waiting for a signal, written once. Threads that serve a C library (the Kafka producer's poll thread) and tasks
// (a token renewal, a shutdown) hand news to waiting tasks through continuations; nothing polls a flag with a sleep
// (docs/architecture.md, "Concurrency").

import Synchronization

/// Tasks waiting until a condition another thread or task makes true, each with its own deadline.
///
/// The waker changes its state first and then calls `wakeAll()`. A waiter hands `wait` a check of that state,
/// which runs under the list's lock before the waiter parks, so a wake-up between the check and the wait is never
/// lost. Cancelling a waiting task ends its wait (it returns false).
public final class WaitList: Sendable {
    private enum Entry {
        case waiting(CheckedContinuation<Bool, Never>)
        /// The deadline passed (or the task was cancelled) before the waiter parked: it returns at once.
        case gaveUp
    }

    private struct State {
        var nextID: UInt64 = 0
        var entries: [UInt64: Entry] = [:]
    }

    private let state = Mutex(State())

    public init() {}

    /// True when no task is parked here (a waker may skip work nobody waits for).
    public var isEmpty: Bool {
        state.withLock { s in
            !s.entries.values.contains { if case .waiting = $0 { return true } else { return false } }
        }
    }

    /// Returns true at once when `ready()` holds, else waits for `wakeAll()` (true) or `timeout` (false).
    /// `ready` runs under the list's lock: keep it short and never call back into this list from it.
    public func wait(timeout: Duration, unlessAlready ready: @escaping @Sendable () -> Bool) async -> Bool {
        let id = state.withLock { s -> UInt64 in
            s.nextID &+= 1
            return s.nextID
        }
        defer { state.withLock { _ = $0.entries.removeValue(forKey: id) } }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                    let now = self.state.withLock { s -> Bool? in
                        if case .gaveUp = s.entries[id] { return false }
                        if ready() { return true }
                        s.entries[id] = .waiting(continuation)
                        return nil
                    }
                    if let now { continuation.resume(returning: now) }
                }
            }
            group.addTask {
                // Ends at the deadline, or when cancelled (the waiter was woken first, or the caller was cancelled).
                try? await Task.sleep(for: timeout)
                self.giveUp(id)
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }

    /// Wakes every parked waiter (their `wait` returns true).
    public func wakeAll() {
        let woken = state.withLock { s -> [CheckedContinuation<Bool, Never>] in
            var woken: [CheckedContinuation<Bool, Never>] = []
            for (id, entry) in s.entries {
                if case .waiting(let c) = entry {
                    woken.append(c)
                    s.entries[id] = nil
                }
            }
            return woken
        }
        woken.forEach { $0.resume(returning: true) }
    }

    private func giveUp(_ id: UInt64) {
        let parked = state.withLock { s -> CheckedContinuation<Bool, Never>? in
            switch s.entries[id] {
            case .waiting(let c):
                s.entries[id] = nil
                return c
            case .gaveUp:
                return nil
            case nil:
                s.entries[id] = .gaveUp
                return nil
            }
        }
        parked?.resume(returning: false)
    }
}

/// A one-way stop flag that sleepers wait on: `stop()` wakes every `sleep(for:)` at once.
public final class StopSignal: Sendable {
    private let stopped = Mutex(false)
    private let sleepers = WaitList()

    public init() {}

    public var isStopped: Bool { stopped.withLock { $0 } }

    /// Sets the flag and wakes every sleeper.
    public func stop() {
        stopped.withLock { $0 = true }
        sleepers.wakeAll()
    }

    /// Waits up to `duration`, less when `stop()` is called or the task is cancelled. Returns false once stopped.
    public func sleep(for duration: Duration) async -> Bool {
        _ = await sleepers.wait(timeout: duration, unlessAlready: { self.isStopped })
        return !isStopped
    }
}
