// Provider tokens: verified by Python's `cryptography`, independently of the signer's code;
// renewal with an injected clock.
import Foundation
import HeraldCore
import HeraldPushProviders
import HeraldTestSupport
import Testing

struct JWTTests {
    /// Verifies an ES256 JWT: header, claims, and the raw r||s signature converted to DER.
    static let verifier = """
        import base64, json, sys
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
        def b64(s): return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
        token, pub = sys.stdin.read().strip(), sys.argv[1]
        h, c, s = token.split(".")
        assert "=" not in token, "base64url without padding"
        sig = b64(s)
        assert len(sig) == 64, "raw r||s, got %d bytes" % len(sig)
        der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
        key = serialization.load_pem_public_key(open(pub, "rb").read())
        key.verify(der, (h + "." + c).encode(), ec.ECDSA(hashes.SHA256()))
        print(json.dumps({"header": json.loads(b64(h)), "claims": json.loads(b64(c))}))
        """

    func verify(_ token: String, publicKey: String) async throws -> [String: [String: Any]] {
        let r = try await runToolAsync("python3", ["-c", Self.verifier, publicKey], stdin: token)
        guard r.status == 0,
            let object = try JSONSerialization.jsonObject(with: Data(r.output.utf8)) as? [String: [String: Any]]
        else {
            throw TestFailure.failed("verification failed: \(r.output)")
        }
        return object
    }

    @Test func tokenVerifiesIndependently() async throws {
        let pki = try await PKI.make()
        let jwt = try APNsJWT(
            keyID: pki.keyID, teamID: pki.teamID, p8PEM: try String(contentsOfFile: pki.providerKey, encoding: .utf8))
        let token = try jwt.token(issuedAt: Date(timeIntervalSince1970: 1_732_000_123.9))
        let parts = try await verify(token, publicKey: pki.providerPublicKey)
        #expect(parts["header"]?["alg"] as? String == "ES256")
        #expect(parts["header"]?["kid"] as? String == pki.keyID)
        #expect(parts["claims"]?["iss"] as? String == pki.teamID)
        #expect((parts["claims"]?["iat"] as? NSNumber)?.int64Value == 1_732_000_123)
    }

    @Test func tokenDoesNotVerifyWithAnotherKey() async throws {
        let pki = try await PKI.make()
        let other = try APNsJWT(
            keyID: pki.keyID, teamID: pki.teamID,
            p8PEM: try String(contentsOfFile: pki.otherProviderKey, encoding: .utf8))
        await #expect(throws: TestFailure.self) {
            try await verify(try other.token(issuedAt: Date()), publicKey: pki.providerPublicKey)
        }
    }

    @Test func badKeysAreRejectedWithAReason() async throws {
        let pki = try await PKI.make()
        #expect(throws: PushError.self) { try APNsJWT(keyID: "k", teamID: "t", p8PEM: "not a key") }
        // An RSA key is a PEM private key but cannot make ES256 tokens.
        let rsa = pki.dir + "/rsa.pem"
        _ = try await runToolAsync(
            "openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", rsa])
        #expect(throws: PushError.self) {
            try APNsJWT(keyID: "k", teamID: "t", p8PEM: try String(contentsOfFile: rsa, encoding: .utf8))
        }
        #expect(throws: PushError.self) {
            try APNsClientCredential.token(keyID: "k", teamID: "t", p8Path: pki.dir + "/missing.p8")
        }
    }

    @Test func providerRenewsOnItsClock() async throws {
        let pki = try await PKI.make()
        let clock = TestClock(Date(timeIntervalSince1970: 1_732_000_000))
        let jwt = try APNsJWT(
            keyID: pki.keyID, teamID: pki.teamID, p8PEM: try String(contentsOfFile: pki.providerKey, encoding: .utf8))
        let provider = APNsTokenProvider(jwt: jwt, policy: APNsTokenRenewalPolicy(), now: { clock.now })
        let first = try provider.bearer()
        #expect(first.issuedAt == clock.now)
        clock.advance(49 * 60)
        #expect(try provider.bearer().token == first.token, "kept before 50 minutes")
        #expect(try provider.rejectedAsExpired(issuedAt: first.issuedAt), "renewed: rejected after 20 minutes")
        let second = try provider.bearer()
        #expect(second.token != first.token)
        #expect(second.issuedAt == clock.now)
        clock.advance(10 * 60)
        #expect(try provider.rejectedAsExpired(issuedAt: second.issuedAt) == false, "never renewed within 20 minutes")
        #expect(try provider.bearer().token == second.token)
        #expect(
            try provider.rejectedAsExpired(issuedAt: first.issuedAt),
            "an older token's rejection: a newer one is current")
        clock.advance(40 * 60)
        let third = try provider.bearer()
        #expect(third.token != second.token, "renewed 50 minutes after the second")
        #expect(provider.renewalCount == 3)
        let claims = try await verify(third.token, publicKey: pki.providerPublicKey)["claims"]
        #expect((claims?["iat"] as? NSNumber)?.doubleValue == clock.now.timeIntervalSince1970)
    }

    @Test func endpointParsing() {
        #expect(ServiceEndpoint(parsing: "127.0.0.1:8443") == ServiceEndpoint(host: "127.0.0.1", port: 8443))
        #expect(
            ServiceEndpoint(parsing: "api.push.apple.com") == ServiceEndpoint(host: "api.push.apple.com", port: 443))
        #expect(ServiceEndpoint(parsing: "[::1]:9000") == ServiceEndpoint(host: "::1", port: 9000))
        #expect(ServiceEndpoint(parsing: "host:0") == nil)
        #expect(ServiceEndpoint(parsing: "host:x") == nil)
        #expect(
            ServiceEndpoint(APNsEnvironment.sandbox) == ServiceEndpoint(host: "api.sandbox.push.apple.com", port: 443))
    }
}

