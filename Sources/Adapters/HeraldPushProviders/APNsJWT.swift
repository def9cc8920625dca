import Foundation
import HeraldCore

/// Makes APNs provider tokens: `{"alg":"ES256","kid":KEY}.{"iss":TEAM,"iat":SECONDS}.sig`.
public struct APNsJWT: Sendable {
    public let keyID: String
    public let teamID: String
    private let signer: JWTSigner

    public init(keyID: String, teamID: String, p8PEM: String) throws(PushError) {
        self.keyID = keyID
        self.teamID = teamID
        self.signer = try JWTSigner(pem: p8PEM, algorithm: .es256, keyName: "the .p8 key")
    }

    /// A signed token issued at `issuedAt` (whole seconds since the epoch are used).
    public func token(issuedAt: Date) throws(PushError) -> String {
        let header = #"{"alg":"ES256","kid":"\#(JWTEncoding.jsonEscape(keyID))"}"#
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        let claims = #"{"iss":"\#(JWTEncoding.jsonEscape(teamID))","iat":\#(iat)}"#
        let signingInput = JWTEncoding.base64URL(Array(header.utf8)) + "." + JWTEncoding.base64URL(Array(claims.utf8))
        let signature = try signer.sign(Array(signingInput.utf8))
        return signingInput + "." + JWTEncoding.base64URL(signature)
    }
}
