import Foundation

extension Date {
    /// Whole milliseconds since 1970-01-01 UTC, rounded down: the time every rule, record and explain entry holds.
    public var millisecondsSince1970: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }
}
