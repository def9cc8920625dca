// The stand-in's Web Push push service: `POST /wp/<id>` over HTTP/2. It holds each subscription's private key and
// authentication secret (given by the test, in memory or as a file `<id>.json` in `webPushKeyDirectory`),
// decrypts every message (RFC 8291, aes128gcm), checks the VAPID token (RFC 8292: ES256 under `k`, `aud` its own
// origin, `exp` within 24 hours, `sub` present) and answers like a push service: 201 delivered, 404 an unknown
// subscription, 410 one marked gone, 413 a body over 4,096 bytes (or the subscription's own smaller limit), 400 a malformed request or a body that does not
// decrypt, 401/403 a missing or bad VAPID token. Written on its own (no Herald module), so it checks Herald's
// encryption independently.
import COpenSSL
import Foundation

/// One subscription the stand-in can decrypt for.
public struct MockWebPushSubscription: Sendable {
    /// The P-256 private key (PKCS#8 or SEC 1 PEM).
    public var privateKeyPEM: String
    /// The authentication secret (16 bytes).
    public var auth: [UInt8]
    /// The largest body taken; a larger one is answered 413 [4096, what every push service must take].
    public var maxBody: Int

    public init(privateKeyPEM: String, auth: [UInt8], maxBody: Int = 4096) {
        self.privateKeyPEM = privateKeyPEM
        self.auth = auth
        self.maxBody = maxBody
    }
}

/// What the stand-in found in one Web Push request.
struct MockWebPushOutcome {
    var status: Int
    var reason: String
    /// The decrypted message (empty when it did not decrypt).
    var plaintext: [UInt8]
}

