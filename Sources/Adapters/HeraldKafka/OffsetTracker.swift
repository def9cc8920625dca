import DequeModule

/// Tracks, for one partition, which delivered records the caller has completed and
/// the low-water mark up to which offsets may be committed.
///
/// Records are delivered in increasing offset order (offsets may have gaps, e.g. on
/// compacted topics or around transaction markers), but completions arrive in any
/// order. The committable offset is the offset of the oldest delivered record that is
/// not complete yet, or one past the newest delivered record when all are complete:
/// Kafka's committed offset means "the next record to read".
public struct PartitionOffsetTracker: Sendable, Hashable {
    /// Delivered, not yet retired offsets in increasing order, with their completion flag.
    private var offsets: Deque<Int64> = []
    private var done: Deque<Bool> = []
    /// The offset that may be stored (committed); `nil` until a record was retired.
    public private(set) var committable: Int64?

    public init() {}

    /// Records delivered but not yet retired (pending or completed out of order).
    public var outstanding: Int { offsets.count }

    /// Registers a delivered record. Offsets at or below the last delivered one are
    /// ignored (a redelivery within the same assignment does not happen in librdkafka).
    public mutating func delivered(_ offset: Int64) {
        if let last = offsets.last, offset <= last { return }
        if offsets.isEmpty, let committable, offset < committable { return }
        offsets.append(offset)
        done.append(false)
    }

    /// Marks a delivered record complete. Returns the new committable offset when it
    /// advanced, `nil` otherwise (also for offsets never delivered or already retired).
    @discardableResult
    public mutating func complete(_ offset: Int64) -> Int64? {
        guard let index = find(offset), !done[index] else { return nil }
        done[index] = true
        guard index == 0 else { return nil }
        var retired = offset
        while let first = done.first, first {
            retired = offsets.removeFirst()
            done.removeFirst()
        }
        // The next committable offset is the oldest still pending, or one past the last retired.
        committable = offsets.first ?? retired + 1
        return committable
    }

    private func find(_ offset: Int64) -> Int? {
        var low = 0
        var high = offsets.count - 1
        while low <= high {
            let mid = (low + high) / 2
            if offsets[mid] == offset { return mid }
            if offsets[mid] < offset { low = mid + 1 } else { high = mid - 1 }
        }
        return nil
    }
}
