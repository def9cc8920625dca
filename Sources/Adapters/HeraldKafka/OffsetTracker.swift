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
    /// Delivered, not yet retired offsets in increasing order, with the number of their parts not yet complete
    /// (a packed record, `RecordPack`, is handed out as several parts; any other record is one).
    private var offsets: Deque<Int64> = []
    private var left: Deque<Int32> = []
    /// The offset that may be stored (committed); `nil` until a record was retired.
    public private(set) var committable: Int64?

    public init() {}

    /// Records delivered but not yet retired (pending or completed out of order).
    public var outstanding: Int { offsets.count }

    /// The oldest delivered offset not retired yet (where a commit now would point), nil when all are retired.
    public var oldestPending: Int64? { offsets.first }

    /// Registers a delivered record handed out as `parts` parts. Offsets at or below the last delivered one are
    /// ignored (a redelivery within the same assignment does not happen in librdkafka).
    public mutating func delivered(_ offset: Int64, parts: Int = 1) {
        if let last = offsets.last, offset <= last { return }
        if offsets.isEmpty, let committable, offset < committable { return }
        offsets.append(offset)
        left.append(Int32(clamping: max(1, parts)))
    }

    /// Marks `parts` parts (one by default) of a delivered record complete; the record is complete with its last
    /// part. Returns the new committable offset when it advanced, `nil` otherwise (also for offsets never delivered
    /// or already retired).
    @discardableResult
    public mutating func complete(_ offset: Int64, parts: Int = 1) -> Int64? {
        guard parts > 0, let index = find(offset), left[index] > 0 else { return nil }
        left[index] -= Int32(clamping: min(parts, Int(left[index])))
        guard index == 0, left[index] == 0 else { return nil }
        var retired = offset
        while let first = left.first, first == 0 {
            retired = offsets.removeFirst()
            left.removeFirst()
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
