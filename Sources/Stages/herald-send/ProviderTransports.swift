import Foundation
import HeraldAPNs
import HeraldCore
import HeraldHTTP
import HeraldPipeline
import Logging
import ServiceLifecycle

/// send's transport for every provider: each job goes to the APNs, FCM or webhook transport by its
/// request's `provider`; each keeps its own connection pools and in-flight bound, and they send
/// concurrently. (One `herald-send` drives every provider; see docs/providers.md.)
final class RoutingPushTransport: PushTransport, Service, Sendable {
    let apns: APNsPushTransport
    let fcm: FCMPushTransport
    let webhook: WebhookPushTransport

    init(apns: APNsPushTransport, fcm: FCMPushTransport, webhook: WebhookPushTransport) {
        self.apns = apns
        self.fcm = fcm
        self.webhook = webhook
    }

    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        var parts: [PushProvider: [(Int, PushJob)]] = [:]
        for (index, job) in jobs.enumerated() { parts[job.request.provider, default: []].append((index, job)) }
        await withTaskGroup(of: Void.self) { group in
            for (provider, items) in parts {
                let subset = items.map(\.1)
                let back = items.map(\.0)
                let answer: @Sendable (Int, PushAnswer) -> Void = { i, a in
                    if i >= 0 && i < back.count { onAnswer(back[i], a) }
                }
                group.addTask {
                    switch provider {
                    case .apns: await self.apns.send(subset, onAnswer: answer)
                    case .fcm: await self.fcm.send(subset, onAnswer: answer)
                    case .webhook: await self.webhook.send(subset, onAnswer: answer)
                    }
                }
            }
        }
    }

    func run() async throws {
        try? await gracefulShutdown()
        // After the stage loop has stopped: the APNs transport's run returns at once (shutdown has begun)
        // having closed its clients; then the FCM clients and the webhook client.
        try? await apns.run()
        await fcm.shutdown()
        await webhook.shutdown()
    }
}

/// One `FCMClient` (a pool of HTTP/2 connections and its OAuth2 access token) per (app, FCM provider id).
final class FCMPushTransport: Sendable {
    struct Key: Hashable, Sendable {
        var app: String
        var providerID: String
    }

    private let clients: [Key: FCMClient]
    private let timeout: Duration

    init(
        apps: AppDirectory, endpoint: APNsEndpoint?, caFile: String?, connections: Int, maxInFlight: Int,
        priorityReserve: Double = 0, priorityConnections: Int = 0, timeout: Duration, logger: Logger
    ) {
        self.timeout = timeout
        var clients: [Key: FCMClient] = [:]
        for app in Array(apps.apps.values) + [apps.fallback] {
            for credential in app.fcmCredentials {
                let key = Key(app: app.appID, providerID: credential.providerID)
                if clients[key] != nil { continue }
                do {
                    let account = try FCMServiceAccount.load(path: credential.serviceAccountFile)
                    var configuration = FCMClientConfiguration(
                        account: account, endpoint: endpoint, trustedCAFile: caFile, connections: connections,
                        maxInFlight: maxInFlight, connectTimeout: .seconds(5),
                        // One in-process retry (and one access-token renewal on 401); more go through herald.retry.
                        retry: APNsBackoffPolicy(
                            initialDelay: .milliseconds(100), maxDelay: .seconds(1), maxAttempts: 2),
                        metricDimensions: [
                            ("stage", "send"), ("app", app.appID), ("provider_id", credential.providerID),
                        ])
                    // The priority lane's calls and direct messages to Android devices get the same reserved
                    // streams and connection as on APNs (docs/pipeline.md, "Priority lanes").
                    configuration.priorityReserve = priorityReserve
                    configuration.priorityConnections = priorityConnections
                    clients[key] = try FCMClient(configuration: configuration, logger: logger)
                    logger.info(
                        "FCM client ready",
                        metadata: [
                            "app": "\(app.appID)", "provider_id": "\(credential.providerID)",
                            "project": "\(account.projectID)",
                        ])
                } catch {
                    logger.error(
                        "FCM credential unusable; its notifications go to the DLQ",
                        metadata: [
                            "app": "\(app.appID)", "provider_id": "\(credential.providerID)", "error": "\(error)",
                        ])
                }
            }
        }
        self.clients = clients
    }

