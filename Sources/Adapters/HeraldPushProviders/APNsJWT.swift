import Foundation
import HeraldCore

/// Makes APNs provider tokens: `{"alg":"ES256","kid":KEY}.{"iss":TEAM,"iat":SECONDS}.sig`.
public struct APNsJWT: Sendable {
    public let keyID: String
    public let teamID: String
    private let signer: JWTSigner

    public init(keyID: String, teamID: String, p8PEM: String) throws(APNsError) {
        self.keyID = keyID
        self.teamID = teamID
        self.signer = try JWTSigner(pem: p8PEM, algorithm: .es256, keyName: "the .p8 key")
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
