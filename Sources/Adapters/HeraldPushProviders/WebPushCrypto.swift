// Web Push message encryption (RFC 8291) in the `aes128gcm` content coding (RFC 8188): ECDH over P-256 with a
// fresh key per message, HKDF-SHA-256, AES-128-GCM, one record. The decryption is the user agent's side, for the
// tests and tools that read what was sent.
import COpenSSL
import Foundation

/// Why a Web Push key, message or token was refused. `reason` never holds key material or message text.
public struct WebPushError: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// A P-256 key: a private key (generated, loaded from PEM or from its scalar) or only a public point (a
/// subscription's `p256dh`). Owns the `EVP_PKEY`; frees it in deinit. No description shows key bytes.
public final class WebPushP256Key: @unchecked Sendable, CustomStringConvertible {
    // @unchecked Sendable: the key is immutable after init; OpenSSL allows concurrent use of one EVP_PKEY when each
    // operation makes its own context.
    let pkey: OpaquePointer
    /// True when this key holds the private scalar.
    public let isPrivate: Bool

    private init(_ pkey: OpaquePointer, isPrivate: Bool) {
        self.pkey = pkey
        self.isPrivate = isPrivate
    }

    deinit { EVP_PKEY_free(pkey) }

    public var description: String { isPrivate ? "P-256 private key" : "P-256 public key" }

    /// A new random key pair.
    public static func generate() throws(WebPushError) -> WebPushP256Key {
        guard let ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nil) else { throw WebPushError("EVP_PKEY_CTX_new_id failed") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var key: OpaquePointer? = nil
        guard EVP_PKEY_keygen_init(ctx) == 1,
            EVP_PKEY_CTX_set_ec_paramgen_curve_nid(ctx, NID_X9_62_prime256v1) == 1,
            EVP_PKEY_keygen(ctx, &key) == 1, let key
        else {
            ERR_clear_error()
            throw WebPushError("cannot generate a P-256 key")
        }
        return WebPushP256Key(key, isPrivate: true)
    }

    /// The public key of an uncompressed point (0x04 || X || Y, 65 bytes), checked to lie on the curve.
    public convenience init(publicPoint: [UInt8]) throws(WebPushError) {
        guard publicPoint.count == 65, publicPoint[0] == 0x04 else {
            throw WebPushError("a P-256 public key is an uncompressed point of 65 bytes")
        }
        let der = Self.spkiPrefix + publicPoint
        let key: OpaquePointer? = der.withUnsafeBufferPointer { buf in
            var cursor: UnsafePointer<UInt8>? = buf.baseAddress
            return d2i_PUBKEY(nil, &cursor, buf.count)
        }
        guard let key else {
            ERR_clear_error()
            throw WebPushError("the P-256 public key is not a point on the curve")
        }
        self.init(key, isPrivate: false)
    }

    /// The private key of a 32-byte scalar (its public point is computed).
    public convenience init(privateScalar: [UInt8]) throws(WebPushError) {
        guard privateScalar.count == 32 else { throw WebPushError("a P-256 private key is 32 bytes") }
        // SEC 1 ECPrivateKey { version 1, privateKey, [0] prime256v1 }, without the optional public key.
        let der: [UInt8] = [0x30, 0x31, 0x02, 0x01, 0x01, 0x04, 0x20] + privateScalar + [0xA0, 0x0A] + Self.curveOID
        let key: OpaquePointer? = der.withUnsafeBufferPointer { buf in
            var cursor: UnsafePointer<UInt8>? = buf.baseAddress
            return d2i_PrivateKey(EVP_PKEY_EC, nil, &cursor, buf.count)
        }
        guard let key else {
            ERR_clear_error()
            throw WebPushError("the bytes are not a P-256 private key")
        }
        self.init(key, isPrivate: true)
    }

    /// The private key of a PEM file's text (PKCS#8 or SEC 1). `keyName` names it in errors, which never hold the
    /// key's bytes.
    public convenience init(pem: String, keyName: String) throws(WebPushError) {
        let bytes = Array(pem.utf8)
        let loaded: OpaquePointer? = bytes.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let loaded else {
            ERR_clear_error()
            throw WebPushError("\(keyName) is not a PEM private key")
        }
        // Another 256-bit curve (secp256k1, brainpoolP256r1) is not P-256: its public key does not encode as one.
        guard EVP_PKEY_get_base_id(loaded) == EVP_PKEY_EC, EVP_PKEY_get_bits(loaded) == 256,
            Self.encodedPoint(loaded) != nil
        else {
            EVP_PKEY_free(loaded)
            throw WebPushError("\(keyName) is not an EC P-256 key")
        }
        self.init(loaded, isPrivate: true)
    }

