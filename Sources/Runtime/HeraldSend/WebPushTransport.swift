import Foundation
import HeraldCore
import HeraldPipeline
import HeraldPushProviders
import Logging
import Synchronization

/// Web Push (device kind `webpush`): each app's VAPID key (loaded from its `webpush.vapid_key_file`), and one
/// `WebPushClient` (a persistent HTTP/2 connection) per (app, push service origin), made when the first message to
/// that origin is sent. At most `maxOrigins` clients are kept: one more closes the least recently used. Each job's
/// payload is encrypted for its subscription here, just before it is sent. Reloaded with the pipeline file
/// (`prepare` then `commit`): a VAPID key that does not load refuses the file.
package final class WebPushPushTransport: Sendable {
    struct Key: Hashable, Sendable {
        var app: String
        var origin: String
    }

    /// What a reloaded file gives: the apps and their VAPID identities.
    package struct Prepared: Sendable {
        fileprivate var apps: AppDirectory
        fileprivate var keys: [String: WebPushVAPID]
    }

    private struct State {
        var apps: AppDirectory
        var keys: [String: WebPushVAPID]
        var clients: [Key: (client: WebPushClient, fingerprint: String, lastUsed: UInt64)] = [:]
        var uses: UInt64 = 0
        /// Push services found not to speak HTTP/2 (their connection refused h2 in ALPN): reached over HTTP/1.1.
        var http1Origins: Set<Key> = []
    }

    private let state: Mutex<State>
    /// HTTP/1.1 for push services without HTTP/2 (nil when libcurl could not start: such services then fail).
    private let http1: WebPushHTTP1Sender?
    private let caFile: String?
    private let maxOrigins: Int
    private let maxInFlight: Int
    private let timeout: Duration
    private let logger: Logger

    package init(
        apps: AppDirectory, caFile: String?, maxOrigins: Int, maxInFlight: Int, timeout: Duration, logger: Logger
    ) {
        self.caFile = caFile
        self.maxOrigins = max(1, maxOrigins)
        self.maxInFlight = maxInFlight
        self.timeout = timeout
        self.logger = logger
        let (keys, failures) = Self.load(apps)
        for (app, error) in failures {
            logger.error(
                "Web Push VAPID key unusable; the app's webpush notifications go to the DLQ",
                metadata: ["app": "\(app)", "error": "\(error)"])
        }
        state = Mutex(State(apps: apps, keys: keys))
        do {
            http1 = try WebPushHTTP1Sender(trustedCAFile: caFile, maxInFlight: maxInFlight)
        } catch {
            http1 = nil
            logger.error("Web Push HTTP/1.1 client unavailable", metadata: ["error": "\(error)"])
        }
    }

    /// Every app's VAPID identity, and the apps whose key does not load (the error names the file, never its bytes).
    static func load(_ apps: AppDirectory) -> ([String: WebPushVAPID], [(String, WebPushError)]) {
        var keys: [String: WebPushVAPID] = [:]
        var failures: [(String, WebPushError)] = []
        for app in Array(apps.apps.values) + [apps.fallback] {
            guard let settings = app.webPush, keys[app.appID] == nil else { continue }
            do {
                keys[app.appID] = try WebPushVAPID(pemFile: settings.vapidKeyFile, subject: settings.subject)
            } catch {
                failures.append((app.appID, error))
            }
        }
        return (keys, failures)
    }

    /// The VAPID identities of a reloaded file; throws naming the first app whose key does not load.
    package func prepare(apps: AppDirectory) throws -> Prepared {
        let (keys, failures) = Self.load(apps)
        if let (app, error) = failures.first {
            throw ReloadRefused(message: "apps.\(app).webpush: \(error)")
        }
        return Prepared(apps: apps, keys: keys)
    }

    /// Puts a reloaded file in use; clients whose app's key changed (or whose app is gone) are closed.
    package func commit(_ prepared: Prepared) {
        let retired = state.withLock { state -> [WebPushClient] in
            state.apps = prepared.apps
            state.keys = prepared.keys
            var retired: [WebPushClient] = []
            for (key, entry) in state.clients where prepared.keys[key.app].map(Self.fingerprint) != entry.fingerprint {
                retired.append(entry.client)
                state.clients[key] = nil
            }
            return retired
        }
        let grace = timeout
        for client in retired { Task { await client.shutdown(grace: grace) } }
        logger.info(
            "Web Push keys reloaded",
            metadata: ["apps": "\(prepared.keys.count)", "retired_clients": "\(retired.count)"])
    }

    static func fingerprint(_ vapid: WebPushVAPID) -> String { vapid.publicKey + " " + vapid.subject }

    package var hasClients: Bool { state.withLock { !$0.keys.isEmpty } }

    /// The client for (app, origin), made when missing; closes the least recently used one beyond `maxOrigins`.
    private func client(_ key: Key, vapid: WebPushVAPID) throws -> WebPushClient {
        let fingerprint = Self.fingerprint(vapid)
        if let found = state.withLock({ state -> WebPushClient? in
            guard let entry = state.clients[key], entry.fingerprint == fingerprint else { return nil }
            state.uses += 1
            state.clients[key]?.lastUsed = state.uses
            return entry.client
        }) {
            return found
        }
        let made = try WebPushClient(
            configuration: WebPushClientConfiguration(
                origin: key.origin, vapid: vapid, trustedCAFile: caFile, maxInFlight: maxInFlight,
                retry: ProviderClientSettings.retry,
                metricDimensions: [("stage", "send"), ("app", key.app), ("origin", key.origin)]),
            logger: logger)
        let (kept, evicted) = state.withLock { state -> (WebPushClient, [WebPushClient]) in
            var evicted: [WebPushClient] = []
            if let entry = state.clients[key], entry.fingerprint == fingerprint {
                evicted.append(made)  // another task made it first
                return (entry.client, evicted)
            }
            if let stale = state.clients[key] { evicted.append(stale.client) }
            state.uses += 1
            state.clients[key] = (made, fingerprint, state.uses)
            while state.clients.count > maxOrigins,
                let oldest = state.clients.min(by: { $0.value.lastUsed < $1.value.lastUsed })
            {
                evicted.append(oldest.value.client)
                state.clients[oldest.key] = nil
            }
            return (made, evicted)
        }
        let grace = timeout
        for client in evicted { Task { await client.shutdown(grace: grace) } }
        logger.info("Web Push client ready", metadata: ["app": "\(key.app)", "origin": "\(key.origin)"])
        return kept
    }

    package func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        let (apps, keys) = state.withLock { ($0.apps, $0.keys) }
        var groups: [Key: [(Int, PushDelivery)]] = [:]
        for (index, job) in jobs.enumerated() {
            let app = apps.app(job.appID)
            guard keys[job.appID] != nil else {
                onAnswer(index, .noCredential("no webpush VAPID key for app \(job.appID)"))
                continue
            }
            let device = Device(token: job.request.token, kind: .webpush)
            if let problem = app.webPushProblem(device) {
                // A subscription the app no longer allows (its allow-list changed) stays registered.
                onAnswer(
                    index,
                    .classified(
                        status: nil, reason: "OriginNotAllowed: \(problem)", answer: .permanent, retryAfter: nil))
                continue
            }
            var delivery: PushDelivery
            do {
                delivery = try WebPushClient.delivery(job.request, timeout: timeout, tag: UInt64(index))
            } catch {
                // The subscription's key is not a P-256 point: no message can ever be encrypted for it.
                onAnswer(
                    index,
                    .classified(
                        status: nil, reason: "BadSubscriptionKey: \(error.reason)",
                        answer: .tokenDead(unregisteredAt: nil), retryAfter: nil))
                continue
            }
            delivery.prioritized = job.prioritized
            groups[Key(app: job.appID, origin: delivery.topic), default: []].append((index, delivery))
        }
        await withTaskGroup(of: Void.self) { group in
            for (key, items) in groups {
                guard let vapid = keys[key.app] else { continue }
                let timeout = self.timeout
                if let http1, state.withLock({ $0.http1Origins.contains(key) }) {
                    group.addTask { () async -> Void in
                        _ = await Self.deliver(items, jobs: jobs, timeout: timeout, divert: nil, onAnswer: onAnswer) {
                            deliveries, each in
                            await http1.send(deliveries, origin: key.origin, vapid: vapid, each: each)
                        }
                    }
                    continue
                }
                let client: WebPushClient
                do {
                    client = try self.client(key, vapid: vapid)
                } catch {
                    for (index, _) in items {
                        onAnswer(index, .noCredential("Web Push client for \(key.origin): \(error)"))
                    }
                    continue
                }
                let http1 = self.http1
                group.addTask { () async -> Void in
                    let divert: ((PushResponse) -> Bool)? = http1 == nil ? nil : { WebPushClient.refusedHTTP2($0) }
                    let refused = await Self.deliver(
                        items, jobs: jobs, timeout: timeout, divert: divert, onAnswer: onAnswer
                    ) { deliveries, each in await client.answers(for: deliveries, each: each) }
                    guard let http1, !refused.isEmpty else { return }
                    // The push service does not speak HTTP/2: HTTP/1.1 from now on, for this app and origin.
                    self.useHTTP1(key)
                    _ = await Self.deliver(refused, jobs: jobs, timeout: timeout, divert: nil, onAnswer: onAnswer) {
                        deliveries, each in await http1.send(deliveries, origin: key.origin, vapid: vapid, each: each)
                    }
                }
            }
        }
    }

    /// Sends `items` with `send`. A 413 (the push service takes less than 4,096 bytes) is sent once more, shrunk to
    /// half the size it refused; the second answer is the final one. Answers `divert` takes are not given to
    /// `onAnswer` but returned (to be sent another way).
    static func deliver(
        _ items: [(Int, PushDelivery)], jobs: [PushJob], timeout: Duration, divert: ((PushResponse) -> Bool)?,
        onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        send: ([PushDelivery], (PushResponse) -> Void) async -> Void
    ) async -> [(Int, PushDelivery)] {
        let byIndex = Dictionary(items, uniquingKeysWith: { a, _ in a })
        var again: [PushDelivery] = []
        var diverted: [(Int, PushDelivery)] = []
        await send(items.map(\.1)) { response in
            let index = Int(response.tag)
            if let divert, divert(response), let delivery = byIndex[index] {
                diverted.append((index, delivery))
            } else if response.status == 413, let size = byIndex[index]?.payload.count,
                let smaller = Self.shrunk(jobs[index], tag: UInt64(index), refused: size, timeout: timeout)
            {
                again.append(smaller)
            } else {
                onAnswer(index, Self.answer(response))
            }
        }
        if !again.isEmpty {
            await send(again) { response in onAnswer(Int(response.tag), Self.answer(response)) }
        }
        return diverted
    }

    /// Marks (app, origin) as HTTP/1.1 only and closes its HTTP/2 client.
    private func useHTTP1(_ key: Key) {
        let retired = state.withLock { state -> WebPushClient? in
            guard state.http1Origins.insert(key).inserted else { return nil }
            return state.clients.removeValue(forKey: key)?.client
        }
        guard let retired else { return }
        logger.warning(
            "Web Push service does not speak HTTP/2; using HTTP/1.1 for it",
            metadata: ["app": "\(key.app)", "origin": "\(key.origin)"])
        Task { await retired.shutdown(grace: .zero) }
    }

    /// The job's message shrunk to fit half of the `refused` body size once encrypted, or nil when it cannot be.
    static func shrunk(_ job: PushJob, tag: UInt64, refused: Int, timeout: Duration) -> PushDelivery? {
        let limit = refused / 2 - WebPushCrypto.overheadBytes
        guard limit > 0, let payload = WebPushPayload.shrunk(job.request.payload, toFit: limit) else { return nil }
        var request = job.request
        request.payload = payload
        guard var delivery = try? WebPushClient.delivery(request, timeout: timeout, tag: tag) else { return nil }
        delivery.prioritized = job.prioritized
        return delivery
    }

    static func answer(_ r: PushResponse) -> PushAnswer {
        if let status = r.status {
            return .classified(
                status: status, reason: r.reasonText ?? WebPushAnswerTable.reasonText(status: status),
                answer: r.answer ?? WebPushAnswerTable.classify(status: status), retryAfter: r.retryAfter)
        }
        return .failed(r.transportFailure ?? .protocolViolation("no answer"))
    }

    package func shutdown() async {
        let clients = state.withLock { state in
            let all = state.clients.values.map(\.client)
            state.clients.removeAll()
            return all
        }
        for client in clients { await client.shutdown(grace: .seconds(2)) }
        await http1?.shutdown()
    }
}
