import Foundation
import HeraldCore
import HeraldHTTP
import HeraldMockProviders
import HeraldPushProviders
import HeraldTestSupport
import Testing

enum TestFailure: Error { case failed(String) }

/// Certificates and keys for one test: the stand-in's TLS certificate (localhost, 127.0.0.1), the
/// service account's RSA key, and a second RSA key that is not the service account's.
final class ProviderPKI: @unchecked Sendable {
    // @unchecked Sendable: immutable after init.
    let dir: String
    var cert: String { dir + "/cert.pem" }
    var key: String { dir + "/key.pem" }
    var serviceKey: String { dir + "/sa.key" }
    var otherKey: String { dir + "/other.key" }
    let project = "herald-test-project"
    let clientEmail = "herald@herald-test-project.iam.gserviceaccount.com"

    init() throws {
        dir = NSTemporaryDirectory() + "herald-providers-tests-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let steps: [[String]] = [
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "key.pem",
                "-out", "cert.pem", "-subj", "/CN=localhost", "-days", "2", "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ],
            ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key"],
            ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "other.key"],
        ]
        for s in steps {
            guard try runTool("/usr/bin/openssl", s, cwd: dir).status == 0 else {
                throw TestFailure.failed("openssl \(s.joined(separator: " "))")
            }
        }
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }

    /// A service-account JSON whose token endpoint is the stand-in.
    func serviceAccount(port: Int, key: String? = nil, project: String? = nil) throws -> FCMServiceAccount {
        let pem = try String(contentsOfFile: key ?? serviceKey, encoding: .utf8)
        let json: [String: Any] = [
            "type": "service_account", "project_id": project ?? self.project, "private_key_id": "kid-1",
            "private_key": pem, "client_email": clientEmail, "token_uri": "https://127.0.0.1:\(port)/token",
        ]
        let data = try JSONSerialization.data(withJSONObject: json)
        let path = dir + "/sa-\(UUID().uuidString).json"
        try data.write(to: URL(fileURLWithPath: path))
        return try FCMServiceAccount.load(path: path)
    }
}

/// The clients and the in-process stand-in write to sockets with write(2): like the executables, the test process
/// ignores SIGPIPE so a write to a reset connection fails with EPIPE instead of ending the test run.
let ignoreSIGPIPE: Void = { signal(SIGPIPE, SIG_IGN) }()

func startStandIn(
    _ pki: ProviderPKI, tokenLifetime: Int = 3600, unregistered: Set<String> = [],
    foreign: Set<String> = [], goawayAfter: Int = 0,
    webhookAuth: (user: String, password: String)? = nil, http2: Bool = true
) throws -> MockProvidersServer {
    _ = ignoreSIGPIPE
    var configuration = MockProvidersConfiguration(
        certificatePath: pki.cert, privateKeyPath: pki.key, projectID: pki.project, clientEmail: pki.clientEmail,
        servicePublicKeyPath: pki.serviceKey, accessTokenLifetime: tokenLifetime, unregisteredTokens: unregistered,
        foreignTokens: foreign, goawayAfterStreams: goawayAfter, webhookAuth: webhookAuth)
    configuration.http2 = http2
    let server = try MockProvidersServer(configuration: configuration)
    try server.start()
    return server
}

func fcmClient(
    _ pki: ProviderPKI, _ server: MockProvidersServer, account: FCMServiceAccount? = nil,
    maxAttempts: Int = 1, renewBefore: Duration = .seconds(300), connections: Int = 1, priorityConnections: Int = 0,
    priorityReserve: Double = 0, maxInFlight: Int = 2000
) throws -> FCMClient {
    var configuration = FCMClientConfiguration(
        account: try account ?? pki.serviceAccount(port: server.port),
        endpoint: ServiceEndpoint(host: "127.0.0.1", port: server.port),
        trustedCAFile: pki.cert, connections: connections, maxInFlight: maxInFlight,
        connectTimeout: .seconds(60),  // patient: parallel suites on 2 cores
        retry: BackoffPolicy(
            initialDelay: .milliseconds(20), maxDelay: .milliseconds(200), maxAttempts: maxAttempts),
        renewBefore: renewBefore)
    configuration.priorityConnections = priorityConnections
    configuration.priorityReserve = priorityReserve
    return try FCMClient(configuration: configuration)
}

/// A registration token in FCM's alphabet.
func regToken(_ i: Int) -> String { "dXk\(i):APA91b" + String(repeating: "Qx9_-", count: 28) + String(i) }

/// A rendered FCM request for a token (compact profile, a chat message).
func fcmDelivery(_ token: String, tag: UInt64 = 0, timeout: Duration = .seconds(60)) throws -> PushDelivery {
    let event = try ChatEvent.decode(
        Array(
            #"{"event_id":"e1","app_id":"app1","kind":"message","created_at":1732000000000,"sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"c1","type":"group","name":"Hiking"},"recipients":["u2"],"message":{"id":"m1","type":"text","text":"Bye!"}}"#
                .utf8))
    let app = AppConfig(appID: "app1", fcmCredentials: [FCMCredential(providerID: "fcm-1", serviceAccountFile: "x")])
    let requests = try Renderer.render(
        event: event, recipient: "u2",
        state: UserState(devices: [Device(token: token, kind: .fcm)]),
        targets: [Device(token: token, kind: .fcm)], app: app, now: Date())
    guard let r = requests.first else { throw TestFailure.failed("nothing rendered") }
    return FCMClient.delivery(r, timeout: timeout, tag: tag)
}

/// Polls `condition` until it holds or `timeout` passes.
func eventually(_ timeout: Duration = .seconds(60), _ condition: () -> Bool) async -> Bool {
    let end = ContinuousClock.now + timeout
    while ContinuousClock.now < end {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return condition()
}
