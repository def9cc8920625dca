// Web Push over the nghttp2 client against the stand-in's push service over real TLS: the stand-in decrypts each
// message with the subscription's private key and checks the VAPID token independently of Herald's code.

import Foundation
import HeraldCore
import HeraldMockProviders
import HeraldPushProviders
import Testing

/// A browser's side of one subscription: its key pair and authentication secret, registered with the stand-in.
struct TestBrowser {
    let id: String
    let key: WebPushP256Key
    let auth: [UInt8]
    let endpoint: String

    init(_ server: MockProvidersServer, id: String) throws {
        self.id = id
        key = try WebPushP256Key.generate()
        auth = (0..<16).map { _ in UInt8.random(in: 0...255) }
        endpoint = "https://127.0.0.1:\(server.port)/wp/\(id)?src=test"
        server.addWebPushSubscription(id: id, MockWebPushSubscription(privateKeyPEM: try key.privatePEM(), auth: auth))
    }

    var device: Device {
        Device(
            token: WebPushSubscription(
                endpoint: endpoint, p256dh: WebPushBase64URL.encode(key.publicPoint),
                auth: WebPushBase64URL.encode(auth)
            ).token, kind: .webpush)
    }
}

@Suite("Web Push client against the stand-in", .serialized)
struct WebPushClientTests {
    static func app() -> AppConfig {
        var app = AppConfig(appID: "app1")
        app.webPush = WebPushSettings(vapidKeyFile: "unused", subject: "mailto:ops@example.com")
        return app
    }

    static func vapid() throws -> WebPushVAPID {
        try WebPushVAPID(pem: try WebPushP256Key.generate().privatePEM(), subject: "mailto:ops@example.com")
    }

    static func render(_ json: String, to browser: TestBrowser) throws -> PushRequest {
        let requests = try Renderer.render(
            event: try ChatEvent.decode(Array(json.utf8)), recipient: "u2",
            state: UserState(devices: [browser.device]), targets: [browser.device], app: app(), now: Date())
        return try #require(requests.first)
    }

    static let message =
        #"{"event_id":"e1","app_id":"app1","kind":"message","created_at":\#(Int64(Date().timeIntervalSince1970 * 1000)),"sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"c1","type":"group","name":"Hiking"},"recipients":["u2"],"message":{"id":"m1","type":"text","text":"Bye!"}}"#
    static let call =
        #"{"event_id":"e2","app_id":"app1","kind":"call","created_at":\#(Int64(Date().timeIntervalSince1970 * 1000)),"sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"c1","type":"direct"},"call":{"action":"initiated","session_id":"s1","type":"audio"}}"#

    func client(
        _ pki: ProviderPKI, _ server: MockProvidersServer, vapid: WebPushVAPID, origin: String? = nil
    ) throws -> WebPushClient {
        try WebPushClient(
            configuration: WebPushClientConfiguration(
                origin: origin ?? "https://127.0.0.1:\(server.port)", vapid: vapid,
                endpoint: ServiceEndpoint(host: "127.0.0.1", port: server.port), trustedCAFile: pki.cert,
                connectTimeout: .seconds(60),
                retry: BackoffPolicy(initialDelay: .milliseconds(20), maxDelay: .milliseconds(200), maxAttempts: 1))
        )
    }

