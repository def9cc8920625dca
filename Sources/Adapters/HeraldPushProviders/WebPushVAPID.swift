// Voluntary Application Server Identification (RFC 8292): an ES256 JWT naming the push service's origin, an expiry
// within 24 hours and a contact, sent as `Authorization: vapid t=<jwt>, k=<public key>`. The verification is the
// push service's side, for the tests and tools that check what was sent.
import COpenSSL
import Foundation

/// One application server's VAPID identity: its P-256 key (from a PEM file; the private key is never written out)
/// and its contact (`mailto:` or an `https:` URL).
public struct WebPushVAPID: Sendable, CustomStringConvertible {
    /// The longest a token may live (RFC 8292 §2: no more than 24 hours from the request).
    public static let maxLifetime: TimeInterval = 24 * 3600
    /// What Herald asks for: 12 hours, well inside what push services take.
    public static let defaultLifetime: TimeInterval = 12 * 3600

    public let subject: String
    /// `k`: the uncompressed public point, base64url (the browser's `applicationServerKey`).
    public let publicKey: String
    private let signer: JWTSigner

    /// Loads the key from PEM text. `keyName` names it in errors (never its bytes).
    public init(pem: String, subject: String, keyName: String = "the VAPID key") throws(WebPushError) {
        if let problem = Self.subjectProblem(subject) { throw WebPushError(problem) }
        let key = try WebPushP256Key(pem: pem, keyName: keyName)
        do {
            signer = try JWTSigner(pem: pem, algorithm: .es256, keyName: keyName)
        } catch {
            throw WebPushError(error.message)
        }
        self.subject = subject
        self.publicKey = WebPushBase64URL.encode(key.publicPoint)
    }

