import Synchronization

/// Counts completions down from `n`, from any thread: a batch's caller finishes its stream or resumes its
/// continuation on the last one.
public final class Countdown: Sendable {
    private let left: Mutex<Int>

    public init(_ n: Int) { left = Mutex(n) }

    /// Counts one completion; true on the last.
    public func tick() -> Bool {
        left.withLock { left in
            left -= 1
            return left == 0
        }
    }
}
