// Waiting on conditions instead of sleeping and hoping.
import Foundation
import HeraldCore
import Synchronization

/// Checks `condition` every `interval` until it holds or `timeout` passed; returns whether it held.
public func eventually(
    timeout: Duration, interval: Duration = .milliseconds(50),
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while true {
        if try await condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        try? await Task.sleep(for: interval)
    }
}

/// `eventually`, throwing a failure that names `what` when the condition did not hold in time.
/// The default bound is generous on purpose: it only ends a test that has failed, and a suite starting all at once
/// on a 2-core host can hold a stage's work up for tens of seconds.
public func waitUntil(
    _ what: @autoclosure () -> String, timeout: Duration = .seconds(60),
    interval: Duration = .milliseconds(50), _ condition: () async throws -> Bool
) async throws {
    guard try await eventually(timeout: timeout, interval: interval, condition) else {
        throw TestSupportError("timed out after \(timeout): \(what())")
    }
}

/// The blocking form, for set-up code that runs outside async contexts (waiting for a child process's port).
public func eventuallyBlocking(
    timeout: Duration, interval: Duration = .milliseconds(20), _ condition: () -> Bool
) -> Bool {
    let deadline = ContinuousClock.now + timeout
    while true {
        if condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        usleep(UInt32(interval.microseconds))
    }
}

/// A wait that ignores task cancellation (like a call blocked in C) and ends only when `open()` is called,
/// before or after the wait began.
public final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    public init() {}

    /// Whether `open()` was called.
    public var isOpen: Bool { state.withLock { $0.open } }

    public func wait() async {
        await withCheckedContinuation { continuation in
            let isOpen = state.withLock { state -> Bool in
                if state.open { return true }
                state.waiting.append(continuation)
                return false
            }
            if isOpen { continuation.resume() }
        }
    }

    public func open() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}
