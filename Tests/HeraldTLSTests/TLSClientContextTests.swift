import COpenSSL
import HeraldTLS
import Testing

@Suite("The shared TLS client context")
struct TLSClientContextTests {
    @Test(
        "a server name OpenSSL cannot check is refused before any handshake",
        arguments: ["", String(repeating: "a", count: 256), "two words", "tab\there", "nul\u{0}byte"])
    func unusableNamesRefused(name: String) throws {
        let context = try TLSClientContext(trustedCAFile: nil)
        #expect(throws: TLSSetupError.self) { try context.session(verifying: name) }
    }

    @Test(
        "DNS names and IP literals give a session that verifies them",
        arguments: ["api.push.apple.com", "127.0.0.1", "::1"])
    func usableNames(name: String) throws {
        let context = try TLSClientContext(trustedCAFile: nil)
        let ssl = try context.session(verifying: name)
        SSL_free(ssl)
    }

    @Test("a client certificate without its key, or a key without its certificate, is refused")
    func certificateNeedsKey() throws {
        #expect(throws: TLSSetupError.self) { try TLSClientContext(trustedCAFile: nil, certificateFile: "/c.pem") }
        #expect(throws: TLSSetupError.self) { try TLSClientContext(trustedCAFile: nil, privateKeyFile: "/k.pem") }
    }
}
