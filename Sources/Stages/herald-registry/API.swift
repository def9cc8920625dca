// The registry HTTP API (docs/registry-api.md) in the herald-registry process: its own port, the stage's HTTP
// endpoint code (HeraldStage's StageHTTPServer) with the API's routes, the stage's Redis connection for reads,
// and a producer of its own for herald.registry.
import Foundation
import HeraldConfig
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
        var clients: [RegistryAPI.Client] = []
        for (name, variable) in config.clients.sorted(by: { $0.key < $1.key }) {
            guard let token = setup.config.environment[variable].flatMap({ $0.isEmpty ? nil : $0 }) else {
                throw APIConfigurationError(
                    key: variable, value: "",
                    reason: "the token of API client \(name) (api.clients.\(name).token_env) is not set")
            }
            clients.append(RegistryAPI.Client(name: name, token: token))
        }
        if let raw = setup.config.raw(.apiTokens) {
            for entry in raw.split(separator: ",") {
                let parts = entry.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, !parts[0].isEmpty, parts[1].count >= 16 else {
                    // The value holds secrets: the error shows only the client names given.
                    throw APIConfigurationError(
                        key: ConfigKey.apiTokens.name, value: "(hidden)",
                        reason: "expected name=token pairs, comma separated, tokens of at least 16 characters")
                }
                clients.append(RegistryAPI.Client(name: String(parts[0]), token: String(parts[1])))
            }
        }
        if clients.isEmpty {
            throw APIConfigurationError(
                key: ConfigKey.apiPort.name, value: String(port),
                reason: "the registry API needs at least one client token (api.clients or HERALD_API_TOKENS)")
        }
        let producer = try setup.producer()
        var operations = RegistryOperations(
            sink: KafkaRegistrySink(producer: producer, topic: setup.pipeline.kafka.topics.registry),
            store: StateStore(connection: redis, logger: setup.logger),
            explain: ExplainStore(connection: redis, ttlMilliseconds: setup.explainTTLMilliseconds))
        operations.replayWindowMilliseconds = Int64(setup.pipeline.idempotency.replayWindowSeconds) * 1000
        let api = RegistryAPI(operations: operations, clients: clients, logger: setup.logger) { route, status, client in
            Counter(
                label: StageMetrics.Name.apiRequests,
                dimensions: [("stage", "registry"), ("route", route), ("status", String(status)), ("client", client)]
            ).increment()
        }
        let host = setup.config.raw(.apiHost) ?? config.host
        let server = try await StageHTTPServer.bind(
            host: host, port: port, registry: setup.context.registry, readiness: setup.context.readiness,
            logger: setup.logger,
            routes: { request in
                // /healthz falls through to the endpoint's own answer; everything else is the API's.
                if request.path == "/healthz" { return nil }
                let answer = await api.handle(
                    method: request.method, path: request.path, headers: request.headers, body: request.body)
                return HTTPRouteResponse(status: answer.status, body: answer.body)
            })
        setup.logger.info(
            "registry api listening",
            metadata: [
                "host": "\(host)", "port": "\(server.port)", "clients": "\(clients.map(\.name).joined(separator: ","))",
            ])
        return server
    }
}
