// The translator client (LibreTranslate's POST /translate over libcurl, HTTP/1.1, TLS) against the stand-in's
// /translate: a translation, and each failure the push then goes out without (403, 500, a timeout, a refused
// connection, an answer that is not LibreTranslate's). And the stand-in's own checks, which are LibreTranslate's.

import Foundation
import HeraldCore
import HeraldHTTP
import HeraldMockProviders
import HeraldTestSupport
import Testing

@Suite("Translator client against the stand-in", .serialized)
struct TranslateClientTests {
    static func standIn(_ pki: ProviderPKI, apiKey: String? = nil) throws -> MockProvidersServer {
        _ = ignoreSIGPIPE
        var configuration = MockProvidersConfiguration(
            certificatePath: pki.cert, privateKeyPath: pki.key, projectID: pki.project, clientEmail: pki.clientEmail,
            servicePublicKeyPath: pki.serviceKey)
        configuration.translateAPIKey = apiKey
        let server = try MockProvidersServer(configuration: configuration)
        try server.start()
        return server
    }

    static func endpoint(
        _ server: MockProvidersServer, key: String? = nil, deadline: Duration = .seconds(2), path: String = ""
    ) -> TranslateEndpoint {
        let policy = TranslatorPolicy(url: "https://127.0.0.1:\(server.port)\(path)")
        return TranslateEndpoint(url: policy.endpoint, apiKey: key, deadline: deadline)
    }

    @Test("a translation: the stand-in's dictionary, else its marked fallback; the request is LibreTranslate's")
    func translated() async throws {
        let pki = try ProviderPKI()
        let server = try Self.standIn(pki, apiKey: "k-123")
        defer { server.stop() }
        let client = try TranslateClient(configuration: HTTP1ClientConfiguration(trustedCAFile: pki.cert))
        let endpoint = Self.endpoint(server, key: "k-123")
        let known = await client.translate("Good night", source: "en", target: "fr", at: endpoint)
        let other = await client.translate("Hello there", source: "auto", target: "de", at: endpoint)
        await client.shutdown()
        #expect(known == .success("Bonne nuit"))
        #expect(other == .success("[de] Hello there"))
        let asked = server.recorded(.translate)
        #expect(asked.map(\.status) == [200, 200] && asked.map(\.target) == ["fr", "de"])
        let body = try #require(try JSONSerialization.jsonObject(with: Data(asked[0].body)) as? [String: String])
        #expect(body == ["q": "Good night", "source": "en", "target": "fr", "format": "text", "api_key": "k-123"])
    }

    @Test("a wrong or missing API key is 403: failed with the status")
    func forbidden() async throws {
        let pki = try ProviderPKI()
        let server = try Self.standIn(pki, apiKey: "k-123")
        defer { server.stop() }
        let client = try TranslateClient(configuration: HTTP1ClientConfiguration(trustedCAFile: pki.cert))
        let wrong = await client.translate(
            "Good night", source: "en", target: "fr", at: Self.endpoint(server, key: "nope"))
        let none = await client.translate("Good night", source: "en", target: "fr", at: Self.endpoint(server))
        await client.shutdown()
        #expect(wrong == .failure(.status(403)) && none == .failure(.status(403)))
        #expect(server.recorded(.translate).map(\.reason) == ["Invalid API key", "Invalid API key"])
    }

    @Test("a 500 is failed with the status; the next call is answered")
    func serverError() async throws {
        let pki = try ProviderPKI()
        let server = try Self.standIn(pki)
        defer { server.stop() }
        server.injectTranslateFaults([MockFault(status: 500)])
        let client = try TranslateClient(configuration: HTTP1ClientConfiguration(trustedCAFile: pki.cert))
        let first = await client.translate("Good night", source: "en", target: "fr", at: Self.endpoint(server))
        let second = await client.translate("Good night", source: "en", target: "fr", at: Self.endpoint(server))
        await client.shutdown()
        #expect(first == .failure(.status(500)) && second == .success("Bonne nuit"))
    }

