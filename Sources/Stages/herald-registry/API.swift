// The registry HTTP API (docs/registry-api.md) in the herald-registry process: its own port, the stage's HTTP
// endpoint code (HeraldStage's StageHTTPServer) with the API's routes, the stage's Redis connection for reads,
// and a producer of its own for herald.registry.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldRedis
import HeraldRegistryAPI
import HeraldStage
import Metrics

/// A bad API setting: the key, and why (never the value of a token).
struct APIConfigurationError: Error, CustomStringConvertible {
    var key: String
    var value: String
    var reason: String
    var description: String { "\(key)=\(value): \(reason)" }
}

enum RegistryAPIServer {
    /// The API as a service, or nil when no port is configured. A port without any client token is a
    /// configuration error: the API never runs open.
    static func make(setup: StageSetup, redis: RedisConnection) async throws -> StageHTTPServer? {
        let config = setup.pipeline.api
        let port: Int
        if let p = setup.valueOrExit({ c throws(ConfigurationError) in try c.int(.apiPort) }) {
            port = p
        } else if let p = config.port {
            port = p
        } else {
            return nil
        }
        let clients = try Self.clients(setup: setup)
        if clients.isEmpty {
            throw APIConfigurationError(
                key: ConfigKey.apiPort.name, value: String(port),
                reason: "the registry API needs at least one client token (api.clients or HERALD_API_TOKENS)")
        }
        let limits = try Self.preferenceLimits(setup.config)
        let producer = try setup.producer()
        var operations = RegistryOperations(
            sink: KafkaRegistrySink(producer: producer, topic: setup.pipeline.kafka.topics.registry),
            store: StateStore(
                connection: redis, logger: setup.logger,
                deliveredShards: UInt64(setup.pipeline.idempotency.shards)),
            explain: ExplainStore(
                connection: redis, ttlMilliseconds: setup.explainTTLMilliseconds,
                lastDecisionShards: UInt64(setup.pipeline.explain.lastDecisionShards),
                logShards: UInt64(setup.pipeline.explain.logShards)),
            preferenceLimits: limits)
        operations.replayWindowMilliseconds = Int64(setup.pipeline.idempotency.replayWindowSeconds) * 1000
        let perMinute = setup.valueOrExit({ c throws(ConfigurationError) in
            try c.requiredInt(.apiAuthFailuresPerMinute)
        })
        let api = RegistryAPI(
            operations: operations, clients: clients, logger: setup.logger, apps: setup.pipeline.apps,
            limiter: AuthFailureLimiter(perMinute: perMinute)
        ) { route, status, client in
            Counter(
                label: StageMetrics.Name.apiRequests,
                dimensions: [("stage", "registry"), ("route", route), ("status", String(status)), ("client", client)]
            ).increment()
        }
        let host = setup.config.raw(.apiHost) ?? config.host
        let server = try await StageHTTPServer.bind(
            host: host, port: port, registry: setup.context.registry, readiness: setup.context.readiness,
            readinessLabels: [("stage", "registry")], logger: setup.logger,
            routes: { request in
                // /healthz falls through to the endpoint's own answer; everything else is the API's.
                if request.path == "/healthz" { return nil }
                let answer = await api.handle(
                    method: request.method, path: request.path, query: request.query, headers: request.headers,
                    body: request.body, remote: request.remoteAddress)
                return HTTPRouteResponse(
                    status: answer.status, body: answer.body, headers: answer.headers.sorted { $0.key < $1.key })
            },
            admit: { head in
                // /healthz answers without authentication, so it takes nothing else: GET or HEAD, no body (else a
                // client could make the server read a body of up to the body limit without a token).
                if head.path == "/healthz" { return StageHTTPServer.healthCheckHead(head) }
                return api.checkHead(
                    method: head.method, path: head.path, headers: head.headers, remote: head.remoteAddress
                ).map {
                    HTTPRouteResponse(status: $0.status, body: $0.body, headers: $0.headers.sorted { $0.key < $1.key })
                }
            },
            limits: setup.context.environment.httpLimits, endpoint: "api")
        setup.logger.info(
            "registry api listening",
            metadata: [
                "host": "\(host)", "port": "\(server.port)", "clients": "\(clients.map(\.name).joined(separator: ","))",
            ])
        for client in clients where client.apps == nil {
            setup.logger.notice(
                "registry api client may use every app (api.clients.<name>.apps limits it)",
                metadata: ["client": "\(client.name)"])
        }
        return server
    }

    /// The API's clients: `api.clients` (each token from its `token_env` variable) and `HERALD_API_TOKENS`
    /// (`name=token` pairs). Every token, from either source, has at least `RegistryAPI.minimumTokenLength`
    /// characters; a client's apps come from `api.clients.<name>.apps` (a `HERALD_API_TOKENS` name takes the apps of
    /// the `api.clients` entry of the same name, if there is one).
    static func clients(setup: StageSetup) throws -> [RegistryAPI.Client] {
        let config = setup.pipeline.api
        let minimum = RegistryAPI.minimumTokenLength
        func scope(_ name: String) -> Set<String>? { config.clientApps[name].map(Set.init) }
        var clients: [RegistryAPI.Client] = []
        for (name, variable) in config.clients.sorted(by: { $0.key < $1.key }) {
            guard let token = setup.config.environment[variable].flatMap({ $0.isEmpty ? nil : $0 }) else {
                throw APIConfigurationError(
                    key: variable, value: "",
                    reason: "the token of API client \(name) (api.clients.\(name).token_env) is not set")
            }
            guard token.count >= minimum else {
                throw APIConfigurationError(
                    key: variable, value: "(hidden)",
                    reason: "the token of API client \(name) is shorter than \(minimum) characters")
            }
            clients.append(RegistryAPI.Client(name: name, token: token, apps: scope(name)))
        }
        if let raw = setup.config.raw(.apiTokens) {
            for entry in raw.split(separator: ",") {
                let parts = entry.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, !parts[0].isEmpty, parts[1].count >= minimum else {
                    // The value holds secrets: the error shows only the client names given.
                    throw APIConfigurationError(
                        key: ConfigKey.apiTokens.name, value: "(hidden)",
                        reason: "expected name=token pairs, comma separated, tokens of at least \(minimum) characters")
                }
                let name = String(parts[0])
                clients.append(RegistryAPI.Client(name: name, token: String(parts[1]), apps: scope(name)))
            }
        }
        return clients
    }

    /// `HERALD_PREFERENCES_MAX_CONVERSATIONS` and `HERALD_PREFERENCES_MAX_BYTES`.
    static func preferenceLimits(_ config: ConfigReader) throws(ConfigurationError) -> PreferenceLimits {
        PreferenceLimits(
            maxConversations: try config.requiredInt(.preferencesMaxConversations),
            maxBytes: try config.requiredInt(.preferencesMaxBytes))
    }
}