    var hasClients: Bool { !clients.isEmpty }
    /// True when every client holds an access token.
    var isReady: Bool { clients.values.allSatisfy { $0.tokens.token() != nil } }

    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        var groups: [Key: [(Int, PushJob)]] = [:]
        for (index, job) in jobs.enumerated() {
            let key = Key(app: job.appID, providerID: job.request.providerID ?? job.request.topic)
            guard clients[key] != nil else {
                onAnswer(index, .noCredential("no FCM credential \(key.providerID) for app \(job.appID)"))
                continue
            }
            groups[key, default: []].append((index, job))
        }
        let timeout = self.timeout
        await withTaskGroup(of: Void.self) { group in
            for (key, items) in groups {
                guard let client = clients[key] else { continue }
                group.addTask {
                    let requests = items.map { item in
                        var request = FCMClient.delivery(item.1.request, timeout: timeout, tag: UInt64(item.0))
                        request.prioritized = item.1.prioritized
                        return request
                    }
                    for await r in client.responses(for: requests) {
                        onAnswer(Int(r.tag), Self.answer(r))
                    }
                }
            }
        }
    }

    static func answer(_ r: APNsResponse) -> PushAnswer {
        if let status = r.status {
            return .classified(
                status: status, reason: r.reasonText ?? "HTTP\(status)",
                answer: r.answer ?? FCMAnswerTable.classify(status: status, body: nil),
                retryAfter: r.retryAfter)
        }
        return .failed(r.transportFailure ?? .protocolViolation("no answer"))
    }

    func shutdown() async {
        for c in clients.values { await c.shutdown(grace: .seconds(2)) }
    }
}

/// Custom webhooks: one shared HTTP/1.1 client (libcurl multi; connections kept per host) and the
/// configured endpoints per (app, webhook provider id).
final class WebhookPushTransport: Sendable {
    struct Key: Hashable, Sendable {
        var app: String
        var providerID: String
    }

    private let client: WebhookClient?
    private let endpoints: [Key: WebhookEndpoint]

    init(apps: AppDirectory, caFile: String?, maxInFlight: Int, environment: [String: String], logger: Logger) {
        var endpoints: [Key: WebhookEndpoint] = [:]
        for app in Array(apps.apps.values) + [apps.fallback] {
            for hook in app.webhooks {
                switch WebhookEndpoint.resolve(hook, environment: environment) {
                case .success(let e): endpoints[Key(app: app.appID, providerID: hook.providerID)] = e
                case .failure(let error):
                    logger.error(
                        "webhook unusable; its notifications go to the DLQ",
                        metadata: [
                            "app": "\(app.appID)", "provider_id": "\(hook.providerID)", "error": "\(error.message)",
                        ])
                }
            }
        }
        self.endpoints = endpoints
        if endpoints.isEmpty {
            client = nil
        } else {
            do {
                client = try WebhookClient(
                    configuration: HTTP1ClientConfiguration(trustedCAFile: caFile, maxInFlight: maxInFlight))
            } catch {
                logger.error("webhook client unavailable", metadata: ["error": "\(error)"])
                client = nil
            }
        }
    }

    var hasClients: Bool { client != nil }

    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        var requests: [HTTPRequest] = []
        for (index, job) in jobs.enumerated() {
            let key = Key(app: job.appID, providerID: job.request.providerID ?? job.request.topic)
            guard let client, let endpoint = endpoints[key] else {
                onAnswer(index, .noCredential("no webhook \(key.providerID) for app \(job.appID)"))
                continue
            }
            requests.append(client.request(job.request, to: endpoint, tag: UInt64(index)))
        }
        guard let client, !requests.isEmpty else { return }
        await client.send(requests) { tag, outcome in
            onAnswer(
                Int(tag),
                .classified(
                    status: outcome.status, reason: outcome.reasonText, answer: outcome.answer,
                    retryAfter: nil))
        }
    }

    func shutdown() async { await client?.shutdown() }
}