    @Test("a message is delivered (201), decrypts to the rendered payload, with TTL, Urgency and a VAPID token")
    func delivered() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let browser = try TestBrowser(server, id: "sub-1")
        let vapid = try Self.vapid()
        let c = try client(pki, server, vapid: vapid)
        let rendered = try Self.render(Self.message, to: browser)
        let delivery = try WebPushClient.delivery(rendered, timeout: .seconds(60))
        #expect(delivery.payload.count == rendered.payload.count + WebPushCrypto.overheadBytes)
        let r = await c.send(delivery)
        await c.shutdown()
        #expect(r.status == 201 && r.disposition == .delivered, "\(r.reasonText ?? "")")
        let got = try #require(server.recorded(.webpush).first)
        #expect(got.status == 201, "\(got.reason)")
        #expect(got.target == "sub-1")
        #expect(got.body == rendered.payload, "the stand-in decrypted what render wrote")
        #expect(got.headers["content-encoding"] == "aes128gcm")
        #expect(got.headers["urgency"] == "normal")
        #expect(got.headers["topic"] == nil)
        let ttl = try #require(got.headers["ttl"].flatMap(Int.init))
        #expect(ttl > 86_000 && ttl <= 86_400, "TTL \(ttl): the app's expiration from the event time")
        let authorization = try #require(got.authorization)
        #expect(
            try WebPushVAPID.verify(
                authorization: authorization, audience: "https://127.0.0.1:\(server.port)", now: Date()
            ).get() == vapid.publicKey)
        #expect(c.tokenRenewals == 1)
    }

    @Test("a ringing call goes out with Urgency high and its Topic")
    func callHeaders() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let browser = try TestBrowser(server, id: "sub-2")
        let c = try client(pki, server, vapid: try Self.vapid())
        let r = await c.send(try WebPushClient.delivery(try Self.render(Self.call, to: browser), timeout: .seconds(60)))
        await c.shutdown()
        #expect(r.disposition == .delivered)
        let got = try #require(server.recorded(.webpush).first)
        #expect(got.headers["urgency"] == "high")
        #expect(got.headers["topic"] == "call-s1")
        let ttl = try #require(got.headers["ttl"].flatMap(Int.init))
        #expect(ttl <= 30)
    }

    @Test("410 and 404: the subscription is dead; 403: a token for another origin is permanent")
    func refusals() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let gone = try TestBrowser(server, id: "sub-gone")
        server.markWebPushGone(id: "sub-gone")
        let vapid = try Self.vapid()
        let c = try client(pki, server, vapid: vapid)
        let r410 = await c.send(
            try WebPushClient.delivery(try Self.render(Self.message, to: gone), timeout: .seconds(60)))
        #expect(r410.status == 410 && r410.disposition == .tokenDead(unregisteredAt: nil))
        #expect(r410.reasonText?.hasPrefix("SubscriptionGone") == true)
        // A subscription the push service never issued.
        var unknown = try Self.render(Self.message, to: gone)
        unknown.token = unknown.token.replacingOccurrences(of: "/wp/sub-gone", with: "/wp/nobody")
        let r404 = await c.send(try WebPushClient.delivery(unknown, timeout: .seconds(60)))
        await c.shutdown()
        #expect(r404.status == 404 && r404.disposition == .tokenDead(unregisteredAt: nil))

        // The token names another origin than the push service's: 403, permanent, with the service's reason.
        let browser = try TestBrowser(server, id: "sub-3")
        let wrong = try client(pki, server, vapid: vapid, origin: "https://localhost:\(server.port)")
        let r403 = await wrong.send(
            try WebPushClient.delivery(try Self.render(Self.message, to: browser), timeout: .seconds(60)))
        await wrong.shutdown()
        #expect(r403.status == 403)
        guard case .permanentFailure(let reason) = r403.disposition else {
            Issue.record("403 is not permanent: \(r403.disposition)")
            return
        }
        #expect(reason.contains("VapidForbidden") && reason.contains("aud"), "\(reason)")
    }

    @Test("413 for a body over 4,096 bytes and 400 for one that does not decrypt are permanent")
    func badBodies() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let browser = try TestBrowser(server, id: "sub-4")
        let c = try client(pki, server, vapid: try Self.vapid())
        var big = try WebPushClient.delivery(try Self.render(Self.message, to: browser), timeout: .seconds(60))
        big.payload += [UInt8](repeating: 7, count: 4096)
        let r413 = await c.send(big)
        #expect(r413.status == 413)
        #expect(r413.reasonText?.hasPrefix("PayloadTooLarge") == true)
        // Encrypted for another browser's keys.
        let stranger = try TestBrowser(server, id: "sub-5")
        var crossed = try WebPushClient.delivery(try Self.render(Self.message, to: stranger), timeout: .seconds(60))
        crossed.deviceToken = "/wp/sub-4"
        let r400 = await c.send(crossed)
        await c.shutdown()
        #expect(r400.status == 400)
        if case .permanentFailure(let reason) = r400.disposition {
            #expect(reason.contains("decrypt"), "\(reason)")
        } else {
            Issue.record("400 is not permanent: \(r400.disposition)")
        }
        #expect(server.recorded(.webpush).allSatisfy { $0.status != 201 })
    }

    @Test("a subscription whose key is not a P-256 point cannot be encrypted for")
    func badSubscriptionKey() throws {
        var point = try WebPushP256Key.generate().publicPoint
        point[64] ^= 1
        let token = WebPushSubscription(
            endpoint: "https://push.example.net/wp/x", p256dh: WebPushBase64URL.encode(point),
            auth: WebPushBase64URL.encode([UInt8](repeating: 1, count: 16))
        ).token
        let request = PushRequest(
            token: token, environment: .production, pushType: .alert, topic: "", priority: 5, collapseID: nil,
            expiration: 0, apnsID: "", payload: Array("{}".utf8), provider: .webpush)
        #expect(throws: WebPushError.self) { try WebPushClient.delivery(request) }
    }

    @Test("a push service without HTTP/2: the HTTP/2 client says so, and HTTP/1.1 delivers (201), decrypted by it")
    func http1Fallback() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki, http2: false)
        defer { server.stop() }
        let browser = try TestBrowser(server, id: "sub-h1")
        let vapid = try Self.vapid()
        let rendered = try Self.render(Self.message, to: browser)
        let c = try client(pki, server, vapid: vapid)
        let r = await c.send(try WebPushClient.delivery(rendered, timeout: .seconds(20)))
        await c.shutdown()
        #expect(WebPushClient.refusedHTTP2(r), "\(String(describing: r.transportFailure))")
        #expect(server.recorded(.webpush).isEmpty)

        let sender = try WebPushHTTP1Sender(trustedCAFile: pki.cert)
        var answers: [PushResponse] = []
        var gone = try WebPushClient.delivery(rendered, timeout: .seconds(60), tag: 2)
        gone.deviceToken = "/wp/nobody"
        await sender.send(
            [try WebPushClient.delivery(rendered, timeout: .seconds(60), tag: 1), gone],
            origin: "https://127.0.0.1:\(server.port)", vapid: vapid
        ) { answers.append($0) }
        await sender.shutdown()
        let ok = try #require(answers.first { $0.tag == 1 })
        #expect(ok.status == 201 && ok.answer == .delivered, "\(ok.reasonText ?? "")")
        let missing = try #require(answers.first { $0.tag == 2 })
        #expect(missing.status == 404 && missing.answer == .tokenDead(unregisteredAt: nil))
        let got = try #require(server.recorded(.webpush).first { $0.status == 201 })
        #expect(got.body == rendered.payload)
        #expect(got.headers["content-encoding"] == "aes128gcm" && got.headers["urgency"] == "normal")
        #expect((Int(got.headers["ttl"] ?? "") ?? 0) > 86_000)
        #expect(
            try WebPushVAPID.verify(
                authorization: try #require(got.authorization), audience: "https://127.0.0.1:\(server.port)",
                now: Date()
            ).get() == vapid.publicKey)
    }
}