enum MockWebPush {
    /// Answers one request to `/wp/<id>`. `headers` are the request's (lower-case names).
    static func answer(
        id: String, headers: [String: String], body: [UInt8], origin: String,
        subscription: MockWebPushSubscription?, gone: Bool, now: Date
    ) -> MockWebPushOutcome {
        func fail(_ status: Int, _ reason: String) -> MockWebPushOutcome {
            MockWebPushOutcome(status: status, reason: reason, plaintext: [])
        }
        guard let subscription else { return fail(404, "no such subscription") }
        if gone { return fail(410, "subscription expired") }
        // Authentication first, as a push service does.
        guard let authorization = headers["authorization"] else { return fail(401, "missing VAPID authorization") }
        if let problem = vapidProblem(authorization, audience: origin, now: now) { return fail(403, problem) }
        if body.count > subscription.maxBody { return fail(413, "payload too large") }
        guard let ttl = headers["ttl"], let seconds = Int(ttl), seconds >= 0 else { return fail(400, "missing TTL") }
        if let urgency = headers["urgency"], !["very-low", "low", "normal", "high"].contains(urgency) {
            return fail(400, "bad Urgency")
        }
        if let topic = headers["topic"] {
            let safe = topic.utf8.allSatisfy { c in
                (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || (c >= 0x30 && c <= 0x39) || c == 0x2D
                    || c == 0x5F
            }
            if !safe || topic.isEmpty || topic.utf8.count > 32 { return fail(400, "bad Topic") }
        }
        guard headers["content-encoding"] == "aes128gcm" else { return fail(400, "Content-Encoding is not aes128gcm") }
        switch decrypt(body, privateKeyPEM: subscription.privateKeyPEM, auth: subscription.auth) {
        case .success(let plaintext): return MockWebPushOutcome(status: 201, reason: "", plaintext: plaintext)
        case .failure(let why): return fail(400, "cannot decrypt: \(why.description)")
        }
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    // MARK: aes128gcm (the user agent's side)

    static func decrypt(_ body: [UInt8], privateKeyPEM: String, auth: [UInt8]) -> Result<[UInt8], Failure> {
        guard body.count >= 21 + 65 + 17 else { return .failure(Failure("body shorter than header and tag")) }
        let salt = Array(body[0..<16])
        let rs = body[16..<20].reduce(0) { $0 << 8 | Int($1) }
        guard body[20] == 65 else { return .failure(Failure("keyid is not a 65-byte point")) }
        let senderPoint = Array(body[21..<86])
        let record = Array(body[86...])
        guard rs >= 18, record.count <= rs else { return .failure(Failure("not one record of size rs")) }
        guard let ua = loadPrivate(privateKeyPEM) else { return .failure(Failure("subscription key unusable")) }
        defer { EVP_PKEY_free(ua) }
        guard let sender = loadPublic(senderPoint) else { return .failure(Failure("keyid is not a P-256 point")) }
        defer { EVP_PKEY_free(sender) }
        guard let uaPoint = publicPoint(ua), let ecdh = derive(ua, sender) else {
            return .failure(Failure("ECDH failed"))
        }
        let prkKey = hmac(auth, ecdh)
        let ikm = Array(hmac(prkKey, Array("WebPush: info\0".utf8) + uaPoint + senderPoint + [1]).prefix(32))
        let prk = hmac(salt, ikm)
        let cek = Array(hmac(prk, Array("Content-Encoding: aes128gcm\0".utf8) + [1]).prefix(16))
        let nonce = Array(hmac(prk, Array("Content-Encoding: nonce\0".utf8) + [1]).prefix(12))
        guard var plain = open(record, key: cek, nonce: nonce) else { return .failure(Failure("tag does not verify")) }
        while plain.last == 0 { plain.removeLast() }
        guard plain.last == 2 else { return .failure(Failure("no 0x02 delimiter: not the last record")) }
        plain.removeLast()
        return .success(plain)
    }

    static func hmac(_ key: [UInt8], _ data: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length = 0
        _ = key.withUnsafeBytes { k in
            EVP_Q_mac(nil, "HMAC", nil, "SHA256", nil, k.baseAddress, k.count, data, data.count, &out, 32, &length)
        }
        return out
    }

    static func open(_ sealed: [UInt8], key: [UInt8], nonce: [UInt8]) -> [UInt8]? {
        guard sealed.count >= 16, let ctx = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(ctx) }
        var text = Array(sealed.dropLast(16))
        var tag = Array(sealed.suffix(16))
        var out = [UInt8](repeating: 0, count: text.count + 16)
        var n: Int32 = 0
        var m: Int32 = 0
        guard EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), nil, key, nonce) == 1,
            EVP_DecryptUpdate(ctx, &out, &n, &text, Int32(text.count)) == 1,
            EVP_CIPHER_CTX_ctrl(ctx, 0x11, 16, &tag) == 1,  // EVP_CTRL_AEAD_SET_TAG
            out.withUnsafeMutableBufferPointer({ EVP_DecryptFinal_ex(ctx, $0.baseAddress! + Int(n), &m) }) == 1
        else {
            ERR_clear_error()
            return nil
        }
        return Array(out.prefix(Int(n + m)))
    }

    // MARK: keys

    static let spkiPrefix: [UInt8] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01,
        0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ]

    static func loadPrivate(_ pem: String) -> OpaquePointer? {
        let bytes = Array(pem.utf8)
        return bytes.withUnsafeBytes { raw -> OpaquePointer? in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil)
            if key == nil { ERR_clear_error() }
            return key
        }
    }

    static func loadPublic(_ point: [UInt8]) -> OpaquePointer? {
        guard point.count == 65, point[0] == 4 else { return nil }
        let der = spkiPrefix + point
        let key: OpaquePointer? = der.withUnsafeBufferPointer { buf in
            var cursor: UnsafePointer<UInt8>? = buf.baseAddress
            return d2i_PUBKEY(nil, &cursor, buf.count)
        }
        if key == nil { ERR_clear_error() }
        return key
    }

    static func publicPoint(_ key: OpaquePointer) -> [UInt8]? {
        var der = [UInt8](repeating: 0, count: 128)
        let n = der.withUnsafeMutableBufferPointer { buf -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buf.baseAddress
            return i2d_PUBKEY(key, &cursor)
        }
        return n == 91 ? Array(der[26..<91]) : nil
    }

    static func derive(_ mine: OpaquePointer, _ peer: OpaquePointer) -> [UInt8]? {
        guard let ctx = EVP_PKEY_CTX_new(mine, nil) else { return nil }
        defer { EVP_PKEY_CTX_free(ctx) }
        var length = 32
        var secret = [UInt8](repeating: 0, count: 32)
        guard EVP_PKEY_derive_init(ctx) == 1, EVP_PKEY_derive_set_peer(ctx, peer) == 1,
            EVP_PKEY_derive(ctx, &secret, &length) == 1, length == 32
        else {
            ERR_clear_error()
            return nil
        }
        return secret
    }

    // MARK: VAPID (the push service's side)

    /// Why the `authorization` does not identify the sender for `audience`, or nil.
    static func vapidProblem(_ authorization: String, audience: String, now: Date) -> String? {
        guard authorization.lowercased().hasPrefix("vapid ") else { return "authorization scheme is not vapid" }
        var params: [String: String] = [:]
        for part in authorization.dropFirst(6).split(separator: ",") {
            let p = part.trimmingCharacters(in: .whitespaces)
            if let eq = p.firstIndex(of: "=") { params[String(p[..<eq])] = String(p[p.index(after: eq)...]) }
        }
        guard let token = params["t"], let k = params["k"] else { return "vapid without t= or k=" }
        guard let point = MockProvidersServer.base64URLDecode(k), let key = loadPublic(point) else {
            return "k is not a P-256 public key"
        }
        defer { EVP_PKEY_free(key) }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let h = MockProvidersServer.base64URLDecode(parts[0]),
            let c = MockProvidersServer.base64URLDecode(parts[1]),
            let sig = MockProvidersServer.base64URLDecode(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: Data(h)) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: Data(c)) as? [String: Any]
        else { return "t is not a JWT" }
        guard header["alg"] as? String == "ES256" else { return "alg is not ES256" }
        guard sig.count == 64, verify(key, Array((parts[0] + "." + parts[1]).utf8), sig) else {
            return "signature does not verify under k"
        }
        guard claims["aud"] as? String == audience else { return "aud is not \(audience)" }
        guard let exp = (claims["exp"] as? NSNumber)?.doubleValue else { return "no exp" }
        if exp <= now.timeIntervalSince1970 { return "token expired" }
        if exp > now.timeIntervalSince1970 + 24 * 3600 + 60 { return "exp more than 24 hours ahead" }
        guard let sub = claims["sub"] as? String, sub.hasPrefix("mailto:") || sub.hasPrefix("https:") else {
            return "sub missing or not mailto:/https:"
        }
        return nil
    }

    static func verify(_ key: OpaquePointer, _ message: [UInt8], _ raw: [UInt8]) -> Bool {
        guard let sig = ECDSA_SIG_new() else { return false }
        defer { ECDSA_SIG_free(sig) }
        let r = BN_bin2bn(raw, 32, nil)
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        guard let r, let s, ECDSA_SIG_set0(sig, r, s) == 1 else { return false }
        let n = i2d_ECDSA_SIG(sig, nil)
        guard n > 0 else { return false }
        var der = [UInt8](repeating: 0, count: Int(n))
        _ = der.withUnsafeMutableBufferPointer { buf -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buf.baseAddress
            return i2d_ECDSA_SIG(sig, &cursor)
        }
        guard let md = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(md) }
        let ok =
            EVP_DigestVerifyInit(md, nil, EVP_sha256(), nil, key) == 1
            && EVP_DigestVerify(md, der, der.count, message, message.count) == 1
        ERR_clear_error()
        return ok
    }
}

