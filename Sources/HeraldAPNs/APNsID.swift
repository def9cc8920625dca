import COpenSSL
import Foundation

/// `apns-id` values derived from (event id, device token), so a notification can be traced
/// from the chat event to Apple's answer and a resend carries the same id.
public enum APNsID {
    /// Herald's UUID namespace for name-based ids.
    static let namespace: [UInt8] = [0x6b, 0x1d, 0x3c, 0x52, 0x8e, 0x4a, 0x4f, 0x31,
                                     0x9a, 0x27, 0x50, 0xc4, 0x1e, 0x7d, 0x90, 0x0b]

    /// A version-5 (SHA-1, name-based) UUID of `eventID + "/" + deviceToken`, upper-case
    /// canonical 8-4-4-4-12 form as APNs shows it.
    public static func derive(eventID: String, deviceToken: String) -> String {
        var input = namespace
        input.append(contentsOf: Array((eventID + "/" + deviceToken).utf8))
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        input.withUnsafeBufferPointer { p in _ = EVP_Digest(p.baseAddress, p.count, &digest, &length, EVP_sha1(), nil) }
        var b = Array(digest.prefix(16))
        b[6] = (b[6] & 0x0f) | 0x50
        b[8] = (b[8] & 0x3f) | 0x80
        let hex = b.map { String(format: "%02X", $0) }
        return hex[0..<4].joined() + "-" + hex[4..<6].joined() + "-" + hex[6..<8].joined() + "-"
            + hex[8..<10].joined() + "-" + hex[10..<16].joined()
    }
}
