/// The Redis Cluster hash slot of a key: CRC16 (XMODEM: polynomial 0x1021, initial value 0) of the key, modulo
/// 16384. When the key holds a hash tag, a `{` followed later by a `}` with at least one byte between them, only
/// the bytes between the first `{` and the first `}` after it are hashed, so `herald:a:user:{u1}:devices` and
/// `herald:a:user:{u1}:prefs` share a slot.
public enum RedisSlot {
    /// The number of hash slots of a Redis Cluster.
    public static let count = 16384

    /// The slot of `key` (its UTF-8 bytes).
    public static func of(_ key: String) -> Int {
        var key = key
        return key.withUTF8 { of($0) }
    }

    /// The slot of a key given as bytes.
    public static func of(_ key: UnsafeBufferPointer<UInt8>) -> Int {
        var hashed = key[...]
        if let open = key.firstIndex(of: UInt8(ascii: "{")),
            let close = key[(open + 1)...].firstIndex(of: UInt8(ascii: "}")), close > open + 1
        {
            hashed = key[(open + 1)..<close]
        }
        var crc: UInt16 = 0
        for byte in hashed {
            crc = (crc << 8) ^ table[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ byte)]
        }
        return Int(crc) & (count - 1)
    }

    /// The slot of a key given as a byte array.
    public static func of(_ key: [UInt8]) -> Int {
        key.withUnsafeBufferPointer { of($0) }
    }

    /// CRC16/XMODEM by byte: the remainder of each byte value shifted into the top of the register.
    private static let table: [UInt16] = (0..<256).map { value in
        var crc = UInt16(value) << 8
        for _ in 0..<8 {
            crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1
        }
        return crc
    }
}