extension MockProvidersServer {
    /// The subscription `/wp/<id>` decrypts with: given in memory, else read from `<id>.json` in
    /// `webPushKeyDirectory` (`{"private_key": "<PEM>", "auth": "<base64url>"}`, optionally `"max_body"`: the
    /// largest body it takes, else 4096).
    func webPushSubscription(_ id: String) -> MockWebPushSubscription? {
        if let given = webPushSubscriptions(id) { return given }
        guard let dir = configuration.webPushKeyDirectory, !id.contains("/"), !id.hasPrefix("."),
            let data = FileManager.default.contents(atPath: dir + "/" + id + ".json"),
            let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
            let pem = object["private_key"] as? String, let authText = object["auth"] as? String,
            let auth = Self.base64URLDecode(authText)
        else { return nil }
        return MockWebPushSubscription(
            privateKeyPEM: pem, auth: auth, maxBody: (object["max_body"] as? NSNumber)?.intValue ?? 4096)
    }

    /// Whether `/wp/<id>` is marked gone (in memory, or by a file `<id>.gone` in `webPushKeyDirectory`).
    func webPushGone(_ id: String) -> Bool {
        if webPushMarkedGone(id) { return true }
        guard let dir = configuration.webPushKeyDirectory, !id.contains("/") else { return false }
        return FileManager.default.fileExists(atPath: dir + "/" + id + ".gone")
    }

    /// Answers one Web Push request and records it (endpoint `webpush`, target the subscription id, body the
    /// decrypted message, the TTL, Urgency and Topic headers, and the encrypted body as received).
    func webPushAnswer(path: String, headers: [String: String], body: [UInt8]) -> (Int, String) {
        let id = String(path.dropFirst("/wp/".count).prefix { $0 != "?" })
        let outcome = MockWebPush.answer(
            id: id, headers: headers, body: body, origin: "https://\(configuration.host):\(port)",
            subscription: webPushSubscription(id), gone: webPushGone(id), now: Date())
        var kept: [String: String] = [:]
        for name in ["ttl", "urgency", "topic", "content-encoding"] { kept[name] = headers[name] }
        record(
            MockAnswer(
                endpoint: .webpush, status: outcome.status, reason: outcome.reason, target: id,
                body: outcome.plaintext, authorization: headers["authorization"], headers: kept, received: body))
        return (outcome.status, outcome.reason)
    }
}
