import Foundation
import HeraldCore
import HeraldHTTP
import HeraldPipeline
import HeraldPushProviders
import Logging
import ServiceLifecycle
import Synchronization

/// A reloaded pipeline file that send cannot use (a webhook that does not resolve).
struct ReloadRefused: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// send's transport for every provider: each job goes to the APNs, FCM or webhook transport by its
/// request's `provider`; each keeps its own connection pools and in-flight bound, and they send
/// concurrently. (One `herald-send` drives every provider; see docs/providers.md.)
package final class RoutingPushTransport: PushTransport, Service, Sendable {
    package let apns: APNsPushTransport
    package let fcm: FCMPushTransport
    package let webhook: WebhookPushTransport
    package let webpush: WebPushPushTransport

    package init(
        apns: APNsPushTransport, fcm: FCMPushTransport, webhook: WebhookPushTransport, webpush: WebPushPushTransport
    ) {
        self.apns = apns
        self.fcm = fcm
        self.webhook = webhook
        self.webpush = webpush
    }

    /// What the readiness checks read from the transports (`SendReadiness.apns`, `.fcm`).
    package var readiness: SendReadiness {
        SendReadiness(
            apnsClients: apns.hasClients, apnsConnected: apns.isConnected, fcmClients: fcm.hasClients,
            fcmTokens: fcm.isReady, webhookClients: webhook.hasClients, webpushClients: webpush.hasClients)
    }

    /// Where a job's request goes: the configured endpoint or the provider's own host (APNs, FCM), the webhook's
    /// URL, the push service of a Web Push subscription. Asked only for traced jobs.
    package func server(for job: PushJob) -> ServiceEndpoint? {
        switch job.request.provider {
        case .apns: apns.endpoint ?? ServiceEndpoint(job.request.environment)
        case .fcm: fcm.endpoint ?? ServiceEndpoint(host: "fcm.googleapis.com")
        case .webhook: webhook.url(for: job).flatMap(Self.endpoint(ofURL:))
        case .webpush: WebPushSubscription(token: job.request.token).flatMap { Self.endpoint(ofURL: $0.endpoint) }
        }
    }

    /// The host and port of an `https` or `http` URL (no path, user or query: those may hold a secret).
    static func endpoint(ofURL text: String) -> ServiceEndpoint? {
        guard let url = URLComponents(string: text), let host = url.host, !host.isEmpty else { return nil }
        return ServiceEndpoint(host: host, port: url.port ?? (url.scheme == "http" ? 80 : 443))
    }

    package func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        await send(jobs, onAnswer: onAnswer, onRetry: { _, _ in })
    }

    package func send(
        _ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async {
        // Nearly every batch is one provider's: its jobs go on as they are, without a subset and an index map.
        if let provider = jobs.first?.request.provider, jobs.allSatisfy({ $0.request.provider == provider }) {
            await send(jobs, to: provider, onAnswer: onAnswer, onRetry: onRetry)
            return
        }
        var parts: [PushProvider: [(Int, PushJob)]] = [:]
        for (index, job) in jobs.enumerated() { parts[job.request.provider, default: []].append((index, job)) }
        await withTaskGroup(of: Void.self) { group in
            for (provider, items) in parts {
                let subset = items.map(\.1)
                let back = items.map(\.0)
                let answer: @Sendable (Int, PushAnswer) -> Void = { i, a in
                    if i >= 0 && i < back.count { onAnswer(back[i], a) }
                }
                let retry: @Sendable (Int, ProviderRetry) -> Void = { i, r in
                    if i >= 0 && i < back.count { onRetry(back[i], r) }
                }
                group.addTask { await self.send(subset, to: provider, onAnswer: answer, onRetry: retry) }
            }
        }
    }

    private func send(
        _ jobs: [PushJob], to provider: PushProvider, onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async {
        switch provider {
        case .apns: await apns.send(jobs, onAnswer: onAnswer, onRetry: onRetry)
        case .fcm: await fcm.send(jobs, onAnswer: onAnswer, onRetry: onRetry)
        case .webhook: await webhook.send(jobs, onAnswer: onAnswer)
        case .webpush: await webpush.send(jobs, onAnswer: onAnswer)
        }
    }

    package func run() async throws {
        try? await gracefulShutdown()
        // After the stage loop has stopped: the APNs transport's run returns at once (shutdown has begun)
        // having closed its clients; then the FCM clients and the webhook client.
        try? await apns.run()
        await fcm.shutdown()
        await webhook.shutdown()
        await webpush.shutdown()
    }
}

/// One `FCMClient` (a pool of HTTP/2 connections and its OAuth2 access token) per (app, FCM provider id).
/// Replaced when the pipeline file is reloaded (`prepare` then `commit`): a credential whose service-account file
/// is unchanged keeps its client; new and changed ones get a new client, the ones no longer named are closed.
package final class FCMPushTransport: Sendable {
    package struct Key: Hashable, Sendable {
        var app: String
        var providerID: String
    }

    /// The clients of a reloaded file, built but not yet in use.
    package struct Prepared: Sendable {
        fileprivate var clients: CredentialClients<Key, FCMClient>
        fileprivate var created: [FCMClient]

        /// Closes what was built for a file that is refused after all.
        package func discard() async {
            for client in created { await client.shutdown(grace: .zero) }
        }
    }

    private let state: Mutex<CredentialClients<Key, FCMClient>>
    private let timeout: Duration
    /// The configured endpoint (nil: FCM's own host).
    package let endpoint: ServiceEndpoint?
    private let make: @Sendable (String, FCMCredential) throws -> FCMClient
    private let logger: Logger

    /// Opens a client for every FCM credential of every app; a service-account file that does not load is logged
    /// and left out (its notifications are dead-lettered with `no_credential`).
    package init(apps: AppDirectory, settings: ProviderClientSettings, logger: Logger) {
        self.timeout = settings.timeout
        self.endpoint = settings.endpoint
        self.logger = logger
        make = { appID, credential in
            let account = try FCMServiceAccount.load(path: credential.serviceAccountFile)
            var configuration = FCMClientConfiguration(
                account: account, endpoint: settings.endpoint, trustedCAFile: settings.caFile,
                connections: settings.connections, maxInFlight: settings.maxInFlight,
                retry: ProviderClientSettings.retry,
                metricDimensions: [
                    ("stage", "send"), ("app", appID), ("provider_id", credential.providerID),
                ])
            settings.apply(to: &configuration.pool)
            let names: Logger.Metadata = [
                "app": "\(appID)", "provider_id": "\(credential.providerID)", "project": "\(account.projectID)",
            ]
            return try readyClient("FCM", names, logger: logger) {
                try FCMClient(configuration: configuration, logger: logger)
            }
        }
        let clients = CredentialClients(Self.credentials(of: apps), fingerprint: Self.fingerprint, make: make) {
            appID, credential, error in
            logUnusable(
                "FCM", ["app": "\(appID)", "provider_id": "\(credential.providerID)"], error, logger: logger)
        }
        state = Mutex(clients)
    }

    static func credentials(of apps: AppDirectory) -> [(Key, String, FCMCredential)] {
        var out: [(Key, String, FCMCredential)] = []
        for app in Array(apps.apps.values) + [apps.fallback] {
            for credential in app.fcmCredentials {
                out.append((Key(app: app.appID, providerID: credential.providerID), app.appID, credential))
            }
        }
        return out
    }

    /// What identifies a credential's client: the service-account file's path and content.
    static func fingerprint(_ credential: FCMCredential) -> [UInt8] {
        let content = (try? Data(contentsOf: URL(fileURLWithPath: credential.serviceAccountFile))) ?? Data()
        return Array(credential.serviceAccountFile.utf8) + [0] + Array(content)
    }

    /// Builds the clients of a reloaded file; throws (building nothing that stays) when a credential does not
    /// load, so the file is refused and the running clients stay.
    package func prepare(apps: AppDirectory) throws -> Prepared {
        let current = state.withLock { $0 }
        let (clients, created) = try current.reloaded(
            Self.credentials(of: apps), fingerprint: Self.fingerprint, make: make)
        return Prepared(clients: clients, created: created)
    }

    /// Puts prepared clients in use and closes the ones no longer named (after their requests' deadline).
    package func commit(_ prepared: Prepared) {
        let old = state.withLock { state in
            let old = state
            state = prepared.clients
            return old
        }
        let retired = old.retired(by: prepared.clients)
        let grace = timeout
        for client in retired { Task { await client.shutdown(grace: grace) } }
        logger.info(
            "FCM credentials reloaded",
            metadata: ["new_clients": "\(prepared.created.count)", "retired_clients": "\(retired.count)"])
    }

    private var clients: [Key: FCMClient] { state.withLock { $0.clients } }

    package var hasClients: Bool { !clients.isEmpty }
    /// True when every client holds an access token.
    package var isReady: Bool { clients.values.allSatisfy { $0.tokens.token() != nil } }

    package func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        await send(jobs, onAnswer: onAnswer, onRetry: { _, _ in })
    }

    package func send(
        _ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async {
        var groups: [Key: [Int]] = [:]
        let clients = self.clients
        for (index, job) in jobs.enumerated() {
            let key = Key(app: job.appID, providerID: job.request.providerID ?? job.request.topic)
            guard clients[key] != nil else {
                onAnswer(index, .noCredential("no FCM credential \(key.providerID) for app \(job.appID)"))
                continue
            }
            groups[key, default: []].append(index)
        }
        await sendConcurrently(
            jobs, groups.compactMap { key, indices in clients[key].map { ($0, indices) } }, timeout: timeout,
            delivery: { FCMClient.delivery($0, timeout: $1, tag: $2) }, answer: Self.answer, onAnswer: onAnswer,
            onRetry: onRetry)
    }

    static func answer(_ r: PushResponse) -> PushAnswer {
        if let status = r.status {
            return .classified(
                status: status, reason: r.reasonText ?? "HTTP\(status)",
                answer: r.answer ?? FCMAnswerTable.classify(status: status, body: nil),
                retryAfter: r.retryAfter, messageName: r.messageName)
        }
        return .failed(r.transportFailure ?? .protocolViolation("no answer"))
    }

    package func shutdown() async {
        for c in clients.values { await c.shutdown(grace: .seconds(2)) }
    }
}

/// Custom webhooks: one shared HTTP/1.1 client (libcurl multi; connections kept per host) and the
/// configured endpoints per (app, webhook provider id). The endpoints are replaced when the pipeline file is
/// reloaded (`prepare` then `commit`); a webhook whose URL or password does not resolve refuses the file.
package final class WebhookPushTransport: Sendable {
    package struct Key: Hashable, Sendable {
        var app: String
        var providerID: String
    }
    package typealias Endpoints = [Key: WebhookEndpoint]

    private let state: Mutex<(client: WebhookClient?, endpoints: [Key: WebhookEndpoint])>
    private let caFile: String?
    private let maxInFlight: Int
    private let environment: [String: String]
    private let logger: Logger

    package init(
        apps: AppDirectory, caFile: String?, maxInFlight: Int, environment: [String: String], logger: Logger
    ) {
        self.caFile = caFile
        self.maxInFlight = maxInFlight
        self.environment = environment
        self.logger = logger
        let (endpoints, failures) = Self.resolve(apps, environment: environment)
        for failure in failures {
            logger.error(
                "webhook unusable; its notifications go to the DLQ",
                metadata: [
                    "app": "\(failure.app)", "provider_id": "\(failure.providerID)", "error": "\(failure.message)",
                ])
        }
        state = Mutex((endpoints.isEmpty ? nil : Self.makeClient(caFile, maxInFlight, logger), endpoints))
    }

    /// Every webhook of `apps` resolved (URL, password from the environment), and the ones that do not resolve.
    static func resolve(
        _ apps: AppDirectory, environment: [String: String]
    ) -> (
        Endpoints, [(app: String, providerID: String, message: String)]
    ) {
        var endpoints: Endpoints = [:]
        var failures: [(app: String, providerID: String, message: String)] = []
        for app in Array(apps.apps.values) + [apps.fallback] {
            for hook in app.webhooks {
                switch WebhookEndpoint.resolve(hook, environment: environment) {
                case .success(let e): endpoints[Key(app: app.appID, providerID: hook.providerID)] = e
                case .failure(let error): failures.append((app.appID, hook.providerID, error.message))
                }
            }
        }
        return (endpoints, failures)
    }

    private static func makeClient(_ caFile: String?, _ maxInFlight: Int, _ logger: Logger) -> WebhookClient? {
        do {
            return try WebhookClient(
                configuration: HTTP1ClientConfiguration(trustedCAFile: caFile, maxInFlight: maxInFlight))
        } catch {
            logger.error("webhook client unavailable", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// The endpoints of a reloaded file; throws naming the first webhook that does not resolve.
    package func prepare(apps: AppDirectory) throws -> Endpoints {
        let (endpoints, failures) = Self.resolve(apps, environment: environment)
        if let f = failures.first {
            throw ReloadRefused(message: "apps.\(f.app) webhook \(f.providerID): \(f.message)")
        }
        return endpoints
    }

    /// Puts reloaded endpoints in use (making the shared client when the first webhook appears).
    package func commit(_ endpoints: Endpoints) {
        let needsClient = state.withLock { $0.client == nil } && !endpoints.isEmpty
        let made = needsClient ? Self.makeClient(caFile, maxInFlight, logger) : nil
        state.withLock { state in
            if state.client == nil { state.client = made }
            state.endpoints = endpoints
        }
        logger.info("webhooks reloaded", metadata: ["webhooks": "\(endpoints.count)"])
    }

    private var client: WebhookClient? { state.withLock { $0.client } }

    /// The URL `job` is posted to (nil: no such webhook).
    func url(for job: PushJob) -> String? {
        let key = Key(app: job.appID, providerID: job.request.providerID ?? job.request.topic)
        return state.withLock { $0.endpoints[key]?.url }
    }

    package var hasClients: Bool { client != nil }

    package func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        var requests: [HTTPRequest] = []
        let (client, endpoints) = state.withLock { ($0.client, $0.endpoints) }
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

    package func shutdown() async { await client?.shutdown() }
}
