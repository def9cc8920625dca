import HeraldKafka
import Testing

@Suite("Per-partition low-water mark of completed offsets")
struct OffsetTrackerTests {
    @Test("completing 0, 1 and 3 of 0...3 makes 2 committable")
    func outOfOrderStopsAtFirstGap() {
        var t = PartitionOffsetTracker()
        (0...3).forEach { t.delivered($0) }
        #expect(t.complete(3) == nil)
        #expect(t.committable == nil)
        #expect(t.complete(0) == 1)
        #expect(t.complete(1) == 2)
        #expect(t.committable == 2)
        #expect(t.outstanding == 2)
        #expect(t.complete(2) == 4, "completing the gap retires 3 too")
        #expect(t.outstanding == 0)
    }

    @Test("offset gaps (compaction, transaction markers) do not block the mark")
    func gapsInOffsets() {
        var t = PartitionOffsetTracker()
        [10, 11, 15, 20].forEach { t.delivered($0) }
        #expect(t.complete(10) == 11)
        #expect(t.complete(11) == 15, "next committable is the oldest pending delivered offset")
        #expect(t.complete(20) == nil)
        #expect(t.complete(15) == 21)
    }

    @Test("completing twice, or an offset never delivered, changes nothing")
    func duplicatesAndStrangers() {
        var t = PartitionOffsetTracker()
        [0, 1].forEach { t.delivered($0) }
        #expect(t.complete(0) == 1)
        #expect(t.complete(0) == nil)
        #expect(t.complete(7) == nil)
        #expect(t.committable == 1)
        t.delivered(1)  // redelivery of a known offset is ignored
        #expect(t.outstanding == 1)
    }

    @Test("reverse completion of many offsets retires all at once, storage is compacted")
    func reverseOrderLarge() {
        var t = PartitionOffsetTracker()
        (0..<5000).forEach { t.delivered(Int64($0)) }
        for o in stride(from: 4999, through: 1, by: -1) { #expect(t.complete(Int64(o)) == nil) }
        #expect(t.complete(0) == 5000)
        #expect(t.outstanding == 0)
        t.delivered(5000)
        #expect(t.complete(5000) == 5001)
    }

    @Test("random completion order always yields the smallest pending offset")
    func randomOrderMatchesModel() {
        for _ in 0..<50 {
            var t = PartitionOffsetTracker()
            let offsets = (0..<200).map { Int64($0 * 2) }  // gaps of one
            offsets.forEach { t.delivered($0) }
            var pending = Set(offsets)
            for o in offsets.shuffled() {
                pending.remove(o)
                t.complete(o)
                let expected = pending.min() ?? (offsets.last! + 1)
                if pending.count < offsets.count {
                    // committable is defined once the first record was retired
                    if let c = t.committable { #expect(c == expected) } else { #expect(pending.contains(0)) }
                }
            }
            #expect(t.committable == offsets.last! + 1)
        }
    }
}
