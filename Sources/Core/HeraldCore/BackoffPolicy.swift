import Foundation

/// Exponential backoff with jitter and a bounded number of attempts.
///
/// The delay before attempt `n + 1` (after attempt `n` failed, `n >= 1`) is
/// `min(maxDelay, initialDelay * multiplier^(n-1))`, scaled by a random factor in
/// `[1 - jitter, 1]`. After `maxAttempts` attempts a retryable answer becomes a permanent failure.
public struct BackoffPolicy: Sendable, Equatable {
    public var initialDelay: Duration
    public var maxDelay: Duration
    public var multiplier: Double
    /// Fraction of the delay that is randomised, in [0, 1].
    public var jitter: Double
    /// Attempts in total, the first one included.
    public var maxAttempts: Int

    public init(
        initialDelay: Duration = .milliseconds(250), maxDelay: Duration = .seconds(30),
        multiplier: Double = 2, jitter: Double = 0.5, maxAttempts: Int = 5
    ) {
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.multiplier = max(1, multiplier)
        self.jitter = min(1, max(0, jitter))
        self.maxAttempts = max(1, maxAttempts)
    }

    /// The delay after attempt `attempt` failed; `unit` is a random number in [0, 1).
    public func delay(afterAttempt attempt: Int, unit: Double) -> Duration {
        let exponent = Double(attempt > 1 ? attempt - 1 : 0)
        let initial = initialDelay.timeInterval
        let capped = min(maxDelay.timeInterval, initial * pow(multiplier, min(exponent, 60)))
        let factor = 1 - jitter * min(1, max(0, unit))
        // Saturates: a maximum delay set beyond Int64 nanoseconds (about 292 years) waits that long, never traps.
        let nanoseconds = (capped * factor * 1e9).rounded()
        return .nanoseconds(nanoseconds < 9.2e18 ? Int64(max(0, nanoseconds)) : Int64.max)
    }

    public func delay(afterAttempt attempt: Int, using rng: inout some RandomNumberGenerator) -> Duration {
        delay(afterAttempt: attempt, unit: Double.random(in: 0..<1, using: &rng))
    }
}
