// Web Push encryption (RFC 8291, aes128gcm) against the RFC's worked example and in round trips; VAPID tokens
// (RFC 8292) checked by Python's `cryptography`, independently of the signer, and by the push-service-side check.
import Foundation
import HeraldPushProviders
import HeraldTestSupport
import Testing

private func b64(_ text: String) -> [UInt8] { WebPushBase64URL.decode(text)! }

/// RFC 8291 Appendix A.
private enum RFC8291 {
    static let plaintext = Array("When I grow up, I want to be a watermelon".utf8)
    static let asPrivate = b64("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw")
    static let asPublic = b64("BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8")
    static let uaPrivate = b64("q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94")
    static let uaPublic = b64("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4")
    static let salt = b64("DGv6ra1nlYgDCS1FRnbzlw")
    static let auth = b64("BTBZMqHH6r4Tts7J_aSIgg")
    static let body = b64(
        "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A"
            + "_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN")
}

struct WebPushCryptoTests {
    @Test func keysFromScalarsHaveTheRFCsPublicPoints() throws {
        #expect(try WebPushP256Key(privateScalar: RFC8291.asPrivate).publicPoint == RFC8291.asPublic)
        #expect(try WebPushP256Key(privateScalar: RFC8291.uaPrivate).publicPoint == RFC8291.uaPublic)
    }

    @Test func encryptionReproducesTheRFCExampleByteForByte() throws {
        let body = try WebPushCrypto.encrypt(
            RFC8291.plaintext, uaPublic: RFC8291.uaPublic, authSecret: RFC8291.auth,
            ephemeral: try WebPushP256Key(privateScalar: RFC8291.asPrivate), salt: RFC8291.salt)
        #expect(WebPushBase64URL.encode(body) == WebPushBase64URL.encode(RFC8291.body))
        #expect(body.count == RFC8291.plaintext.count + WebPushCrypto.overheadBytes)
    }

    @Test func decryptionReadsTheRFCExample() throws {
        let ua = try WebPushP256Key(privateScalar: RFC8291.uaPrivate)
        let plain = try WebPushCrypto.decrypt(RFC8291.body, uaPrivate: ua, authSecret: RFC8291.auth)
        #expect(plain == RFC8291.plaintext)
    }

    @Test(arguments: [0, 1, 100, 1000, WebPushCrypto.maxPlaintextBytes])
    func roundTripWithFreshKeys(length: Int) throws {
        let ua = try WebPushP256Key.generate()
        var auth = [UInt8](repeating: 0, count: 16)
        for i in auth.indices { auth[i] = UInt8(truncatingIfNeeded: i * 37 + length) }
        let plaintext = (0..<length).map { UInt8(truncatingIfNeeded: $0 * 7 + 3) }
        let body = try WebPushCrypto.encrypt(plaintext, uaPublic: ua.publicPoint, authSecret: auth)
        #expect(body.count == length + WebPushCrypto.overheadBytes)
        #expect(body.count <= WebPushCrypto.maxBodyBytes)
        #expect(Array(body[16..<21]) == [0x00, 0x00, 0x10, 0x00, 65], "rs 4096 big-endian, idlen 65")
        #expect(try WebPushCrypto.decrypt(body, uaPrivate: ua, authSecret: auth) == plaintext)
        // A fresh ephemeral key and salt each time: the same message never encrypts to the same body.
        let again = try WebPushCrypto.encrypt(plaintext, uaPublic: ua.publicPoint, authSecret: auth)
        #expect(again != body)
        #expect(Array(again[21..<86]) != Array(body[21..<86]))
    }

