import Foundation
import HeraldCore
import HeraldPipeline
import HeraldPushProviders
import Logging
import ServiceLifecycle
import Synchronization

/// send's `PushTransport`: one `APNsClient` (a pool of HTTP/2 connections) per app credential, i.e. per
/// (app, bundle id, environment). A job goes to the credential whose bundle id is its topic (or the topic's
/// prefix, for `.voip`) in the token's environment.
package final class APNsPushTransport: PushTransport, Service, Sendable {
    package struct Key: Hashable, Sendable {
        var app: String
        var bundleID: String
        var environment: APNsEnvironment
    }

    /// The apps and their clients; replaced together by `reload(apps:)`.
    private struct Clients {
        var apps: AppDirectory
        var credentials: CredentialClients<Key, APNsClient>
    }

    private let state: Mutex<Clients>
    private let timeout: Duration
    /// The configured endpoint (nil: Apple's host of each request's environment).
    package let endpoint: ServiceEndpoint?
    private let logger: Logger
    private let make: @Sendable (String, APNsCredential) throws -> APNsClient
    private let environment: [String: String]

    /// Opens a client for every credential of every app; a credential that cannot be loaded is logged and
    /// left out (its notifications are dead-lettered with `no_credential`). `environment` holds the .p12
    /// passwords a credential names.
    package init(apps: AppDirectory, settings: ProviderClientSettings, environment: [String: String], logger: Logger) {
        self.timeout = settings.timeout
        self.endpoint = settings.endpoint
        self.logger = logger
        self.environment = environment
        make = { appID, credential in
            let auth = try APNsClientCredential(credential, environment: environment)
            var configuration = APNsClientConfiguration(
                credential: auth, environment: credential.environment,
                endpoint: settings.endpoint, trustedCAFile: settings.caFile, connections: settings.connections,
                maxInFlight: settings.maxInFlight, retry: ProviderClientSettings.retry,
                metricDimensions: [
                    ("stage", "send"), ("app", appID), ("bundle_id", credential.bundleID),
                    ("environment", credential.environment.rawValue),
                ])
            settings.apply(to: &configuration.pool)
            let names: Logger.Metadata = [
                "app": "\(appID)", "bundle_id": "\(credential.bundleID)",
                "environment": "\(credential.environment.rawValue)",
                "endpoint": "\(settings.endpoint.map { "\($0)" } ?? "apple")",
            ]
            return try readyClient("APNs", names, logger: logger) {
                try APNsClient(configuration: configuration, logger: logger)
            }
        }
        let clients = CredentialClients(Self.credentials(of: apps), fingerprint: Self.fingerprint, make: make) {
            appID, credential, error in
            logUnusable("APNs", ["app": "\(appID)", "bundle_id": "\(credential.bundleID)"], error, logger: logger)
        }
        state = Mutex(Clients(apps: apps, credentials: clients))
    }

    /// Every (key, app id, credential) of a directory, fallback last.
    private static func credentials(of apps: AppDirectory) -> [(Key, String, APNsCredential)] {
        var out: [(Key, String, APNsCredential)] = []
        for app in apps.apps.values.sorted(by: { $0.appID < $1.appID }) + [apps.fallback] {
            for credential in app.credentials {
                out.append(
                    (
                        Key(app: app.appID, bundleID: credential.bundleID, environment: credential.environment),
                        app.appID, credential
                    ))
            }
        }
        return out
    }

    /// The credential's settings and the bytes of its files (a renewed key or certificate written in place counts
    /// as a change). Never logged.
    private static func fingerprint(_ credential: APNsCredential) -> [UInt8] {
        var bytes = Array(String(describing: credential).utf8)
        for file in [credential.keyFile, credential.certificateFile, credential.privateKeyFile, credential.p12File]
            .compactMap({ $0 })
        {
            bytes += [0] + ((try? Array(Data(contentsOf: URL(fileURLWithPath: file)))) ?? [1])
        }
        return bytes
    }

    /// Applies a reloaded pipeline file (docs/operations.md "Reloading"): a credential whose settings or files
    /// changed gets a new client, so new connections use the new key or certificate; the old client is retired
    /// after its in-flight requests are answered (or the request deadline passes). Unchanged credentials keep
    /// their clients and connections. Throws (and changes nothing) when a new or changed credential does not
    /// load, so a bad file never takes a working credential away.
    package func reload(apps: AppDirectory) throws {
        let current = state.withLock { $0.credentials }
        let (clients, created) = try current.reloaded(
            Self.credentials(of: apps), fingerprint: Self.fingerprint, make: make)
        let retired = current.retired(by: clients)
        state.withLock { $0 = Clients(apps: apps, credentials: clients) }
        let grace = timeout
        for client in retired { Task { await client.shutdown(grace: grace) } }
        logger.info(
            "APNs credentials reloaded",
            metadata: [
                "new_clients": "\(created.count)", "retired_clients": "\(retired.count)",
                "kept_clients": "\(clients.clients.count - created.count)",
            ])
    }

    /// True when at least one client opened a connection.
    package var isConnected: Bool {
        state.withLock { $0.credentials.clients.values.contains { $0.stats.connectionsOpened > 0 } }
    }
    package var hasClients: Bool { state.withLock { !$0.credentials.clients.isEmpty } }

    /// The client of the credential whose bundle id is the job's topic (or the topic's prefix, for `.voip`) in
    /// the token's environment; nil when the app has no such credential or it did not load.
    package func client(for job: PushJob) -> APNsClient? {
        state.withLock { state in
            let app = state.apps.app(job.appID)
            let topic = job.request.topic
            for credential in app.credentials
            where credential.environment == job.request.environment
                && (topic == credential.bundleID || topic.hasPrefix(credential.bundleID + "."))
            {
                if let client = state.credentials.clients[
                    Key(app: app.appID, bundleID: credential.bundleID, environment: credential.environment)]
                {
                    return client
                }
            }
            return nil
        }
    }

    package func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        await send(jobs, onAnswer: onAnswer, onRetry: { _, _ in })
    }

    package func send(
        _ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async {
        // Each client's share, in order of first use. (Not `groups[id, default: (client, [])]`: a default that
        // captures the client is a closure context allocated per job.)
        var groups: [(APNsClient, [Int])] = []
        var groupOf: [ObjectIdentifier: Int] = [:]
        // The client of the job before, and what it was chosen by: a batch is mostly one app's and topic's jobs,
        // which then cost no credential search each.
        var last: (appID: String, topic: String, environment: APNsEnvironment, client: APNsClient)?
        for (index, job) in jobs.enumerated() {
            let found: APNsClient?
            if let last, last.appID == job.appID, last.topic == job.request.topic,
                last.environment == job.request.environment
            {
                found = last.client
            } else {
                found = client(for: job)
                last = found.map { (job.appID, job.request.topic, job.request.environment, $0) }
            }
            guard let client = found else {
                onAnswer(
                    index,
                    .noCredential(
                        "no credential for app \(job.appID), topic \(job.request.topic), \(job.request.environment.rawValue)"
                    ))
                continue
            }
            let id = ObjectIdentifier(client)
            if let at = groupOf[id] {
                groups[at].1.append(index)
            } else {
                groupOf[id] = groups.count
                groups.append((client, [index]))
            }
        }
        await sendConcurrently(
            jobs, groups, timeout: timeout, delivery: { PushDelivery($0, timeout: $1, tag: $2) },
            answer: Self.answer, onAnswer: onAnswer, onRetry: onRetry)
    }

    static func answer(_ response: PushResponse) -> PushAnswer {
        if let status = response.status {
            return .answered(status: status, reason: response.reason, timestamp: response.unregisteredAt)
        }
        return .failed(response.transportFailure ?? .protocolViolation("no answer"))
    }

    /// Keeps the clients until the stage loop has stopped (services stop in reverse order), then closes them.
    /// The clients report their own metrics (`herald_apns_*`: answers, connections, JWT renewals, ...).
    package func run() async throws {
        try? await gracefulShutdown()
        for client in state.withLock({ Array($0.credentials.clients.values) }) {
            await client.shutdown(grace: .seconds(2))
        }
    }
}