    @Test("an answer later than the deadline is a timeout")
    func timeout() async throws {
        let pki = try ProviderPKI()
        let server = try Self.standIn(pki)
        defer { server.stop() }
        server.injectTranslateFaults([MockFault(status: 200, delay: .seconds(3))])
        let client = try TranslateClient(configuration: HTTP1ClientConfiguration(trustedCAFile: pki.cert))
        let outcome = await client.translate(
            "Good night", source: "en", target: "fr", at: Self.endpoint(server, deadline: .milliseconds(300)))
        await client.shutdown()
        #expect(outcome == .failure(.timeout))
    }

    @Test("nothing listening: unreachable; a 2xx that is not LibreTranslate's JSON: a bad answer")
    func unreachableAndBadAnswer() async throws {
        let pki = try ProviderPKI()
        let server = try Self.standIn(pki)
        defer { server.stop() }
        let client = try TranslateClient(configuration: HTTP1ClientConfiguration(trustedCAFile: pki.cert))
        let closed = TranslateEndpoint(url: "https://127.0.0.1:\(try freePort())/translate", deadline: .seconds(2))
        let refused = await client.translate("Good night", source: "en", target: "fr", at: closed)
        // The webhook receiver answers 200 {"ok":true}.
        let webhook = TranslateEndpoint(
            url: "https://127.0.0.1:\(server.port)/webhook/custom-1", deadline: .seconds(2))
        let bad = await client.translate("Good night", source: "en", target: "fr", at: webhook)
        await client.shutdown()
        #expect(refused == .failure(.unreachable))
        #expect(bad == .failure(.badAnswer))
    }

    @Test(
        "the stand-in checks what LibreTranslate checks: a JSON object, q, source and target, known languages, the method"
    )
    func standInChecks() async throws {
        let pki = try ProviderPKI()
        let server = try Self.standIn(pki)
        defer { server.stop() }
        let http = try HTTP1Client(configuration: HTTP1ClientConfiguration(trustedCAFile: pki.cert))
        let url = "https://127.0.0.1:\(server.port)/translate"
        func post(
            _ body: String, contentType: String = "application/json", method: String = "POST"
        ) async -> (
            Int?, String
        ) {
            let r = await http.send(
                HTTPRequest(
                    url: url, method: method, headers: [("Content-Type", contentType)], body: Array(body.utf8)))
            return (r.status, String(decoding: r.body, as: UTF8.self))
        }
        let rows: [(String, String, Int, String)] = [
            ("no q", #"{"source":"en","target":"fr"}"#, 400, "missing q parameter"),
            ("empty q", #"{"q":"","source":"en","target":"fr"}"#, 400, "missing q parameter"),
            ("no source", #"{"q":"Hi","target":"fr"}"#, 400, "missing source parameter"),
            ("no target", #"{"q":"Hi","source":"en"}"#, 400, "missing target parameter"),
            ("unknown target", #"{"q":"Hi","source":"en","target":"xx"}"#, 400, "xx is not supported"),
            ("unknown source", #"{"q":"Hi","source":"yy","target":"fr"}"#, 400, "yy is not supported"),
            ("bad format", #"{"q":"Hi","source":"en","target":"fr","format":"pdf"}"#, 400, "format"),
            ("not an object", #"["Hi"]"#, 400, "JSON object"),
        ]
        for (name, body, status, message) in rows {
            let (got, text) = await post(body)
            #expect(got == status, "\(name): \(got ?? 0) \(text)")
            #expect(text.contains(message), "\(name): \(text)")
        }
        #expect(await post(#"q=Hi&source=en&target=fr"#, contentType: "application/x-www-form-urlencoded").0 == 400)
        #expect(await post("", method: "GET").0 == 405)
        // A list of texts is answered with a list, and auto detection names a language.
        let (status, text) = await post(#"{"q":["Bye!","Good night"],"source":"auto","target":"fr"}"#)
        await http.shutdown()
        #expect(status == 200)
        let answer = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        #expect(answer["translatedText"] as? [String] == ["Au revoir !", "Bonne nuit"])
        #expect((answer["detectedLanguage"] as? [[String: Any]])?.count == 2)
    }
}
