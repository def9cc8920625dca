import Foundation
import HeraldAPNs
import HeraldCore
import HeraldPipeline
import Logging
import ServiceLifecycle

/// send's `PushTransport`: one `APNsClient` (a pool of HTTP/2 connections) per app credential, i.e. per
/// (app, bundle id, environment). A job goes to the credential whose bundle id is its topic (or the topic's
/// prefix, for `.voip`) in the token's environment.
final class APNsPushTransport: PushTransport, Service, Sendable {
    struct Key: Hashable, Sendable {
        var app: String
        var bundleID: String
        var environment: APNsEnvironment
    }

    private let apps: AppDirectory
    private let clients: [Key: APNsClient]
    private let timeout: Duration
    private let logger: Logger

    /// Opens a client for every credential of every app; a credential that cannot be loaded is logged and
    /// left out (its notifications are dead-lettered with `no_credential`).
    init(apps: AppDirectory, endpoint: APNsEndpoint?, caFile: String?, connections: Int, maxInFlight: Int,
         priorityReserve: Double = 0, timeout: Duration, environment: [String: String], logger: Logger) {
        self.apps = apps
        self.timeout = timeout
        self.logger = logger
        var clients: [Key: APNsClient] = [:]
        for app in Array(apps.apps.values) + [apps.fallback] {
            let appID = app.appID
            for credential in app.credentials {
                let key = Key(app: appID, bundleID: credential.bundleID, environment: credential.environment)
                if clients[key] != nil { continue }
                do {
                    let auth = try APNsClientCredential(credential, environment: environment)
                    var configuration = APNsClientConfiguration(
                        credential: auth, environment: credential.environment,
                        endpoint: endpoint, trustedCAFile: caFile, connections: connections, maxInFlight: maxInFlight,
                        // One in-process retry (it also renews an expired JWT); further retries go through herald.retry.
                        retry: APNsBackoffPolicy(initialDelay: .milliseconds(100), maxDelay: .seconds(1), maxAttempts: 2),
                        metricDimensions: [("stage", "send"), ("app", appID), ("bundle_id", credential.bundleID),
                                           ("environment", credential.environment.rawValue)])
                    configuration.connectTimeout = .seconds(5)
                    configuration.priorityReserve = priorityReserve
                    clients[key] = try APNsClient(configuration: configuration, logger: logger)
                    logger.info("APNs client ready", metadata: ["app": "\(appID)", "bundle_id": "\(credential.bundleID)",
                                                                "environment": "\(credential.environment.rawValue)",
                                                                "endpoint": "\(endpoint.map { "\($0)" } ?? "apple")"])
                } catch {
                    logger.error("APNs credential unusable; its notifications go to the DLQ", metadata: [
                        "app": "\(appID)", "bundle_id": "\(credential.bundleID)", "error": "\(error)",
                    ])
                }
            }
        }
        self.clients = clients
    }

    /// True when at least one client opened a connection.
    var isConnected: Bool { clients.values.contains { $0.stats.connectionsOpened > 0 } }
    var hasClients: Bool { !clients.isEmpty }

    func client(for job: PushJob) -> APNsClient? {
        let app = apps.app(job.appID)
        let topic = job.request.topic
        for credential in app.credentials where credential.environment == job.request.environment
            && (topic == credential.bundleID || topic.hasPrefix(credential.bundleID + ".")) {
            if let client = clients[Key(app: app.appID, bundleID: credential.bundleID, environment: credential.environment)] {
                return client
            }
        }
        return nil
    }

    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        var groups: [ObjectIdentifier: (APNsClient, [(Int, PushJob)])] = [:]
        for (index, job) in jobs.enumerated() {
            guard let client = client(for: job) else {
                onAnswer(index, .noCredential("no credential for app \(job.appID), topic \(job.request.topic), \(job.request.environment.rawValue)"))
                continue
            }
            groups[ObjectIdentifier(client), default: (client, [])].1.append((index, job))
        }
        let timeout = self.timeout
        await withTaskGroup(of: Void.self) { group in
            for (_, (client, items)) in groups {
                group.addTask {
                    let requests = items.map { item in
                        var request = APNsDelivery(item.1.request, timeout: timeout, tag: UInt64(item.0))
                        request.prioritized = item.1.prioritized
                        return request
                    }
                    for await response in client.responses(for: requests) {
                        onAnswer(Int(response.tag), Self.answer(response))
                    }
                }
            }
        }
    }

    static func answer(_ response: APNsResponse) -> PushAnswer {
        if let status = response.status {
            return .answered(status: status, reason: response.reason, timestamp: response.unregisteredAt)
        }
        return .failed(response.transportFailure ?? .protocolViolation("no answer"))
    }

    /// Keeps the clients until the stage loop has stopped (services stop in reverse order), then closes them.
    /// The clients report their own metrics (`herald_apns_*`: answers, connections, JWT renewals, ...).
    func run() async throws {
        try? await gracefulShutdown()
        for client in clients.values { await client.shutdown(grace: .seconds(2)) }
    }
}
