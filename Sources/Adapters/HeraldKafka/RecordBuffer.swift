import CRdKafka

/// The consumer's records fetched and not yet taken, kept as the runs the poll thread appended them in.
///
/// The poll thread copies each record out of librdkafka straight into the newest run while it has room (a run
/// holds at most a batch of records, and a pack's parts are never split between two runs), and the caller takes
/// the oldest run, or the runs that fit together, as its batch: a record is not copied again on its way to the
/// stage. (A copy is a retain of the record's topic, key and value, and a release later: one array for the whole
/// buffer would copy each record to append a poll's records to it and again to cut a batch from its front.)
struct RecordBuffer {
    /// The runs, oldest first, from `head` on (the ones before it were taken).
    private var runs: [[ConsumerRecord]] = []
    private var head = 0
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// Appends a consumed message's record, or a pack's parts, straight from librdkafka's buffer: to the newest
    /// run while they fit in `runLimit` records with it, else as a new run. Returns how many records it added.
    mutating func append(
        copying message: UnsafePointer<rd_kafka_message_t>, topic: String, epoch: UInt64, runLimit: Int,
        unpack: Bool = true
    ) -> Int {
        let m = message.pointee
        let parts =
            unpack
            ? m.payload.map { RecordPack.declaredCount(UnsafeRawBufferPointer(start: $0, count: m.len)) } ?? 1 : 1
        if head == runs.count || runs[runs.count - 1].count + parts > runLimit {
            runs.append([])
        }
        let last = runs.count - 1
        let before = runs[last].count
        ConsumerRecord.append(copying: message, topic: topic, epoch: epoch, unpack: unpack, to: &runs[last])
        let added = runs[last].count - before
        count += added
        return added
    }

    /// Takes up to `n` records (at least one while any remain) from the front: the oldest run as it is when it
    /// fits, the runs that fit together (copied into one batch) when the oldest is small, or the first `n` of a run
    /// larger than `n`.
    mutating func take(_ n: Int) -> [ConsumerRecord] {
        guard count > 0 else { return [] }
        let n = max(1, n)
        let first = runs[head].count
        if first > n {
            let batch = Array(runs[head][..<n])
            runs[head].removeFirst(n)
            count -= n
            return batch
        }
        var end = head + 1
        var total = first
        while end < runs.count, total + runs[end].count <= n {
            total += runs[end].count
            end += 1
        }
        let batch: [ConsumerRecord]
        if end == head + 1 {
            batch = runs[head]
        } else {
            var joined: [ConsumerRecord] = []
            joined.reserveCapacity(total)
            for index in head..<end { joined += runs[index] }
            batch = joined
        }
        for index in head..<end { runs[index] = [] }
        head = end
        count -= total
        if head == runs.count {
            runs.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64 {
            runs.removeFirst(head)
            head = 0
        }
        return batch
    }

    /// Drops the records `drop` says to.
    mutating func removeAll(where drop: (ConsumerRecord) -> Bool) {
        var kept: [[ConsumerRecord]] = []
        var keptCount = 0
        for index in head..<runs.count {
            var run = runs[index]
            run.removeAll(where: drop)
            if !run.isEmpty {
                keptCount += run.count
                kept.append(run)
            }
        }
        runs = kept
        head = 0
        count = keptCount
    }

    mutating func removeAll() {
        runs = []
        head = 0
        count = 0
    }
}
