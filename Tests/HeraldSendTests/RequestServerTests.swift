// Where each provider's request goes, as a traced request's span shows it (`server.address`, `server.port`).
import Foundation
import HeraldCore
import HeraldPipeline
import HeraldSend
import Testing

@Suite("send's transports: the server of a request")
struct RequestServerTests {
    @Test("APNs and FCM: the configured endpoint or the provider's host; webhooks and Web Push: their URL's host")
    func serverOfEachProvider() async throws {
        let apps = directory(
            [], webhooks: [WebhookCredential(providerID: "hook", url: "https://hooks.example.com:8443/push?k=v")])
        let own = TransportTests.router(apps, apns: settings())
        #expect(own.server(for: job()) == ServiceEndpoint(host: "api.push.apple.com", port: 443))
        #expect(
            own.server(for: job(environment: .sandbox))
                == ServiceEndpoint(host: "api.sandbox.push.apple.com", port: 443))
        #expect(
            own.server(for: job(provider: .fcm, providerID: "android")) == ServiceEndpoint(host: "fcm.googleapis.com"))
        #expect(
            own.server(for: job(provider: .webhook, providerID: "hook"))
                == ServiceEndpoint(host: "hooks.example.com", port: 8443), "the host and port only")
        #expect(own.server(for: job(provider: .webhook, providerID: "other")) == nil, "no such webhook")
        var webpush = job(provider: .webpush)
        webpush.request.token =
            WebPushSubscription(
                endpoint: "https://fcm.googleapis.com/fcm/send/abc", p256dh: "key", auth: "secret"
            ).token
        #expect(own.server(for: webpush) == ServiceEndpoint(host: "fcm.googleapis.com", port: 443))

        let local = TransportTests.router(apps, apns: settings(port: 4443))
        #expect(local.server(for: job()) == ServiceEndpoint(host: "127.0.0.1", port: 4443), "the configured endpoint")
        await own.webhook.shutdown()
        await local.webhook.shutdown()
    }
}
