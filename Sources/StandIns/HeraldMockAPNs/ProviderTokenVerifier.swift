// Verifies APNs provider tokens: `authorization: bearer <JWT>`, ES256 over the configured
// public key of the token's `kid`, `iss` equal to that key's team id, `iat` present.
import CHeraldMockTLS

public struct MockSetupError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The result of checking an authorization header's signature and claims (its age is judged
/// separately, so a cached result stays usable as time passes).
public enum ProviderTokenCheck: Equatable, Sendable {
    case valid(keyID: String, issuedAt: Int64)
    case invalid
}

/// Owns the OpenSSL public keys; used from the server's loop thread only.
public final class ProviderTokenVerifier {
    struct Entry {
        let teamID: String
        let key: OpaquePointer
    }
    private var keys: [String: Entry] = [:]

    public var isEmpty: Bool { keys.isEmpty }

    public init(keys providerKeys: [MockProviderKey]) throws {
        for k in providerKeys {
            var err = [CChar](repeating: 0, count: 256)
            guard let key = hmt_pubkey_load(k.publicKeyPath, &err, err.count) else {
                for e in keys.values { hmt_pubkey_free(e.key) }
                throw MockSetupError(
                    "--auth-key \(k.keyID): "
                        + String(decoding: err.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
            }
            if let old = keys[k.keyID] { hmt_pubkey_free(old.key) }
            keys[k.keyID] = Entry(teamID: k.teamID, key: key)
        }
    }

    deinit {
        for e in keys.values { hmt_pubkey_free(e.key) }
    }

    /// Checks the value of an `authorization` header.
    public func check(authorization: UnsafeRawBufferPointer) -> ProviderTokenCheck {
        let bytes = Array(authorization)
        // "bearer" (any case), then at least one space.
        let scheme: [UInt8] = Array("bearer".utf8)
        guard bytes.count > scheme.count + 1 else { return .invalid }
        for i in 0..<scheme.count where bytes[i] | 0x20 != scheme[i] { return .invalid }
        var start = scheme.count
        guard bytes[start] == 0x20 else { return .invalid }
        while start < bytes.count, bytes[start] == 0x20 { start += 1 }
        let jwt = Array(bytes[start...])
        let parts = jwt.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3,
            let headerJSON = Base64URL.decode(parts[0]),
            let claimsJSON = Base64URL.decode(parts[1]),
            let signature = Base64URL.decode(parts[2]), signature.count == 64,
            let header = JSONCheck.topLevelMembers(headerJSON),
            let claims = JSONCheck.topLevelMembers(claimsJSON),
            header["alg"] == .string("ES256"),
            case .string(let kid)? = header["kid"],
            let entry = keys[kid],
            claims["iss"] == .string(entry.teamID),
            case .number(let iat)? = claims["iat"], iat.isFinite, iat >= 0, iat < 1e12
        else { return .invalid }
        let signedLength = parts[0].count + 1 + parts[1].count
        let ok = jwt.withUnsafeBufferPointer { jp in
            signature.withUnsafeBufferPointer { sp in
                hmt_es256_verify(entry.key, jp.baseAddress, signedLength, sp.baseAddress, sp.count)
            }
        }
        return ok == 1 ? .valid(keyID: kid, issuedAt: Int64(iat)) : .invalid
    }
}

enum Base64URL {
    /// Decodes unpadded (or padded) base64url. Nil on any invalid character.
    static func decode<C: Collection>(_ input: C) -> [UInt8]? where C.Element == UInt8 {
        var out: [UInt8] = []
        out.reserveCapacity(input.count * 3 / 4 + 3)
        var acc: UInt32 = 0
        var bits = 0
        var sawPad = false
        for c in input {
            let v: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): v = UInt32(c - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): v = UInt32(c - UInt8(ascii: "a")) + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = UInt32(c - UInt8(ascii: "0")) + 52
            case UInt8(ascii: "-"): v = 62
            case UInt8(ascii: "_"): v = 63
            case UInt8(ascii: "="): sawPad = true; continue
            default: return nil
            }
            if sawPad { return nil }
            acc = acc << 6 | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
            }
        }
        if bits >= 6 { return nil }  // a lone trailing character cannot encode a byte
        return out
    }
}
