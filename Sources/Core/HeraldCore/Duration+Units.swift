import Foundation

/// The one place a `Duration` becomes a plain number (for C APIs, wire fields, log fields and Foundation).
extension Duration {
    /// Whole milliseconds, rounded toward zero; a negative duration gives 0 (every caller passes a timeout, delay
    /// or interval, where less than nothing means nothing).
    public var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return max(0, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }

    /// Whole microseconds, rounded toward zero; a negative duration gives 0 (see `milliseconds`).
    public var microseconds: Int64 {
        let (seconds, attoseconds) = components
        return max(0, seconds * 1_000_000 + attoseconds / 1_000_000_000_000)
    }

    /// Seconds as a floating-point number, for Foundation (`Thread.sleep(forTimeInterval:)`) and rates.
    public var timeInterval: TimeInterval {
        let (seconds, attoseconds) = components
        return TimeInterval(seconds) + TimeInterval(attoseconds) / 1e18
    }
}
