// Registering a browser's Web Push subscription through the registry API, without a server: the body's
// `subscription` becomes a `webpush` device; malformed subscriptions and push services the app does not allow are
// refused with 400 naming the field, and nothing is published.
import Foundation
import HeraldCore
import HeraldRedis
import HeraldRegistryAPI
import Logging
import Synchronization
import Testing

@Suite("Registry API: Web Push subscriptions")
struct WebPushRegistrationTests {
    final class Sink: RegistryRecordSink {
        let records = Mutex<[RegistryRecord]>([])
        func publish(_ record: RegistryRecord) async throws { records.withLock { $0.append(record) } }
    }

    static let p256dh = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
    static let auth = "BTBZMqHH6r4Tts7J_aSIgg"
    static let token = String(repeating: "a", count: 32)

    static func api(_ sink: Sink) throws -> RegistryAPI {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let connection = RedisConnection(
            configuration: try RedisConfiguration(url: "redis://127.0.0.1:1"), logger: logger)
        var app = AppConfig(appID: "app1")
        app.webPush = WebPushSettings(
            vapidKeyFile: "v.pem", subject: "mailto:ops@example.com", allowedOrigins: ["https://push.example.net"])
        return RegistryAPI(
            operations: RegistryOperations(
                sink: sink, store: StateStore(connection: connection, logger: logger),
                explain: ExplainStore(connection: connection)),
            clients: [RegistryAPI.Client(name: "all", token: token)], logger: logger,
            apps: AppDirectory(apps: ["app1": app], listedOnly: true), limiter: AuthFailureLimiter(perMinute: 100))
    }

    static func post(_ api: RegistryAPI, _ body: String) async -> (Int, JSONValue) {
        let r = await api.handle(
            method: "POST", path: "/v1/apps/app1/users/u1/devices",
            headers: ["authorization": "Bearer \(token)"], body: Array(body.utf8))
        return (r.status, (try? JSONValue.parse(r.body)) ?? .null)
    }

    static func subscription(_ endpoint: String, p256dh: String = p256dh, auth: String = auth) -> String {
        #"{"subscription":{"endpoint":"\#(endpoint)","expirationTime":null,"keys":{"p256dh":"\#(p256dh)","auth":"\#(auth)"}}}"#
    }

    @Test func aSubscriptionIsRegisteredAsAWebPushDevice() async throws {
        let sink = Sink()
        let api = try Self.api(sink)
        let (status, _) = await Self.post(api, Self.subscription("https://push.example.net/wp/abc"))
        #expect(status == 202)
        let device = try #require(sink.records.withLock { $0.first?.device })
        #expect(device.kind == .webpush)
        #expect(device.token == "\(Self.p256dh).\(Self.auth).https://push.example.net/wp/abc")
    }

    @Test(arguments: [
        (subscription("https://evil.example/wp/abc"), "allowed_origins"),
        (subscription("http://push.example.net/wp/abc"), "https"),
        (subscription("https://push.example.net/wp/abc", p256dh: "BCVx"), "p256dh"),
        (subscription("https://push.example.net/wp/abc", auth: "AAAA"), "auth"),
        (#"{"subscription":{"endpoint":"https://push.example.net/wp/abc","keys":{"p256dh":"x"}}}"#, "keys.auth"),
        (#"{"token":"t","subscription":{"endpoint":"https://push.example.net/wp/abc"}}"#, "not both"),
        (#"{"kind":"fcm","subscription":{"endpoint":"https://push.example.net/wp/abc"}}"#, "webpush"),
    ])
    func badSubscriptionsAreRefused(body: String, says: String) async throws {
        let sink = Sink()
        let api = try Self.api(sink)
        let (status, answer) = await Self.post(api, body)
        #expect(status == 400)
        let text = (answer["error"]?.stringValue ?? "") + " " + (answer["field"]?.stringValue ?? "")
        #expect(text.contains(says), "\(text)")
        #expect(
            answer["field"]?.stringValue?.hasPrefix("subscription") == true || answer["field"]?.stringValue == "kind")
        #expect(sink.records.withLock { $0.isEmpty })
    }
}
