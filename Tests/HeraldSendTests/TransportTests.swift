// send's transports with real provider clients: APNs against the stand-in on loopback; FCM, webhooks and Web Push
// where a credential is missing or does not load.
import Foundation
import HeraldCore
import HeraldPipeline
import HeraldPushProviders
import HeraldSend
import HeraldTestSupport
import Testing

@Suite("send's transports", .serialized)
struct TransportTests {
    static func router(
        _ apps: AppDirectory, apns: ProviderClientSettings, environment: [String: String] = [:]
    ) -> RoutingPushTransport {
        RoutingPushTransport(
            apns: APNsPushTransport(apps: apps, settings: apns, environment: environment, logger: logger),
            fcm: FCMPushTransport(apps: apps, settings: settings(), logger: logger),
            webhook: WebhookPushTransport(
                apps: apps, caFile: nil, maxInFlight: 100, environment: environment, logger: logger),
            webpush: WebPushPushTransport(
                apps: apps, caFile: nil, maxOrigins: 4, maxInFlight: 100, timeout: .seconds(30), logger: logger))
    }

    @Test("each job goes to its provider's transport and its answer comes back under its own index")
    func providerSelection() async throws {
        let pki = try await TestPKI.make()
        let apns = try InProcessAPNs(pki)
        let router = Self.router(
            directory([tokenCredential(pki)]), apns: settings(port: apns.port, caFile: pki.serverCert))
        let got = await answers(
            router,
            [
                job(provider: .fcm, providerID: "android", seed: 1),
                job(seed: 2),
                job(provider: .webhook, providerID: "hook", seed: 3),
                job(topic: "com.example.other", seed: 4),
            ])
        #expect(got[1] == .answered(status: 200, reason: nil, timestamp: nil))
        let fcm = try #require(noCredentialDetail(got[0]), "\(got)")
        let hook = try #require(noCredentialDetail(got[2]), "\(got)")
        let apnsTopic = try #require(noCredentialDetail(got[3]), "\(got)")
        #expect(fcm.contains("FCM") && fcm.contains("android"))
        #expect(hook.contains("webhook") && hook.contains("hook"))
        #expect(apnsTopic.contains("com.example.other"))
        await router.apns.shutdownForTests()
    }

    @Test("an APNs job goes to the credential of its topic (or the topic's .voip prefix) and environment")
    func apnsCredentialChoice() async throws {
        let pki = try await TestPKI.make()
        let apns = try InProcessAPNs(pki)
        let transport = APNsPushTransport(
            apps: directory([
                tokenCredential(pki), tokenCredential(pki, environment: .sandbox),
                tokenCredential(pki, bundle: "com.example.other"),
            ]), settings: settings(port: apns.port, caFile: pki.serverCert), environment: [:], logger: logger)
        let production = try #require(transport.client(for: job()))
        let sandbox = try #require(transport.client(for: job(environment: .sandbox)))
        let other = try #require(transport.client(for: job(topic: "com.example.other")))
        #expect(production !== sandbox && production !== other && sandbox !== other)
        #expect(transport.client(for: job(topic: bundleID + ".voip")) === production)
        #expect(transport.client(for: job(topic: "com.example.other", environment: .sandbox)) == nil)
        #expect(transport.client(for: job(app: "app2")) == nil)  // an app not listed: the fallback has none
        await transport.shutdownForTests()
    }

    // `SendProcessor` dead-letters a `.noCredential` answer with reason `no_credential` (HeraldPipelineTests).
    @Test("a credential that does not load sends its notifications to the DLQ (no_credential); the others send")
    func unusableCredential() async throws {
        let pki = try await TestPKI.make()
        let apns = try InProcessAPNs(pki)
        let transport = APNsPushTransport(
            apps: directory([
                tokenCredential(pki),
                tokenCredential(pki, bundle: "com.example.broken", key: pki.dir + "/missing.p8"),
            ]), settings: settings(port: apns.port, caFile: pki.serverCert), environment: [:], logger: logger)
        #expect(transport.hasClients)
        let got = await answers(transport, [job(topic: "com.example.broken", seed: 1), job(seed: 2)])
        let detail = try #require(noCredentialDetail(got[0]), "\(got)")
        #expect(detail.contains("com.example.broken"))
        #expect(got[1] == .answered(status: 200, reason: nil, timestamp: nil))
        await transport.shutdownForTests()
    }