struct RenderedRequestTests {
    @Test func renderedRequestBecomesADeliveryWithEveryHeader() {
        let id = APNsID.derive(eventID: "e-9f2c", token: deviceToken(1))
        let rendered = PushRequest(
            token: deviceToken(1), environment: .sandbox, pushType: .voip, topic: "com.example.chat.voip",
            priority: 10, collapseID: "c1", expiration: 1_732_000_000, apnsID: id, payload: alertPayload)
        let d = PushDelivery(rendered, timeout: .seconds(5), tag: 77)
        #expect(d.deviceToken == deviceToken(1))
        #expect(d.topic == "com.example.chat.voip")
        #expect(d.pushType == .voip)
        #expect(d.priority == .immediately)
        #expect(d.collapseID == "c1")
        #expect(d.expiration == 1_732_000_000)
        #expect(d.apnsID == id)
        #expect(d.payload == alertPayload)
        #expect(d.tag == 77)
        #expect(d.deadline > ContinuousClock.now + .seconds(4))
    }

    @Test func derivedIDIsAcceptedAndEchoedByTheStandIn() async throws {
        let pki = try await PKI.make()
        let server = try await startMock(pki)
        defer { server.stop() }
        let c = try client(pki, port: server.port)
        let id = APNsID.derive(eventID: "e-1", token: deviceToken(5))
        let r = await c.send(request(5, apnsID: id))
        #expect(r.status == 200)
        #expect(r.apnsID?.uppercased() == id.uppercased())
        await c.shutdown()
    }

    @Test("the response carries the apns-id the server answered: its own when none was sent")
    func answeredIDWhenNoneWasSent() async throws {
        let pki = try await PKI.make()
        let server = try await startMock(pki)
        defer { server.stop() }
        let c = try client(pki, port: server.port)
        let first = await c.send(request(5))
        let second = await c.send(request(6))
        #expect(first.status == 200)
        let a = try #require(first.apnsID, "the server's apns-id")
        let b = try #require(second.apnsID)
        #expect(UUID(uuidString: a) != nil, "a UUID: \(a)")
        #expect(a != b, "a fresh one per request")
        await c.shutdown()
    }

    @Test func pipelineCredentialEntriesBecomeClientCredentials() async throws {
        let pki = try await PKI.make()
        let token = try APNsClientCredential(
            APNsCredential(
                bundleID: "com.example.chat", teamID: pki.teamID,
                keyID: pki.keyID, keyFile: pki.providerKey))
        guard case .token(let keyID, let teamID, let pem) = token else { Issue.record("expected token auth"); return }
        #expect(keyID == pki.keyID && teamID == pki.teamID && pem.contains("PRIVATE KEY"))
        let p12 = try APNsClientCredential(
            APNsCredential(bundleID: "b", p12File: pki.clientP12, p12PasswordEnv: "P12_PW"),
            environment: ["P12_PW": "s3cret"])
        guard case .pkcs12File(_, let password) = p12 else { Issue.record("expected p12"); return }
        #expect(password == "s3cret")
        #expect(throws: PushError.self) {
            try APNsClientCredential(
                APNsCredential(bundleID: "b", p12File: pki.clientP12, p12PasswordEnv: "UNSET_PW"), environment: [:])
        }
        #expect(throws: PushError.self) { try APNsClientCredential(APNsCredential(bundleID: "b")) }
    }
}