    /// The uncompressed public point (65 bytes). Every initializer checks that the key is a P-256 key.
    public var publicPoint: [UInt8] { Self.encodedPoint(pkey) ?? [] }

    /// The uncompressed point of a P-256 key, or nil when `key` is not one: a P-256 SubjectPublicKeyInfo is 91 bytes,
    /// the fixed prefix (id-ecPublicKey, prime256v1), then the point.
    static func encodedPoint(_ key: OpaquePointer) -> [UInt8]? {
        guard i2d_PUBKEY(key, nil) == 91 else {
            ERR_clear_error()
            return nil
        }
        var der = [UInt8](repeating: 0, count: 91)
        let length = der.withUnsafeMutableBufferPointer { buf -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buf.baseAddress
            return i2d_PUBKEY(key, &cursor)
        }
        guard length == 91, Array(der[0..<26]) == spkiPrefix else { return nil }
        return Array(der[26..<91])
    }

    /// The private key as PKCS#8 PEM text (for tools and tests that hand a key to another process).
    public func privatePEM() throws(WebPushError) -> String {
        guard isPrivate else { throw WebPushError("a public key has no private PEM") }
        guard let bio = BIO_new(BIO_s_mem()) else { throw WebPushError("BIO_new failed") }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PrivateKey(bio, pkey, nil, nil, 0, nil, nil) == 1 else {
            ERR_clear_error()
            throw WebPushError("cannot write the private key as PEM")
        }
        var out = [UInt8](repeating: 0, count: Int(BIO_ctrl_pending(bio)))
        let read = out.withUnsafeMutableBytes { BIO_read(bio, $0.baseAddress, Int32($0.count)) }
        return String(decoding: out.prefix(Int(max(read, 0))), as: UTF8.self)
    }

    /// The ECDH shared secret (the X coordinate, 32 bytes) of this private key and `peer`.
    public func sharedSecret(with peer: WebPushP256Key) throws(WebPushError) -> [UInt8] {
        guard isPrivate else { throw WebPushError("ECDH needs a private key") }
        guard let ctx = EVP_PKEY_CTX_new(pkey, nil) else { throw WebPushError("EVP_PKEY_CTX_new failed") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var length = 0
        guard EVP_PKEY_derive_init(ctx) == 1, EVP_PKEY_derive_set_peer(ctx, peer.pkey) == 1,
            EVP_PKEY_derive(ctx, nil, &length) == 1
        else {
            ERR_clear_error()
            throw WebPushError("ECDH failed")
        }
        var secret = [UInt8](repeating: 0, count: length)
        guard EVP_PKEY_derive(ctx, &secret, &length) == 1 else {
            ERR_clear_error()
            throw WebPushError("ECDH failed")
        }
        return Array(secret.prefix(length))
    }

    /// DER SubjectPublicKeyInfo of an id-ecPublicKey on prime256v1, up to the point's bytes.
    static let spkiPrefix: [UInt8] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01,
        0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ]
    /// The OID prime256v1 (1.2.840.10045.3.1.7), DER.
    static let curveOID: [UInt8] = [0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07]
}

/// RFC 8291 message encryption in the `aes128gcm` content coding: one record, record size 4096, the key id being
/// the sender's ephemeral public key.
public enum WebPushCrypto {
    /// The record size written in the header.
    public static let recordSize: UInt32 = 4096
    /// Header bytes: salt (16), rs (4), idlen (1), keyid (65).
    public static let headerBytes = 86
    /// What encryption adds to a plaintext: the header, the padding delimiter (1) and the GCM tag (16).
    public static let overheadBytes = headerBytes + 1 + 16
    /// The most a push service takes in one message body (RFC 8030 §7.2: at least 4096 bytes must be accepted).
    public static let maxBodyBytes = 4096
    /// The longest plaintext whose encrypted body fits in `maxBodyBytes` (3993).
    public static let maxPlaintextBytes = maxBodyBytes - overheadBytes

