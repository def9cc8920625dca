import COpenSSL
import Foundation
import HeraldCore
import HeraldTLS

/// An ES256 signer over an EC P-256 private key loaded from a .p8 (PKCS#8 PEM).
/// Owns the `EVP_PKEY`; frees it in deinit.
final class ES256Signer: @unchecked Sendable {
    // @unchecked Sendable: the key is immutable after init and OpenSSL allows concurrent
    // signing with one EVP_PKEY (each call makes its own EVP_MD_CTX).
    private let key: OpaquePointer

    init(pem: String) throws(APNsError) {
        let bytes = Array(pem.utf8)
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let loaded else {
            throw APNsError(.credential, "the .p8 key is not a PEM private key (\(openSSLErrors()))")
        }
        guard EVP_PKEY_get_base_id(loaded) == EVP_PKEY_EC, EVP_PKEY_get_bits(loaded) == 256 else {
            EVP_PKEY_free(loaded)
            throw APNsError(.credential, "the .p8 key is not an EC P-256 key (ES256 needs one)")
        }
        key = loaded
    }

    deinit { EVP_PKEY_free(key) }

    /// Signs `message` with ECDSA P-256 / SHA-256 and returns the JOSE form: r || s, 32 bytes each.
    func sign(_ message: [UInt8]) throws(APNsError) -> [UInt8] {
        guard let md = EVP_MD_CTX_new() else { throw APNsError(.credential, "EVP_MD_CTX_new failed") }
        defer { EVP_MD_CTX_free(md) }
        guard EVP_DigestSignInit(md, nil, EVP_sha256(), nil, key) == 1 else {
            throw APNsError(.credential, "EVP_DigestSignInit: \(openSSLErrors())")
        }
        var der = [UInt8](repeating: 0, count: 80)
        var derLength = der.count
        let ok = message.withUnsafeBufferPointer { msg in
            EVP_DigestSign(md, &der, &derLength, msg.baseAddress, msg.count)
        }
        guard ok == 1 else { throw APNsError(.credential, "EVP_DigestSign: \(openSSLErrors())") }
        let raw: [UInt8]? = der.withUnsafeBufferPointer { buf in
            var cursor: UnsafePointer<UInt8>? = buf.baseAddress
            guard let sig = d2i_ECDSA_SIG(nil, &cursor, derLength) else { return nil }
            defer { ECDSA_SIG_free(sig) }
            var r: OpaquePointer? = nil
            var s: OpaquePointer? = nil
            ECDSA_SIG_get0(sig, &r, &s)
            guard let r, let s else { return nil }
            var out = [UInt8](repeating: 0, count: 64)
            let wrote = out.withUnsafeMutableBufferPointer { o in
                BN_bn2binpad(r, o.baseAddress, 32) == 32 && BN_bn2binpad(s, o.baseAddress! + 32, 32) == 32
            }
            return wrote ? out : nil
        }
        guard let raw else { throw APNsError(.credential, "cannot convert the DER ECDSA signature to r||s") }
        return raw
    }
}

/// Makes APNs provider tokens: `{"alg":"ES256","kid":KEY}.{"iss":TEAM,"iat":SECONDS}.sig`.
public struct APNsJWT: Sendable {
    public let keyID: String
    public let teamID: String
    private let signer: ES256Signer

    public init(keyID: String, teamID: String, p8PEM: String) throws(APNsError) {
        self.keyID = keyID
        self.teamID = teamID
        self.signer = try ES256Signer(pem: p8PEM)
    }

    /// A signed token issued at `issuedAt` (whole seconds since the epoch are used).
    public func token(issuedAt: Date) throws(APNsError) -> String {
        let header = #"{"alg":"ES256","kid":"\#(Self.jsonEscape(keyID))"}"#
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let claims = #"{"iss":"\#(Self.jsonEscape(teamID))","iat":\#(iat)}"#
        let signingInput = Self.base64URL(Array(header.utf8)) + "." + Self.base64URL(Array(claims.utf8))
        let signature = try signer.sign(Array(signingInput.utf8))
        return signingInput + "." + Self.base64URL(signature)
    }

    static func base64URL(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        text = text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    /// The escaped contents of a JSON string (HeraldCore's escaper), for the header and claims written as text.
    static func jsonEscape(_ s: String) -> String {
        var w = JSONWriter(capacity: s.utf8.count + 8)
        w.escapeContents(s)
        return w.string
    }
}

/// The provider token shared by every connection of one credential, renewed per the core policy.
/// Used only on the client's I/O thread (no lock needed there); tests use it directly.
public final class APNsTokenProvider: @unchecked Sendable {
    // @unchecked Sendable: mutable state is guarded by `lock`.
    private let jwt: APNsJWT
    private let policy: APNsTokenRenewalPolicy
    private let now: @Sendable () -> Date
    private let lock = NSLock()
    private var current: (token: String, issuedAt: Date)?
    private var renewals = 0

    public init(jwt: APNsJWT, policy: APNsTokenRenewalPolicy, now: @escaping @Sendable () -> Date) {
        self.jwt = jwt
        self.policy = policy
        self.now = now
    }

    /// The bearer token to use now, renewed first if the policy says so.
    public func bearer() throws(APNsError) -> (token: String, issuedAt: Date) {
        lock.lock(); defer { lock.unlock() }
        let at = now()
        if let current, policy.decide(issuedAt: current.issuedAt, now: at) == .keep { return current }
        return try renewLocked(at: at)
    }

    /// APNs answered ExpiredProviderToken to the token issued at `issuedAt`.
    /// Returns true when a different token is now current (renewed now or already before).
    public func rejectedAsExpired(issuedAt: Date) throws(APNsError) -> Bool {
        lock.lock(); defer { lock.unlock() }
        guard let current else { return true }
        if current.issuedAt != issuedAt { return true }
        let at = now()
        guard policy.decide(issuedAt: current.issuedAt, now: at, rejectedAsExpired: true) == .renew else {
            return false
        }
        _ = try renewLocked(at: at)
        return true
    }

    /// How many tokens were made so far.
    public var renewalCount: Int { lock.lock(); defer { lock.unlock() }; return renewals }

    private func renewLocked(at: Date) throws(APNsError) -> (token: String, issuedAt: Date) {
        let issued = Date(timeIntervalSince1970: at.timeIntervalSince1970.rounded(.down))
        let made = (try jwt.token(issuedAt: issued), issued)
        current = made
        renewals += 1
        return made
    }
}
