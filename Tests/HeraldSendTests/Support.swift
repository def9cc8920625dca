// What send's transport tests share: apps with credentials, jobs, answers collected by index, and the APNs
// stand-in (HeraldMockAPNs) served in-process on a thread of its own.
import Foundation
import HeraldCore
import HeraldMockAPNs
import HeraldPipeline
import HeraldSend
import HeraldTestSupport
import Logging
import Synchronization

let bundleID = "com.example.chat"
let logger = Logger(label: "herald.test.send")

/// A job for `provider` (a device token of 64 hex digits from `seed`).
func job(
    app: String = "app1", topic: String = bundleID, environment: APNsEnvironment = .production,
    provider: PushProvider = .apns, providerID: String? = nil, seed: Int = 1
) -> PushJob {
    let token = String(repeating: String(format: "%02x", seed % 256), count: 32)
    return PushJob(
        appID: app,
        request: PushRequest(
            token: token, environment: environment, pushType: .alert, topic: topic, priority: 10, collapseID: nil,
            expiration: 0, apnsID: APNsID.derive(eventID: "e\(seed)", token: token),
            payload: Array(#"{"aps":{"alert":"hi"}}"#.utf8), provider: provider, providerID: providerID))
}

/// A token credential for `bundle` with the test key (`key` overrides the file).
func tokenCredential(
    _ pki: TestPKI, bundle: String = bundleID, environment: APNsEnvironment = .production, key: String? = nil
) -> APNsCredential {
    APNsCredential(
        bundleID: bundle, environment: environment, teamID: pki.teamID, keyID: pki.keyID,
        keyFile: key ?? pki.providerKey)
}

/// A directory of one app, `app1`, with these credentials.
func directory(
    _ credentials: [APNsCredential], fcm: [FCMCredential] = [], webhooks: [WebhookCredential] = []
) -> AppDirectory {
    AppDirectory(
        apps: ["app1": AppConfig(appID: "app1", credentials: credentials, fcmCredentials: fcm, webhooks: webhooks)],
        listedOnly: true)
}

/// Settings for clients that reach `port` on loopback trusting `caFile`.
func settings(port: Int? = nil, caFile: String? = nil) -> ProviderClientSettings {
    ProviderClientSettings(
        endpoint: port.flatMap { ServiceEndpoint(parsing: "127.0.0.1:\($0)") }, caFile: caFile, connections: 1,
        maxInFlight: 100, timeout: .seconds(30))
}

/// Sends `jobs` through `transport` and returns each job's answer by index.
func answers(_ transport: some PushTransport, _ jobs: [PushJob]) async -> [Int: PushAnswer] {
    let collected = Mutex<[Int: PushAnswer]>([:])
    await transport.send(jobs) { index, answer in collected.withLock { $0[index] = answer } }
    return collected.withLock { $0 }
}

/// The detail of a `.noCredential` answer (what the DLQ record says); nil for any other answer.
func noCredentialDetail(_ answer: PushAnswer?) -> String? {
    if case .noCredential(let detail)? = answer { return detail }
    return nil
}

/// The APNs stand-in with the test PKI's server certificate and provider key, serving `bundleID`, until dropped.
final class InProcessAPNs: Sendable {
    let server: MockAPNsServer
    private let done = Mutex(false)

    init(_ pki: TestPKI) throws {
        TestProcess.prepare()
        var configuration = MockAPNsConfiguration(certificatePath: pki.serverCert, privateKeyPath: pki.serverKey)
        configuration.providerKeys = [
            MockProviderKey(keyID: pki.keyID, teamID: pki.teamID, publicKeyPath: pki.providerPublicKey)
        ]
        configuration.topics = [bundleID]
        server = try MockAPNsServer(configuration: configuration)
        let server = self.server
        Thread { server.run() }.start()
    }

    var port: Int { server.port }

    deinit { server.stop() }
}
