import Foundation
import HeraldCore

/// The stored forms of the fields of a user's state hash (`RedisKeys.userState`, docs/redis-keys.md), which holds
/// a user's devices, presence, preferences and unread counts so that resolve reads a recipient with one `HMGET`.
///
/// | field | value |
/// | --- | --- |
/// | `d` | the devices: one device JSON per line (`\n` between them; compact JSON holds no raw newline) |
/// | `o` | the online devices: one `<expiry ms> <token>` per line |
/// | `p` | the preferences JSON |
/// | `total` | the unread total |
/// | `c:<conversation>` | one conversation's unread count |
///
/// The Lua scripts that change devices and presence (`Scripts`) read and write these same forms.
public enum UserRecord {
    public static let devicesField = "d"
    public static let onlineField = "o"
    public static let preferencesField = "p"

    /// The `d` field: each device's stored JSON, one per line.
    public static func encodeDevices(_ devices: [Device]) -> [UInt8] {
        var out: [UInt8] = []
        for device in devices {
            if !out.isEmpty { out.append(10) }
            out += device.jsonBytes()
        }
        return out
    }

    /// The devices of a `d` field, each line decoded on its own: a line that is not a valid device is reported
    /// through `invalid` (its first 8 bytes, never a whole token) and skipped.
    static func decodeDevices(_ data: UnsafeRawBufferPointer, invalid: (String) -> Void) -> [Device] {
        // One copy of the field, each line read in place from it, into an array of the right size.
        let field = [UInt8](data)
        var lines = 1
        for byte in field where byte == 10 { lines += 1 }
        var devices: [Device] = []
        devices.reserveCapacity(lines)
        var start = 0
        while start < field.count {
            var end = start
            while end < field.count && field[end] != 10 { end += 1 }
            if end > start {
                if let device = try? Device.fromStoredJSON(field, in: start..<end) {
                    devices.append(device)
                } else {
                    invalid(String(decoding: field[start..<min(end, start + 8)], as: UTF8.self))
                }
            }
            start = end + 1
        }
        return devices
    }

    /// `decodeDevices` of a field held as `Data`.
    static func decodeDevices(_ data: Data, invalid: (String) -> Void) -> [Device] {
        data.withUnsafeBytes { decodeDevices($0, invalid: invalid) }
    }

    /// Calls `body` with each non-empty line of a field (`\n` between lines), read in place.
    private static func forEachLine(of data: UnsafeRawBufferPointer, _ body: (UnsafeBufferPointer<UInt8>) -> Void) {
        let bytes = data.assumingMemoryBound(to: UInt8.self)
        var start = 0
        while start < bytes.count {
            var end = start
            while end < bytes.count && bytes[end] != 10 { end += 1 }
            if end > start { body(UnsafeBufferPointer(rebasing: bytes[start..<end])) }
            start = end + 1
        }
    }

    /// The `o` field for tokens online until `expiry`. A token holding a newline cannot be a device's (device
    /// tokens have no whitespace) and is left out.
    public static func encodeOnline(_ tokens: [String], expiry: Int64) -> String {
        let expiry = onlineExpiry(expiry)
        var out = ""
        for token in tokens where !token.contains("\n") {
            if !out.isEmpty { out += "\n" }
            out += String(expiry)
            out += " "
            out += token
        }
        return out
    }

    /// The latest expiry an `o` line holds: 18 decimal digits, what `decodeOnline` reads (a saturated
    /// `now + ttl` is capped here rather than written as a line that reads as offline).
    public static let maxOnlineExpiry: Int64 = 999_999_999_999_999_999

    /// `expiry` capped to what an `o` line holds.
    public static func onlineExpiry(_ expiry: Int64) -> Int64 { min(expiry, maxOnlineExpiry) }

    /// The tokens of an `o` field whose expiry is after `now`, in stored order. A line without a space, or whose
    /// expiry is not 1 to 18 decimal digits, is skipped. (Read in place: splitting the field into lines first cost
    /// resolve an array and a slice per line.)
    static func decodeOnline(_ data: UnsafeRawBufferPointer, now: Int64) -> [String] {
        var tokens: [String] = []
        forEachLine(of: data) { line in
            var space = 0
            var expiry: Int64 = 0
            var digits = 0
            var valid = true
            while space < line.count && line[space] != 32 {
                let byte = line[space]
                if byte >= 48 && byte <= 57 && digits < 18 {
                    expiry = expiry * 10 + Int64(byte - 48)
                    digits += 1
                } else {
                    valid = false
                }
                space += 1
            }
            if valid, space < line.count, expiry > now {
                tokens.append(String(decoding: UnsafeBufferPointer(rebasing: line[(space + 1)...]), as: UTF8.self))
            }
        }
        return tokens
    }

    /// `decodeOnline` of a field held as `Data`.
    static func decodeOnline(_ data: Data, now: Int64) -> [String] {
        data.withUnsafeBytes { decodeOnline($0, now: now) }
    }
}
