import COpenSSL
import Foundation
import HeraldCore
import HeraldTLS
import Synchronization

/// Signs JSON Web Tokens with a PEM private key: ES256 (ECDSA P-256, SHA-256) for APNs provider tokens, RS256
/// (RSA PKCS#1 v1.5, SHA-256) for FCM's OAuth assertions. The one place Herald loads a private key and signs with
/// OpenSSL. Owns the `EVP_PKEY`; frees it in deinit.
final class JWTSigner: @unchecked Sendable {
    // @unchecked Sendable: the key is immutable after init and OpenSSL allows concurrent signing with one EVP_PKEY
    // (each call makes its own EVP_MD_CTX).
    enum Algorithm: String, Sendable {
        case es256 = "ES256"
        case rs256 = "RS256"
    }

    let algorithm: Algorithm
    private let key: OpaquePointer

    /// Loads `pem` and checks that it is a key `algorithm` signs with. `keyName` names the key in errors (e.g. "the
    /// .p8 key"); no error ever holds the key's bytes.
    init(pem: String, algorithm: Algorithm, keyName: String) throws(PushError) {
        self.algorithm = algorithm
        let bytes = Array(pem.utf8)
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let loaded else {
            ERR_clear_error()
            throw PushError(.credential, "\(keyName) is not a PEM private key")
        }
        let fits: Bool
        switch algorithm {
        case .es256: fits = EVP_PKEY_get_base_id(loaded) == EVP_PKEY_EC && EVP_PKEY_get_bits(loaded) == 256
        case .rs256: fits = EVP_PKEY_get_base_id(loaded) == EVP_PKEY_RSA
        }
        guard fits else {
            EVP_PKEY_free(loaded)
            let kind = algorithm == .es256 ? "an EC P-256 key" : "an RSA key"
            throw PushError(.credential, "\(keyName) is not \(kind) (\(algorithm.rawValue) needs one)")
        }
        key = loaded
    }

    deinit { EVP_PKEY_free(key) }

    /// The JWS signature of `message`: for ES256 the JOSE form r || s (32 bytes each), for RS256 the RSA signature.
    func sign(_ message: [UInt8]) throws(PushError) -> [UInt8] {
        guard let md = EVP_MD_CTX_new() else { throw PushError(.credential, "EVP_MD_CTX_new failed") }
        defer { EVP_MD_CTX_free(md) }
        guard EVP_DigestSignInit(md, nil, EVP_sha256(), nil, key) == 1 else {
            throw PushError(.credential, "EVP_DigestSignInit: \(openSSLErrors())")
        }
        var length = 0
        guard message.withUnsafeBufferPointer({ EVP_DigestSign(md, nil, &length, $0.baseAddress, $0.count) }) == 1
        else {
            throw PushError(.credential, "EVP_DigestSign: \(openSSLErrors())")
        }
        var signature = [UInt8](repeating: 0, count: length)
        guard
            message.withUnsafeBufferPointer({ EVP_DigestSign(md, &signature, &length, $0.baseAddress, $0.count) }) == 1
        else {
            throw PushError(.credential, "EVP_DigestSign: \(openSSLErrors())")
        }
        signature.removeSubrange(length...)
        switch algorithm {
        case .rs256: return signature
        case .es256: return try Self.joseECDSA(der: signature)
        }
    }

    /// OpenSSL's DER `ECDSA-Sig-Value` as JOSE wants it: r and s, each left-padded to 32 bytes.
    private static func joseECDSA(der: [UInt8]) throws(PushError) -> [UInt8] {
        let raw: [UInt8]? = der.withUnsafeBufferPointer { buf in
            var cursor: UnsafePointer<UInt8>? = buf.baseAddress
            guard let sig = d2i_ECDSA_SIG(nil, &cursor, buf.count) else { return nil }
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
        guard let raw else { throw PushError(.credential, "cannot convert the DER ECDSA signature to r||s") }
        return raw
    }
}

/// The two text steps of every JWT Herald writes (APNs provider tokens, FCM assertions, VAPID): base64url without
/// padding, and JSON string escaping for the header and claims written as text.
enum JWTEncoding {
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
    // @unchecked Sendable: the mutable state is in `state`, and `jwt` signs only while its lock is held.
    private let jwt: APNsJWT
    private let policy: APNsTokenRenewalPolicy
    private let now: @Sendable () -> Date
    private struct State {
        var current: (token: String, issuedAt: Date)?
        var renewals = 0
    }
    private let state = Mutex(State())

    public init(jwt: APNsJWT, policy: APNsTokenRenewalPolicy, now: @escaping @Sendable () -> Date) {
        self.jwt = jwt
        self.policy = policy
        self.now = now
    }

    /// The bearer token to use now, renewed first if the policy says so.
    public func bearer() throws(PushError) -> (token: String, issuedAt: Date) {
        try state.withLock { state throws(PushError) -> (token: String, issuedAt: Date) in
            let at = now()
            if let current = state.current, policy.decide(issuedAt: current.issuedAt, now: at) == .keep {
                return current
            }
            return try renew(&state, at: at)
        }
    }

    /// APNs answered ExpiredProviderToken to the token issued at `issuedAt`.
    /// Returns true when a different token is now current (renewed now or already before).
    public func rejectedAsExpired(issuedAt: Date) throws(PushError) -> Bool {
        try state.withLock { state throws(PushError) -> Bool in
            guard let current = state.current else { return true }
            if current.issuedAt != issuedAt { return true }
            let at = now()
            guard policy.decide(issuedAt: current.issuedAt, now: at, rejectedAsExpired: true) == .renew else {
                return false
            }
            _ = try renew(&state, at: at)
            return true
        }
    }

    /// How many tokens were made so far.
    public var renewalCount: Int { state.withLock { $0.renewals } }

    /// Signs a token issued at `at` (whole seconds) and makes it current; called with the lock held.
    private func renew(_ state: inout State, at: Date) throws(PushError) -> (token: String, issuedAt: Date) {
        let issued = Date(timeIntervalSince1970: at.timeIntervalSince1970.rounded(.down))
        let made = (try jwt.token(issuedAt: issued), issued)
        state.current = made
        state.renewals += 1
        return made
    }
}