    /// The encrypted body (header || ciphertext || tag) of `plaintext` for the subscription whose public key is
    /// `uaPublic` (its `keys.p256dh`) and whose authentication secret is `authSecret` (`keys.auth`, 16 bytes).
    /// `ephemeral` and `salt` are fresh unless given (the RFC's example fixes them).
    public static func encrypt(
        _ plaintext: [UInt8], uaPublic: [UInt8], authSecret: [UInt8],
        ephemeral: WebPushP256Key? = nil, salt givenSalt: [UInt8]? = nil
    ) throws(WebPushError) -> [UInt8] {
        guard authSecret.count == 16 else { throw WebPushError("the authentication secret is not 16 bytes") }
        guard plaintext.count <= Int(recordSize) - 17 else {
            throw WebPushError("a plaintext of \(plaintext.count) bytes does not fit one record")
        }
        let ua = try WebPushP256Key(publicPoint: uaPublic)
        let sender: WebPushP256Key
        if let ephemeral { sender = ephemeral } else { sender = try WebPushP256Key.generate() }
        guard sender.isPrivate else { throw WebPushError("the sender's key is not a private key") }
        let salt: [UInt8]
        if let givenSalt { salt = givenSalt } else { salt = try randomBytes(16) }
        guard salt.count == 16 else { throw WebPushError("the salt is not 16 bytes") }
        let asPublic = sender.publicPoint
        let keys = try deriveKeys(
            sharedSecret: try sender.sharedSecret(with: ua), authSecret: authSecret, uaPublic: uaPublic,
            asPublic: asPublic, salt: salt)
        let sealed = try aesGCM(encrypt: true, key: keys.cek, nonce: keys.nonce, input: plaintext + [0x02])
        var body = salt
        body.reserveCapacity(headerBytes + sealed.count)
        withUnsafeBytes(of: recordSize.bigEndian) { body.append(contentsOf: $0) }
        body.append(UInt8(asPublic.count))
        body.append(contentsOf: asPublic)
        body.append(contentsOf: sealed)
        return body
    }

    /// The plaintext of an `aes128gcm` body sent to the subscription whose private key is `uaPrivate`: the user
    /// agent's side. Throws when the header, the key id, the tag or the padding is wrong.
    public static func decrypt(
        _ body: [UInt8], uaPrivate: WebPushP256Key, authSecret: [UInt8]
    ) throws(WebPushError)
        -> [UInt8]
    {
        guard authSecret.count == 16 else { throw WebPushError("the authentication secret is not 16 bytes") }
        guard body.count >= 21 else { throw WebPushError("the body is shorter than the aes128gcm header") }
        let salt = Array(body[0..<16])
        let rs = body[16..<20].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let idlen = Int(body[20])
        guard rs >= 18 else { throw WebPushError("record size \(rs) is below 18") }
        guard idlen == 65, body.count >= 21 + idlen else { throw WebPushError("the key id is not a 65-byte P-256 key") }
        let asPublic = Array(body[21..<(21 + idlen)])
        let record = Array(body[(21 + idlen)...])
        guard record.count >= 17 else { throw WebPushError("the record is shorter than its tag") }
        guard record.count <= Int(rs) else {
            throw WebPushError("more than one record (\(record.count) bytes, record size \(rs))")
        }
        let sender = try WebPushP256Key(publicPoint: asPublic)
        let keys = try deriveKeys(
            sharedSecret: try uaPrivate.sharedSecret(with: sender), authSecret: authSecret,
            uaPublic: uaPrivate.publicPoint, asPublic: asPublic, salt: salt)
        var padded = try aesGCM(encrypt: false, key: keys.cek, nonce: keys.nonce, input: record)
        while let last = padded.last, last == 0 { padded.removeLast() }
        guard padded.last == 0x02 else { throw WebPushError("the last record has no 0x02 padding delimiter") }
        padded.removeLast()
        return padded
    }

    /// RFC 8291 §3.4's IKM, then RFC 8188 §2.2's content-encryption key and nonce.
    static func deriveKeys(
        sharedSecret: [UInt8], authSecret: [UInt8], uaPublic: [UInt8], asPublic: [UInt8], salt: [UInt8]
    ) throws(WebPushError) -> (cek: [UInt8], nonce: [UInt8]) {
        let keyInfo = Array("WebPush: info\0".utf8) + uaPublic + asPublic
        let ikm = try hkdf(salt: authSecret, ikm: sharedSecret, info: keyInfo, length: 32)
        let prk = try hmacSHA256(key: salt, data: ikm)
        let cek = try hkdfExpand(prk: prk, info: Array("Content-Encoding: aes128gcm\0".utf8), length: 16)
        let nonce = try hkdfExpand(prk: prk, info: Array("Content-Encoding: nonce\0".utf8), length: 12)
        return (cek, nonce)
    }

