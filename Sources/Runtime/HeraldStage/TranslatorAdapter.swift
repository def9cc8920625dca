import Foundation
import HeraldCore
import HeraldHTTP
import HeraldPipeline
import HeraldRedis
import Logging

/// suppress's translation cache over Redis (`StateStore.cachedTranslations`, `keepTranslations`; docs/redis-keys.md
/// "Translations").
public struct RedisTranslationCache: TranslationCache {
    public let store: StateStore
    /// The stages' clock (epoch ms): when a translation was kept, for its app's bound.
    let now: @Sendable () -> Int64

    public init(store: StateStore, now: @escaping @Sendable () -> Int64 = { BatchContext.millis(Date()) }) {
        self.store = store
        self.now = now
    }

    public func lookup(_ requests: [TranslationRequest]) async throws -> [String?] {
        try await store.cachedTranslations(requests.map(Self.key))
    }

    public func store(_ entries: [(request: TranslationRequest, text: String)]) async throws {
        // One app's requests share its policy; apps are kept apart by their keys.
        var byPolicy: [TranslatorPolicy: [(key: CachedTranslationKey, text: String)]] = [:]
        for entry in entries {
            byPolicy[entry.request.policy, default: []].append((Self.key(entry.request), entry.text))
        }
        let at = now()
        for (policy, kept) in byPolicy {
            try await store.keepTranslations(
                kept, ttlMilliseconds: policy.cacheTTLMilliseconds, maxEntries: policy.cacheMaxEntries, now: at)
        }
    }

    static func key(_ request: TranslationRequest) -> CachedTranslationKey {
        CachedTranslationKey(
            app: request.appID, messageID: request.messageID, target: request.target, source: request.source,
            text: request.text)
    }
}

/// The translation service over HTTP: LibreTranslate's `POST /translate` at the request's policy's URL, with the API
/// key its `api_key_env` names in `environment` (read once, at startup), within its deadline.
public struct LibreTranslateService: TranslationService {
    public let client: TranslateClient
    let environment: [String: String]

    public init(client: TranslateClient, environment: [String: String]) {
        self.client = client
        self.environment = environment
    }

    public func translate(_ request: TranslationRequest) async -> Result<String, TranslationFailure> {
        let policy = request.policy
        let endpoint = TranslateEndpoint(
            url: policy.endpoint, apiKey: policy.apiKeyEnv.flatMap { environment[$0] },
            deadline: .milliseconds(policy.deadlineMilliseconds))
        return await client.translate(request.text, source: request.source, target: request.target, at: endpoint)
    }
}

extension StageSetup {
    /// suppress's translator (docs/behaviour.md §7a): LibreTranslate over HTTP/1.1 (trusting
    /// `HERALD_TRANSLATOR_CA_FILE`, else the system store), with its cache in Redis on a connection of its own. Made
    /// whether or not an app has a translator now: a reloaded pipeline file may give one. Best effort like the burst
    /// ledger: a bad Redis setting leaves the translator without a cache, and a client that cannot start leaves the
    /// stage without a translator (pushes go out with the texts the events carry), each with a warning.
    public func translator(
        environment: [String: String] = ProcessInfo.processInfo.environment,
        onCacheFailure: @escaping @Sendable (any Error) -> Void
    ) -> CachedTranslator? {
        let caFile = valueOrExit { config throws(ConfigurationError) in try config.text(.translatorCAFile) }
        let client: TranslateClient
        do {
            client = try TranslateClient(
                configuration: HTTP1ClientConfiguration(
                    trustedCAFile: caFile, maxInFlight: 4096, maxConnectionsPerHost: 16))
        } catch {
            logger.warning("translator off: its HTTP client did not start", metadata: [LogKey.error: "\(error)"])
            return nil
        }
        var cache: RedisTranslationCache?
        do {
            let connection = RedisConnection(configuration: try redisConfiguration(), logger: logger)
            cache = RedisTranslationCache(store: StateStore(connection: connection, logger: logger))
        } catch {
            logger.warning("translation cache off: \(error)")
        }
        Self.warnAboutTranslatorKeys(pipeline.apps, environment: environment, logger: logger)
        return CachedTranslator(
            cache: cache, service: LibreTranslateService(client: client, environment: environment),
            onCacheFailure: onCacheFailure)
    }

    /// One warning per app whose translator names an API key variable that is not set (its requests then carry no
    /// key; a server that requires one answers 403 and the pushes go out untranslated).
    public static func warnAboutTranslatorKeys(
        _ apps: AppDirectory, environment: [String: String], logger: Logger
    ) {
        for (id, app) in apps.apps.sorted(by: { $0.key < $1.key }) {
            guard let name = app.translator?.apiKeyEnv, environment[name]?.isEmpty ?? true else { continue }
            logger.warning(
                "translator API key variable is not set; requests carry no api_key",
                metadata: [LogKey.app: "\(id)", LogKey.variable: "\(name)"])
        }
    }
}