    @Test func tamperingOrWrongSecretsFailToDecrypt() throws {
        let ua = try WebPushP256Key(privateScalar: RFC8291.uaPrivate)
        var flipped = RFC8291.body
        flipped[flipped.count - 20] ^= 1
        #expect(throws: WebPushError.self) {
            try WebPushCrypto.decrypt(flipped, uaPrivate: ua, authSecret: RFC8291.auth)
        }
        var otherAuth = RFC8291.auth
        otherAuth[0] ^= 1
        #expect(throws: WebPushError.self) {
            try WebPushCrypto.decrypt(RFC8291.body, uaPrivate: ua, authSecret: otherAuth)
        }
        let stranger = try WebPushP256Key.generate()
        #expect(throws: WebPushError.self) {
            try WebPushCrypto.decrypt(RFC8291.body, uaPrivate: stranger, authSecret: RFC8291.auth)
        }
        #expect(throws: WebPushError.self) {
            try WebPushCrypto.decrypt(Array(RFC8291.body.prefix(50)), uaPrivate: ua, authSecret: RFC8291.auth)
        }
    }

    @Test func badSubscriptionKeysAreRefused() throws {
        var offCurve = RFC8291.uaPublic
        offCurve[40] ^= 1
        #expect(throws: WebPushError.self) { try WebPushP256Key(publicPoint: offCurve) }
        #expect(throws: WebPushError.self) { try WebPushP256Key(publicPoint: Array(RFC8291.uaPublic.prefix(33))) }
        #expect(throws: WebPushError.self) {
            try WebPushCrypto.encrypt([1], uaPublic: RFC8291.uaPublic, authSecret: Array(RFC8291.auth.prefix(8)))
        }
        #expect(throws: WebPushError.self) {
            try WebPushCrypto.encrypt(
                [UInt8](repeating: 0, count: 4080), uaPublic: RFC8291.uaPublic, authSecret: RFC8291.auth)
        }
    }

    @Test func base64URL() {
        #expect(WebPushBase64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(WebPushBase64URL.decode("-_8") == [0xFB, 0xFF])
        #expect(WebPushBase64URL.decode("-_8=") == [0xFB, 0xFF])
        #expect(WebPushBase64URL.decode("+/8") == nil, "standard base64 is not base64url")
        #expect(WebPushBase64URL.decode("a") == nil)
    }
}

struct WebPushVAPIDTests {
    static let endpoint = "https://push.example.net:8443/wp/AbC123?x=1"

    func vapid(_ pki: PKI, subject: String = "mailto:ops@example.com") throws -> WebPushVAPID {
        try WebPushVAPID(pemFile: pki.providerKey, subject: subject)
    }

    @Test func tokenVerifiesIndependently() async throws {
        let pki = try await PKI.make()
        let now = Date(timeIntervalSince1970: 1_800_000_000.7)
        let header = try vapid(pki).authorization(endpoint: Self.endpoint, now: now)
        let match = try #require(header.wholeMatch(of: /vapid t=([A-Za-z0-9_.-]+), k=([A-Za-z0-9_-]+)/))
        let parts = try await JWTTests().verify(String(match.1), publicKey: pki.providerPublicKey)
        #expect(parts["header"]?["alg"] as? String == "ES256")
        #expect(parts["claims"]?["aud"] as? String == "https://push.example.net:8443")
        let exp = (parts["claims"]?["exp"] as? NSNumber)?.int64Value
        #expect(exp == Int64(1_800_043_200), "12 hours after the whole second")
        #expect(parts["claims"]?["sub"] as? String == "mailto:ops@example.com")
        // k is the key's public point: the same as the public PEM's, read by openssl.
        let der = try await runToolAsync(
            "openssl",
            ["pkey", "-pubin", "-in", pki.providerPublicKey, "-outform", "DER", "-out", pki.dir + "/vapid.der"])
        #expect(der.status == 0)
        let spki = [UInt8](try Data(contentsOf: URL(fileURLWithPath: pki.dir + "/vapid.der")))
        #expect(WebPushBase64URL.decode(String(match.2)) == Array(spki.suffix(65)))
    }

    @Test func lifetimeIsCappedAt24Hours() async throws {
        let pki = try await PKI.make()
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let header = try vapid(pki).authorization(endpoint: Self.endpoint, now: now, lifetime: 7 * 24 * 3600)
        let token = String(try #require(header.wholeMatch(of: /vapid t=([^,]+), k=.*/)).1)
        let claims = try await JWTTests().verify(token, publicKey: pki.providerPublicKey)["claims"]
        let exp = (claims?["exp"] as? NSNumber)?.int64Value
        #expect(exp == Int64(1_800_086_400), "24 hours, not 7 days")
        #expect(throws: Never.self) {
            try WebPushVAPID.verify(authorization: header, audience: "https://push.example.net:8443", now: now).get()
        }
    }

