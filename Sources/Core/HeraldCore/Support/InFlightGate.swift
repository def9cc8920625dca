import Foundation
import Synchronization

/// Bounds the requests a client accepted and has not completed (the APNs and FCM clients' `maxInFlight`, the HTTP/1.1
/// client's); `acquire` suspends the caller when full. A share of the slots (`reserve`) is kept for prioritized
/// callers, who are also served first.
public final class InFlightGate: Sendable {
    /// The free slots and the callers waiting for some.
    private struct Slots {
        var available: Int
        var waiters: [(Int, CheckedContinuation<Int, Never>)] = []
        var priorityWaiters: [(Int, CheckedContinuation<Int, Never>)] = []
    }
    private let slots: Mutex<Slots>
    /// Slots only prioritized callers may take.
    private let reserve: Int

    private let batch: Int

    public init(limit: Int, reserve: Int = 0) {
        slots = Mutex(Slots(available: limit))
        self.reserve = min(max(0, reserve), limit - 1)
        batch = max(1, limit / 8)
    }

    /// Slots a caller may take now (with the lock held): prioritized callers all that are free, others all but the
    /// reserve; nobody overtakes a waiter of its own kind, and others wait while a prioritized caller waits.
    private func grantable(_ wanted: Int, prioritized: Bool, in slots: Slots) -> Int {
        if prioritized {
            guard slots.priorityWaiters.isEmpty else { return 0 }
            return max(0, min(wanted, slots.available))
        }
        guard slots.waiters.isEmpty, slots.priorityWaiters.isEmpty else { return 0 }
        return max(0, min(wanted, slots.available - reserve))
    }

    /// Waits until at least one slot is free, then takes up to `wanted` slots; returns how many.
    public func acquire(upTo wanted: Int, prioritized: Bool = false) async -> Int {
        let granted: Int = slots.withLock { slots in
            let n = grantable(wanted, prioritized: prioritized, in: slots)
            slots.available -= n
            return n
        }
        if granted > 0 { return granted }
        return await withCheckedContinuation { c in
            let now: Int = slots.withLock { slots in
                let n = grantable(wanted, prioritized: prioritized, in: slots)
                if n > 0 {
                    slots.available -= n
                    return n
                }
                if prioritized { slots.priorityWaiters.append((wanted, c)) } else { slots.waiters.append((wanted, c)) }
                return 0
            }
            if now > 0 { c.resume(returning: now) }
        }
    }

    /// Frees `n` slots and wakes the waiters they serve.
    public func release(_ n: Int) {
        let ready = slots.withLock { slots -> [(CheckedContinuation<Int, Never>, Int)] in
            slots.available += n
            var ready: [(CheckedContinuation<Int, Never>, Int)] = []
            // Prioritized waiters first, as soon as a slot is free.
            while !slots.priorityWaiters.isEmpty, slots.available > 0 {
                let (wanted, c) = slots.priorityWaiters.removeFirst()
                let granted = min(wanted, slots.available)
                slots.available -= granted
                ready.append((c, granted))
            }
            // Wake another waiter only when a useful batch is free beyond the reserve, not for every completion.
            while slots.priorityWaiters.isEmpty, let first = slots.waiters.first,
                slots.available - reserve >= min(first.0, batch)
            {
                let (wanted, c) = slots.waiters.removeFirst()
                let granted = min(wanted, slots.available - reserve)
                slots.available -= granted
                ready.append((c, granted))
            }
            return ready
        }
        for (c, n) in ready { c.resume(returning: n) }
    }
}
