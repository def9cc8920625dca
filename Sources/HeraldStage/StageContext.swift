import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle

/// What a stage executable sets up first, in one call: environment, JSON logging, the Prometheus backend, the
/// readiness checks and the bound HTTP endpoint.
///
/// ```swift
/// let stage = try await StageContext.start(stage: "resolve")
/// let redis = RedisConnection(configuration: try RedisConfiguration(url: stage.environment.redisURL), logger: stage.logger)
/// stage.readiness.register("redis") { await redis.ping() }
/// let status = await stage.runtime(services: [producer, consumerLoop]).run()
/// exit(status)
/// ```
public struct StageContext: Sendable {
    public let stage: String
    public let environment: StageEnvironment
    public let logger: Logger
    public let registry: PrometheusCollectorRegistry
    public let metrics: StageMetrics
    public let readiness: ReadinessChecks
    public let http: StageHTTPServer

    /// Bootstraps logging (JSON lines on stderr at `HERALD_LOG_LEVEL`) and metrics (once per process), logs the
    /// unknown-key warnings, and binds the HTTP endpoint on `HERALD_METRICS_HOST:HERALD_METRICS_PORT`.
    /// Throws `ConfigurationError` for a bad environment value, or the bind error.
    public static func start(stage: String, environment: [String: String] = ProcessInfo.processInfo.environment,
                             extraKnownKeys: Set<String> = []) async throws -> StageContext {
        let parsed = try StageEnvironment(environment: environment, extraKnownKeys: extraKnownKeys)
        JSONLogHandler.bootstrap(level: parsed.logLevel)
        var logger = Logger(label: "herald.\(stage)")
        logger[metadataKey: LogKey.stage] = .string(stage)
        logger[metadataKey: "instance"] = .string(parsed.instance)
        for warning in parsed.warnings {
            logger.warning("\(warning)")
        }
        let registry = HeraldMetrics.bootstrap()
        let readiness = ReadinessChecks()
        let http = try await StageHTTPServer.bind(host: parsed.metricsHost, port: parsed.metricsPort, registry: registry,
                                                  readiness: readiness, readinessLabels: [("stage", stage)], logger: logger)
        return StageContext(stage: stage, environment: parsed, logger: logger, registry: registry,
                            metrics: StageMetrics(stage: stage), readiness: readiness, http: http)
    }

    /// The runtime over the HTTP endpoint and `services` (in dependency order; the last listed stops first),
    /// with SIGTERM/SIGINT handling and `HERALD_SHUTDOWN_DEADLINE_MS`.
    public func runtime(services: [any Service]) -> StageRuntime {
        StageRuntime(http: http, services: services, readiness: readiness,
                     shutdownDeadline: environment.shutdownDeadline, logger: logger)
    }
}