    @Test func pushServiceSideCheck() async throws {
        let pki = try await PKI.make()
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let v = try vapid(pki)
        let header = try v.authorization(endpoint: Self.endpoint, now: now)
        let origin = "https://push.example.net:8443"
        #expect(try WebPushVAPID.verify(authorization: header, audience: origin, now: now).get() == v.publicKey)
        func reason(_ h: String, audience: String = origin, at: Date = now) -> String? {
            if case .failure(let e) = WebPushVAPID.verify(authorization: h, audience: audience, now: at) {
                return e.reason
            }
            return nil
        }
        #expect(reason(header, audience: "https://other.example.net")?.contains("aud") == true)
        #expect(reason(header, at: now.addingTimeInterval(13 * 3600))?.contains("expired") == true)
        let far = try v.token(audience: origin, expiresAt: now.addingTimeInterval(25 * 3600))
        #expect(reason("vapid t=\(far), k=\(v.publicKey)")?.contains("24 hours") == true)
        // Signed by another key than k names.
        let other = try WebPushVAPID(pemFile: pki.otherProviderKey, subject: "mailto:ops@example.com")
        let forged = try other.token(audience: origin, expiresAt: now.addingTimeInterval(3600))
        #expect(reason("vapid t=\(forged), k=\(v.publicKey)")?.contains("signature") == true)
        #expect(reason("Bearer abc") != nil)
        #expect(reason("vapid t=abc, k=\(v.publicKey)") != nil)
        #expect(reason("vapid k=\(v.publicKey)") != nil)
    }

    @Test func subjectsOriginsAndKeys() async throws {
        let pki = try await PKI.make()
        #expect(WebPushVAPID.subjectProblem("mailto:a@b.example") == nil)
        #expect(WebPushVAPID.subjectProblem("https://chat.example.com/contact") == nil)
        #expect(WebPushVAPID.subjectProblem("ops@example.com") != nil)
        #expect(WebPushVAPID.subjectProblem("http://chat.example.com") != nil)
        #expect(throws: WebPushError.self) { try vapid(pki, subject: "nobody") }
        #expect(
            WebPushVAPID.origin(ofEndpoint: "https://FCM.googleapis.com/fcm/send/x") == "https://fcm.googleapis.com")
        #expect(WebPushVAPID.origin(ofEndpoint: "https://h.example:443/p") == "https://h.example")
        #expect(WebPushVAPID.origin(ofEndpoint: "https://127.0.0.1:9443/p") == "https://127.0.0.1:9443")
        #expect(WebPushVAPID.origin(ofEndpoint: "http://h.example/p") == nil)
        #expect(WebPushVAPID.origin(ofEndpoint: "not a url") == nil)
        #expect(throws: WebPushError.self) { try WebPushVAPID(pem: "not a key", subject: "mailto:a@b.example") }
        // A 256-bit key on another curve is not a VAPID key.
        let k1 = pki.dir + "/secp256k1.pem"
        let made = try await runToolAsync(
            "openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:secp256k1", "-out", k1])
        #expect(made.status == 0)
        do {
            _ = try WebPushVAPID(pemFile: k1, subject: "mailto:a@b.example")
            Issue.record("a secp256k1 key was taken as a VAPID key")
        } catch {
            #expect(error.reason.contains("not an EC P-256 key"), "\(error)")
        }
        #expect(throws: WebPushError.self) {
            try WebPushVAPID(pemFile: pki.dir + "/missing.pem", subject: "mailto:a@b.example")
        }
        // The private key never shows: not in the description, not in an error.
        let pem = try String(contentsOfFile: pki.providerKey, encoding: .utf8)
        let body = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
        let v = try vapid(pki)
        #expect(!String(describing: v).contains(body.prefix(24)))
        #expect(!"\(v)".contains("PRIVATE"))
        // A generated key's PEM loads back to the same public point.
        let fresh = try WebPushP256Key.generate()
        #expect(try WebPushP256Key(pem: try fresh.privatePEM(), keyName: "k").publicPoint == fresh.publicPoint)
    }
}