    /// HKDF-SHA-256 (RFC 5869) for outputs of at most 32 bytes (one block), all Web Push needs.
    static func hkdf(salt: [UInt8], ikm: [UInt8], info: [UInt8], length: Int) throws(WebPushError) -> [UInt8] {
        try hkdfExpand(prk: try hmacSHA256(key: salt, data: ikm), info: info, length: length)
    }

    static func hkdfExpand(prk: [UInt8], info: [UInt8], length: Int) throws(WebPushError) -> [UInt8] {
        precondition(length <= 32, "one HKDF block")
        return Array(try hmacSHA256(key: prk, data: info + [0x01]).prefix(length))
    }

    static func hmacSHA256(key: [UInt8], data: [UInt8]) throws(WebPushError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length = 0
        let ok = key.withUnsafeBytes { k in
            data.withUnsafeBufferPointer { d in
                EVP_Q_mac(
                    nil, "HMAC", nil, "SHA256", nil, k.baseAddress, k.count, d.baseAddress, d.count, &out, 32, &length)
                    != nil
            }
        }
        guard ok, length == 32 else {
            ERR_clear_error()
            throw WebPushError("HMAC-SHA-256 failed")
        }
        return out
    }

    /// AES-128-GCM with a 12-byte nonce and a 16-byte tag appended to (encrypt) or taken from (decrypt) the end.
    static func aesGCM(encrypt: Bool, key: [UInt8], nonce: [UInt8], input: [UInt8]) throws(WebPushError) -> [UInt8] {
        guard let ctx = EVP_CIPHER_CTX_new() else { throw WebPushError("EVP_CIPHER_CTX_new failed") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        let getTag: Int32 = 0x10  // EVP_CTRL_AEAD_GET_TAG
        let setTag: Int32 = 0x11  // EVP_CTRL_AEAD_SET_TAG
        var text = encrypt ? input : Array(input.dropLast(16))
        var tag = encrypt ? [UInt8](repeating: 0, count: 16) : Array(input.suffix(16))
        var out = [UInt8](repeating: 0, count: text.count + 16)
        var written: Int32 = 0
        var final: Int32 = 0
        let ok: Bool
        if encrypt {
            ok =
                EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nil, key, nonce) == 1
                && EVP_EncryptUpdate(ctx, &out, &written, &text, Int32(text.count)) == 1
                && out.withUnsafeMutableBufferPointer {
                    EVP_EncryptFinal_ex(ctx, $0.baseAddress! + Int(written), &final)
                }
                    == 1
                && EVP_CIPHER_CTX_ctrl(ctx, getTag, 16, &tag) == 1
        } else {
            ok =
                EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), nil, key, nonce) == 1
                && EVP_DecryptUpdate(ctx, &out, &written, &text, Int32(text.count)) == 1
                && EVP_CIPHER_CTX_ctrl(ctx, setTag, 16, &tag) == 1
                && out.withUnsafeMutableBufferPointer {
                    EVP_DecryptFinal_ex(ctx, $0.baseAddress! + Int(written), &final)
                }
                    == 1
        }
        guard ok else {
            ERR_clear_error()
            throw WebPushError(encrypt ? "AES-128-GCM encryption failed" : "AES-128-GCM: the tag does not match")
        }
        let result = Array(out.prefix(Int(written + final)))
        return encrypt ? result + tag : result
    }

    static func randomBytes(_ count: Int) throws(WebPushError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard RAND_bytes(&bytes, Int32(count)) == 1 else { throw WebPushError("RAND_bytes failed") }
        return bytes
    }
}

/// Base64url without padding (RFC 4648 §5), as Web Push writes keys and tokens.
public enum WebPushBase64URL {
    public static func encode(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        text = text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    /// The bytes of base64url text (padding optional; standard base64's `+` and `/` are refused), or nil.
    public static func decode(_ text: String) -> [UInt8]? {
        guard
            text.utf8.allSatisfy({ c in
                (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || (c >= 0x30 && c <= 0x39) || c == 0x2D
                    || c == 0x5F || c == 0x3D
            })
        else { return nil }
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while standard.hasSuffix("=") { standard.removeLast() }
        if standard.utf8.count % 4 == 1 { return nil }
        standard += String(repeating: "=", count: (4 - standard.utf8.count % 4) % 4)
        guard let data = Data(base64Encoded: standard) else { return nil }
        return Array(data)
    }
}
