import CRdKafka

/// Several records bound for one partition, carried as one Kafka record (docs/kafka.md, "Packed records").
///
/// Between stages most of the cost of a notification was per Kafka record: librdkafka's per-message work in the
/// producer and the consumer, the delivery report, the offset bookkeeping, and the broker's per-record work. The
/// producer therefore packs the records of one `enqueue` call that go to the same partition of a packed topic into
/// one Kafka record, and the consumer hands the parts out as records of their own. Each part keeps its key and
/// value, and goes to the partition its own key would have chosen, so per-key order is what it was unpacked.
///
/// Layout: `00 50 01` (magic and version), the part count as a varint, then per part the key's length + 1 (0 for
/// no key) and the key, the value's length + 1 (0 for a tombstone) and the value, lengths as varints. A record
/// that does not start with the magic, or does not parse to the last byte, is an ordinary record.
public enum RecordPack {
    static let magic: [UInt8] = [0x00, 0x50, 0x01]

    /// One part: a key and a value as the producer was given them.
    public struct Part: Sendable, Hashable {
        public var key: [UInt8]?
        public var value: [UInt8]?
        public init(key: [UInt8]?, value: [UInt8]?) {
            self.key = key
            self.value = value
        }
    }

    /// The bytes a part adds to a pack (lengths included).
    static func size(key: [UInt8]?, value: [UInt8]?) -> Int { size(keyCount: key?.count, value: value) }

    /// The bytes a part with a key of `keyCount` bytes (nil: no key) adds to a pack.
    static func size(keyCount: Int?, value: [UInt8]?) -> Int {
        let k = keyCount ?? -1
        let v = value?.count ?? -1
        return varintSize(UInt64(k + 1)) + max(0, k) + varintSize(UInt64(v + 1)) + max(0, v)
    }

    /// Encodes `parts` (at least one).
    public static func encode(_ parts: [Part]) -> [UInt8] {
        encode(count: parts.count, size: parts.reduce(0) { $0 + size(key: $1.key, value: $1.value) }) { bytes in
            for part in parts {
                appendBytes(part.key, to: &bytes)
                appendBytes(part.value, to: &bytes)
            }
        }
    }

    /// Encodes the keys and values of `records` at `members` (at least one), read in place.
    static func encode(_ records: [ProducerRecord], members: [Int]) -> [UInt8] {
        let total = members.reduce(0) { $0 + size(keyCount: records[$1].keyCount, value: records[$1].value) }
        return encode(count: members.count, size: total) { bytes in
            for member in members {
                records[member].withKeyBytes { appendBytes($0, to: &bytes) }
                appendBytes(records[member].value, to: &bytes)
            }
        }
    }

    private static func encode(count: Int, size: Int, _ appendParts: (inout [UInt8]) -> Void) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(magic.count + 5 + size)
        bytes += magic
        appendVarint(UInt64(count), to: &bytes)
        appendParts(&bytes)
        return bytes
    }

    /// The parts of a pack, or nil when `bytes` is not one (an ordinary record).
    public static func decode(_ bytes: UnsafeRawBufferPointer) -> [Part]? {
        var parts: [Part] = []
        let read = forEachPart(bytes) { index, count, key, value in
            if index == 0 { parts.reserveCapacity(count) }
            parts.append(Part(key: key, value: value))
        }
        return read ? parts : nil
    }

    /// Calls `body` with each part of a pack (its index, the part count, its key and value), and returns true;
    /// false, without calling it, when `bytes` is not a pack. The whole pack is checked before the first part.
    static func forEachPart(
        _ bytes: UnsafeRawBufferPointer, _ body: (Int, Int, [UInt8]?, [UInt8]?) -> Void
    ) -> Bool {
        guard bytes.count >= magic.count + 1, bytes[0] == magic[0], bytes[1] == magic[1], bytes[2] == magic[2] else {
            return false
        }
        var index = magic.count
        guard let count = readVarint(bytes, &index), count > 0, count <= UInt64(bytes.count) else { return false }
        let first = index
        for _ in 0..<count {
            guard skipBytes(bytes, &index), skipBytes(bytes, &index) else { return false }
        }
        guard index == bytes.count else { return false }
        index = first
        for part in 0..<Int(count) {
            // Checked above: neither read fails.
            guard let key = readBytes(bytes, &index), let value = readBytes(bytes, &index) else { return false }
            body(part, Int(count), key, value)
        }
        return true
    }

    /// The part count a pack's header gives (1 for bytes that do not start as a pack do), without checking the
    /// parts: for sizing only.
    static func declaredCount(_ bytes: UnsafeRawBufferPointer) -> Int {
        guard bytes.count >= magic.count + 1, bytes[0] == magic[0], bytes[1] == magic[1], bytes[2] == magic[2] else {
            return 1
        }
        var index = magic.count
        guard let count = readVarint(bytes, &index), count > 0, count <= UInt64(bytes.count) else { return 1 }
        return Int(count)
    }

    /// The parts of a pack, or nil when `bytes` is not one.
    public static func decode(_ bytes: [UInt8]) -> [Part]? {
        bytes.withUnsafeBytes { decode($0) }
    }

    /// The partition librdkafka's default partitioner (`consistent_random`) picks for a non-empty `key` among
    /// `partitions` partitions: the producer packs only records whose partition it knows this way.
    static func partition(key: [UInt8], partitions: Int32) -> Int32 {
        key.withUnsafeBytes { partition(key: $0, partitions: partitions) }
    }

    static func partition(key: UnsafeRawBufferPointer, partitions: Int32) -> Int32 {
        rd_kafka_msg_partitioner_consistent_random(nil, key.baseAddress, key.count, partitions, nil, nil)
    }

    // MARK: Varints and length-prefixed bytes

    static func varintSize(_ value: UInt64) -> Int {
        var v = value
        var n = 1
        while v >= 0x80 {
            v >>= 7
            n += 1
        }
        return n
    }

    static func appendVarint(_ value: UInt64, to bytes: inout [UInt8]) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    private static func appendBytes(_ part: [UInt8]?, to bytes: inout [UInt8]) {
        guard let part else {
            bytes.append(0)
            return
        }
        appendVarint(UInt64(part.count) + 1, to: &bytes)
        bytes += part
    }

    private static func appendBytes(_ part: UnsafeRawBufferPointer?, to bytes: inout [UInt8]) {
        guard let part else {
            bytes.append(0)
            return
        }
        appendVarint(UInt64(part.count) + 1, to: &bytes)
        bytes.append(contentsOf: part)
    }

    static func readVarint(_ bytes: UnsafeRawBufferPointer, _ index: inout Int) -> UInt64? {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while index < bytes.count, shift < 64 {
            let byte = bytes[index]
            index += 1
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
        }
        return nil
    }

    /// Steps over one length-prefixed value; false when it does not fit.
    private static func skipBytes(_ bytes: UnsafeRawBufferPointer, _ index: inout Int) -> Bool {
        guard let prefixed = readVarint(bytes, &index) else { return false }
        guard prefixed > 0 else { return true }
        guard prefixed - 1 <= UInt64(bytes.count - index) else { return false }
        index += Int(prefixed - 1)
        return true
    }

    private static func readBytes(_ bytes: UnsafeRawBufferPointer, _ index: inout Int) -> [UInt8]?? {
        guard let prefixed = readVarint(bytes, &index) else { return nil }
        if prefixed == 0 { return .some(nil) }
        let length = prefixed - 1
        guard length <= UInt64(bytes.count - index) else { return nil }
        let start = index
        index += Int(length)
        return .some(Array(bytes[start..<index]))
    }
}
