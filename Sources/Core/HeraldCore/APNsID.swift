import Foundation

/// The `apns-id` of a notification, derived from (event id, device token) so a
/// notification can be traced and a replay carries the same id: a UUID of
/// version 8 (RFC 9562, custom) whose bits are two FNV-1a 64-bit hashes of
/// `event_id`, a 0x00 byte, and the token (offset bases 0xcbf29ce484222325 and
/// 0x84222325cbf29ce4), with the version and variant bits set.
public enum APNsID {
    static let hex: [UInt8] = Array("0123456789ABCDEF".utf8)

    public static func derive(eventID: String, token: String) -> String {
        var (h1, h2) = mix(eventID, 0xcbf2_9ce4_8422_2325, 0x8422_2325_cbf2_9ce4)
        h1 = (h1 ^ 0) &* prime
        h2 = (h2 ^ 0x5A) &* prime
        (h1, h2) = mix(token, h1, h2)
        // Version 8 in the high nibble of byte 6, variant 10 in byte 8.
        h1 = (h1 & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_8000
        h2 = (h2 & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000
        return hex.withUnsafeBufferPointer { digits in
            String(unsafeUninitializedCapacity: 36) { out in
                var i = 0
                for index in 0..<16 {
                    let word = index < 8 ? h1 : h2
                    let byte = UInt8((word >> UInt64(56 - (index % 8) * 8)) & 0xFF)
                    if index == 4 || index == 6 || index == 8 || index == 10 { out[i] = UInt8(ascii: "-"); i += 1 }
                    out[i] = digits[Int(byte >> 4)]
                    out[i + 1] = digits[Int(byte & 0xF)]
                    i += 2
                }
                return i
            }
        }
    }

    static let prime: UInt64 = 0x0000_0100_0000_01B3

    /// Two FNV-1a-style hashes of `text`'s bytes (the second over each byte xor 0x5A), continued from `h1` and `h2`.
    /// The hashes are the loop's own locals: updated through a nested function's captures instead, a derivation took
    /// twice as long.
    @inline(__always)
    static func mix(_ text: String, _ h1: UInt64, _ h2: UInt64) -> (UInt64, UInt64) {
        var text = text
        return text.withUTF8 { bytes in
            var a = h1
            var b = h2
            for byte in bytes {
                a = (a ^ UInt64(byte)) &* prime
                b = (b ^ UInt64(byte ^ 0x5A)) &* prime
            }
            return (a, b)
        }
    }
}