    @Test("an FCM credential whose service-account file does not load answers no_credential, and refuses a reload")
    func unusableFCMCredential() async throws {
        let pki = try await TestPKI.make()
        let apps = directory(
            [], fcm: [FCMCredential(providerID: "android", serviceAccountFile: pki.dir + "/missing.json")])
        let router = Self.router(apps, apns: settings())
        #expect(!router.fcm.hasClients)
        let got = await answers(router, [job(provider: .fcm, providerID: "android")])
        #expect(noCredentialDetail(got[0]) != nil, "\(got)")
        #expect(throws: (any Error).self) { _ = try router.fcm.prepare(apps: apps) }
    }

    @Test("a webhook whose password is not in the environment is refused on reload")
    func unresolvedWebhook() throws {
        let apps = directory(
            [],
            webhooks: [
                WebhookCredential(
                    providerID: "hook", url: "https://hooks.example.com/push", username: "u",
                    passwordEnv: "HERALD_TEST_ABSENT")
            ])
        let webhook = WebhookPushTransport(apps: apps, caFile: nil, maxInFlight: 10, environment: [:], logger: logger)
        #expect(!webhook.hasClients)
        #expect(throws: (any Error).self) { _ = try webhook.prepare(apps: apps) }
        let resolved = try webhook.prepare(apps: directory([]))
        #expect(resolved.isEmpty)
    }

    @Test(
        "APNs reload: an unchanged credential keeps its client, a key file rewritten in place gets a new one, a bad file changes nothing"
    )
    func apnsReload() async throws {
        let pki = try await TestPKI.make()
        let key = pki.dir + "/Reloaded.p8"
        try FileManager.default.copyItem(atPath: pki.providerKey, toPath: key)
        let apps = directory([tokenCredential(pki, key: key)])
        let apns = try InProcessAPNs(pki)
        let transport = APNsPushTransport(
            apps: apps, settings: settings(port: apns.port, caFile: pki.serverCert), environment: [:], logger: logger)
        let first = try #require(transport.client(for: job()))

        try transport.reload(apps: apps)
        #expect(transport.client(for: job()) === first)

        try Data(contentsOf: URL(fileURLWithPath: pki.otherProviderKey)).write(to: URL(fileURLWithPath: key))
        try transport.reload(apps: apps)
        let second = try #require(transport.client(for: job()))
        #expect(second !== first)

        let broken = directory([
            tokenCredential(pki, key: key), tokenCredential(pki, bundle: "b", key: pki.dir + "/none.p8"),
        ])
        #expect(throws: (any Error).self) { try transport.reload(apps: broken) }
        #expect(transport.client(for: job()) === second)
        #expect(transport.client(for: job(topic: "b")) == nil)
        await transport.shutdownForTests()
    }

    @Test("readiness through the transports: an APNs credential is ready once connected; no provider is never ready")
    func readiness() async throws {
        let none = Self.router(directory([]), apns: settings())
        #expect(!none.readiness.apns)
        #expect(none.readiness.fcm)

        let pki = try await TestPKI.make()
        let apns = try InProcessAPNs(pki)
        let router = Self.router(
            directory([tokenCredential(pki)]), apns: settings(port: apns.port, caFile: pki.serverCert))
        _ = await answers(router, [job()])
        #expect(await eventually(timeout: .seconds(30)) { router.readiness.apns })
        await router.apns.shutdownForTests()
    }
}

extension APNsPushTransport {
    /// Closes the clients at once (the stage closes them when its service group stops).
    func shutdownForTests() async {
        for job in [job(), job(environment: .sandbox), job(topic: "com.example.other")] {
            await client(for: job)?.shutdown(grace: .zero)
        }
    }
}