    /// Reads the PEM file at `path`.
    public init(pemFile path: String, subject: String) throws(WebPushError) {
        guard let pem = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw WebPushError("cannot read the VAPID key file \(path)")
        }
        try self.init(pem: pem, subject: subject, keyName: "the VAPID key file \(path)")
    }

    public var description: String { "VAPID(k=\(publicKey), sub=\(subject))" }

    /// What is wrong with a `sub` claim, or nil: it is a `mailto:` address or an `https:` URL.
    public static func subjectProblem(_ subject: String) -> String? {
        let lower = subject.lowercased()
        if lower.hasPrefix("mailto:"), subject.count > 7, subject.contains("@") { return nil }
        if lower.hasPrefix("https://"), subject.count > 8 { return nil }
        return "the VAPID subject is a mailto: address or an https: URL"
    }

    /// The origin (`https://host[:port]`, the port only when not 443) of an `https` endpoint, or nil.
    public static func origin(ofEndpoint endpoint: String) -> String? {
        guard let components = URLComponents(string: endpoint), components.scheme?.lowercased() == "https",
            let host = components.host?.lowercased(), !host.isEmpty
        else { return nil }
        let shownHost = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        if let port = components.port, port != 443 { return "https://\(shownHost):\(port)" }
        return "https://\(shownHost)"
    }

    /// A signed token for `audience` (an origin) that expires at `expiresAt` (whole seconds).
    public func token(audience: String, expiresAt: Date) throws(WebPushError) -> String {
        let header = #"{"typ":"JWT","alg":"ES256"}"#
        let exp = Int64(expiresAt.timeIntervalSince1970.rounded(.down))
        let claims =
            #"{"aud":"\#(JWTEncoding.jsonEscape(audience))","exp":\#(exp),"sub":"\#(JWTEncoding.jsonEscape(subject))"}"#
        let input = WebPushBase64URL.encode(Array(header.utf8)) + "." + WebPushBase64URL.encode(Array(claims.utf8))
        do {
            return input + "." + WebPushBase64URL.encode(try signer.sign(Array(input.utf8)))
        } catch {
            throw WebPushError(error.message)
        }
    }

    /// The `Authorization` header value for a message to `endpoint`, the token living `lifetime` from `now`
    /// (capped at 24 hours).
    public func authorization(
        endpoint: String, now: Date, lifetime: TimeInterval = defaultLifetime
    )
        throws(WebPushError) -> String
    {
        guard let audience = Self.origin(ofEndpoint: endpoint) else {
            throw WebPushError("the endpoint is not an https URL")
        }
        let expiresAt = now.addingTimeInterval(min(max(lifetime, 60), Self.maxLifetime))
        return "vapid t=\(try token(audience: audience, expiresAt: expiresAt)), k=\(publicKey)"
    }

    /// What a push service checks (RFC 8292 §2-3): the header's form, the ES256 signature under `k`, `aud` equal to
    /// `audience`, `exp` after `now` and at most 24 hours ahead, `sub` present. Returns `k` when it verifies.
    public static func verify(authorization: String, audience: String, now: Date) -> Result<String, WebPushError> {
        guard authorization.lowercased().hasPrefix("vapid ") else {
            return .failure(WebPushError("the Authorization scheme is not vapid"))
        }
        var params: [String: String] = [:]
        for part in authorization.dropFirst(6).split(separator: ",") {
            let trimmed = part.trimmingCharacters(in: .whitespaces)
            guard let eq = trimmed.firstIndex(of: "=") else { continue }
            params[String(trimmed[..<eq]).lowercased()] = String(trimmed[trimmed.index(after: eq)...])
        }
        guard let token = params["t"], let k = params["k"] else {
            return .failure(WebPushError("the vapid Authorization has no t= or no k="))
        }
        guard let point = WebPushBase64URL.decode(k), let key = try? WebPushP256Key(publicPoint: point) else {
            return .failure(WebPushError("k is not a P-256 public key"))
        }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let headerBytes = WebPushBase64URL.decode(parts[0]),
            let claimBytes = WebPushBase64URL.decode(parts[1]), let signature = WebPushBase64URL.decode(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any]
        else {
            return .failure(WebPushError("the token is not a JWT"))
        }
        guard header["alg"] as? String == "ES256" else { return .failure(WebPushError("the token is not ES256")) }
        guard signature.count == 64,
            verifyES256(key: key, message: Array((parts[0] + "." + parts[1]).utf8), raw: signature)
        else {
            return .failure(WebPushError("the token's signature does not verify under k"))
        }
        guard claims["aud"] as? String == audience else {
            return .failure(WebPushError("aud is not the push service's origin \(audience)"))
        }
        guard let exp = (claims["exp"] as? NSNumber)?.doubleValue else {
            return .failure(WebPushError("the token has no exp"))
        }
        let at = now.timeIntervalSince1970
        guard exp > at else { return .failure(WebPushError("the token has expired")) }
        guard exp <= at + maxLifetime else { return .failure(WebPushError("exp is more than 24 hours ahead")) }
        guard let sub = claims["sub"] as? String, subjectProblem(sub) == nil else {
            return .failure(WebPushError("sub is not a mailto: address or an https: URL"))
        }
        return .success(k)
    }

    /// An ES256 signature in JOSE form (r || s) over `message`, checked with `key`.
    static func verifyES256(key: WebPushP256Key, message: [UInt8], raw: [UInt8]) -> Bool {
        guard let sig = ECDSA_SIG_new() else { return false }
        defer { ECDSA_SIG_free(sig) }
        guard let r = BN_bin2bn(raw, 32, nil) else { return false }
        guard let s = raw.withUnsafeBufferPointer({ BN_bin2bn($0.baseAddress! + 32, 32, nil) }) else {
            BN_free(r)
            return false
        }
        guard ECDSA_SIG_set0(sig, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return false
        }
        let length = i2d_ECDSA_SIG(sig, nil)
        guard length > 0 else { return false }
        var der = [UInt8](repeating: 0, count: Int(length))
        _ = der.withUnsafeMutableBufferPointer { buf -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buf.baseAddress
            return i2d_ECDSA_SIG(sig, &cursor)
        }
        guard let md = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(md) }
        guard EVP_DigestVerifyInit(md, nil, EVP_sha256(), nil, key.pkey) == 1 else {
            ERR_clear_error()
            return false
        }
        let ok = EVP_DigestVerify(md, der, der.count, message, message.count) == 1
        ERR_clear_error()
        return ok
    }
}
