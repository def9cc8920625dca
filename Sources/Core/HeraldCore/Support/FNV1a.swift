/// FNV-1a, 64 bits: the hash behind Redis shard numbers, delivery fields, translation fingerprints, the explain
/// sample and the record keys that find repeated events. Its values are stored (as shard numbers and fields), so
/// they never change. Inlinable, so each caller gets the loop compiled for its own byte sequence.
public enum FNV1a {
    /// The hash of no bytes.
    public static let offsetBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    public static let prime: UInt64 = 0x0000_0100_0000_01b3

    /// The hash of `bytes`, continued from `hash` (the hash of the bytes before them).
    @inlinable
    public static func hash(_ bytes: some Sequence<UInt8>, continuing hash: UInt64 = offsetBasis) -> UInt64 {
        var h = hash
        for b in bytes { h = (h ^ UInt64(b)) &* prime }
        return h
    }

    /// The hash of `text`'s UTF-8 bytes, continued from `hash`. A native string hands over its UTF-8 buffer: a plain
    /// loop over it, without the string iterator.
    @inlinable
    public static func hash(_ text: String, continuing hash: UInt64 = offsetBasis) -> UInt64 {
        text.utf8.withContiguousStorageIfAvailable { Self.hash($0, continuing: hash) }
            ?? Self.hash(text.utf8, continuing: hash)
    }

    /// The hash of `first`'s bytes, a zero byte and `second`'s bytes: two texts that do not run into each other.
    @inlinable
    public static func hash(_ first: String, then second: String) -> UInt64 {
        hash(second, continuing: (hash(first) ^ 0) &* prime)
    }
}
