import Foundation

/// Bounds the requests a client accepted and has not completed (the APNs and FCM clients' `maxInFlight`, the HTTP/1.1
/// client's); `acquire` suspends the caller when full. A share of the slots (`reserve`) is kept for prioritized
/// callers, who are also served first.
public final class InFlightGate: @unchecked Sendable {
    // @unchecked Sendable: all state is guarded by `lock`.
    private let lock = NSLock()
    private var available: Int
    /// Slots only prioritized callers may take.
    private let reserve: Int
    private var waiters: [(Int, CheckedContinuation<Int, Never>)] = []
    private var priorityWaiters: [(Int, CheckedContinuation<Int, Never>)] = []

    private let batch: Int

    public init(limit: Int, reserve: Int = 0) {
        available = limit
        self.reserve = min(max(0, reserve), limit - 1)
        batch = max(1, limit / 8)
    }

    /// Slots a caller may take now (under `lock`): prioritized callers all that are free, others all but the
    /// reserve; nobody overtakes a waiter of its own kind, and others wait while a prioritized caller waits.
    private func grantable(_ wanted: Int, prioritized: Bool) -> Int {
        if prioritized {
            guard priorityWaiters.isEmpty else { return 0 }
            return max(0, min(wanted, available))
        }
        guard waiters.isEmpty, priorityWaiters.isEmpty else { return 0 }
        return max(0, min(wanted, available - reserve))
    }

    /// Waits until at least one slot is free, then takes up to `wanted` slots; returns how many.
    public func acquire(upTo wanted: Int, prioritized: Bool = false) async -> Int {
        let granted: Int = lock.withLock {
            let n = grantable(wanted, prioritized: prioritized)
            available -= n
            return n
        }
        if granted > 0 { return granted }
        return await withCheckedContinuation { c in
            let now: Int = lock.withLock {
                let n = grantable(wanted, prioritized: prioritized)
                if n > 0 {
                    available -= n
                    return n
                }
                if prioritized { priorityWaiters.append((wanted, c)) } else { waiters.append((wanted, c)) }
                return 0
            }
            if now > 0 { c.resume(returning: now) }
        }
    }

    /// Frees `n` slots and wakes the waiters they serve.
    public func release(_ n: Int) {
        lock.lock()
        available += n
        var ready: [(CheckedContinuation<Int, Never>, Int)] = []
        // Prioritized waiters first, as soon as a slot is free.
        while !priorityWaiters.isEmpty, available > 0 {
            let (wanted, c) = priorityWaiters.removeFirst()
            let granted = min(wanted, available)
            available -= granted
            ready.append((c, granted))
        }
        // Wake another waiter only when a useful batch is free beyond the reserve, not for every completion.
        while priorityWaiters.isEmpty, let first = waiters.first, available - reserve >= min(first.0, batch) {
            let (wanted, c) = waiters.removeFirst()
            let granted = min(wanted, available - reserve)
            available -= granted
            ready.append((c, granted))
        }
        lock.unlock()
        for (c, n) in ready { c.resume(returning: n) }
    }
}
