import Foundation
import HeraldPushProviders
import HeraldTestSupport
import Testing

@Suite("FCM service accounts")
struct ServiceAccountTests {
    static func json(tokenURI: String?, key: String = "-----BEGIN PRIVATE KEY-----") throws -> [UInt8] {
        var object: [String: Any] = [
            "type": "service_account", "project_id": "p", "client_email": "a@p.iam.gserviceaccount.com",
            "private_key": key,
        ]
        if let tokenURI { object["token_uri"] = tokenURI }
        return Array(try JSONSerialization.data(withJSONObject: object))
    }

    @Test(
        "a token_uri that is not https:// with a host is refused",
        arguments: ["http://oauth2.example.com/token", "ftp://oauth2.example.com/token", "https:///token", "token"])
    func cleartextTokenURIRefused(uri: String) throws {
        #expect {
            try FCMServiceAccount.parse(try Self.json(tokenURI: uri))
        } throws: { error in
            (error as? PushError)?.description.contains("token_uri must be an https:// URL") == true
        }
    }

    @Test("https:// and the default endpoint are accepted; http:// only when a test allows it")
    func acceptedTokenURIs() throws {
        #expect(
            try FCMServiceAccount.parse(try Self.json(tokenURI: "https://127.0.0.1:8443/token")).tokenURI
                == "https://127.0.0.1:8443/token")
        #expect(
            try FCMServiceAccount.parse(try Self.json(tokenURI: nil)).tokenURI == "https://oauth2.googleapis.com/token")
        let cleartext = try FCMServiceAccount.parse(
            try Self.json(tokenURI: "http://127.0.0.1:8080/token"), allowCleartextTokenURI: true)
        #expect(cleartext.tokenURI == "http://127.0.0.1:8080/token")
    }

    @Test("an FCM assertion needs an RSA key: an EC key is refused with a reason that names the key, not its bytes")
    func assertionNeedsRSA() throws {
        let dir = NSTemporaryDirectory() + "herald-sa-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try runToolChecked(
            "/usr/bin/openssl",
            ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", dir + "/ec.pem"])
        let pem = try String(contentsOfFile: dir + "/ec.pem", encoding: .utf8)
        let account = try FCMServiceAccount.parse(try Self.json(tokenURI: nil, key: pem))
        #expect {
            try FCMAssertion(account: account)
        } throws: { error in
            let text = (error as? PushError)?.description ?? ""
            return text.contains("private_key is not an RSA key") && !text.contains("PRIVATE KEY")
        }
    }
}
