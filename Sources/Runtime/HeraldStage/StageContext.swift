import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import Synchronization

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
///
/// `start` is `StageBootstrap.bootstrapProcess` (process-wide, once) followed by `make` (no process-wide effect),
/// so tests build contexts with `make` and their own registry and log handler.
public struct StageContext: Sendable {
    public let stage: String
    public let environment: StageEnvironment
    public let logger: Logger
    public let registry: PrometheusCollectorRegistry
    public let metrics: StageMetrics
    public let readiness: ReadinessChecks
    public let http: StageHTTPServer

    /// For a stage's `main`: parses the environment, bootstraps the process (JSON logs on stderr at
    /// `HERALD_LOG_LEVEL`, the Prometheus backend, SIGPIPE ignored) and then does what `make` does.
    /// Throws `ConfigurationError` for a bad environment value, or the bind error.
    public static func start(
        stage: String, environment: [String: String] = ProcessInfo.processInfo.environment,
        extraKnownKeys: Set<String> = []
    ) async throws -> StageContext {
        let parsed = try StageEnvironment(environment: environment, extraKnownKeys: extraKnownKeys)
        let registry = StageBootstrap.bootstrapProcess(logLevel: parsed.logLevel)
        return try await make(
            stage: stage, environment: parsed, registry: registry, logger: Logger(label: "herald.\(stage)"))
    }

    /// The context over parts handed in, touching nothing process-wide: tags `logger` with the stage and instance,
    /// logs the environment's unknown-key warnings through it, makes the stage's metrics in `registry`, and binds
    /// the HTTP endpoint (`/metrics` from `registry`, `/healthz`, `/readyz`) on
    /// `HERALD_METRICS_HOST:HERALD_METRICS_PORT` (port 0: the kernel picks one; `http.port` tells which).
    public static func make(
        stage: String, environment: StageEnvironment, registry: PrometheusCollectorRegistry,
        logger: Logger
    ) async throws -> StageContext {
        var logger = logger
        logger[metadataKey: LogKey.stage] = .string(stage)
        logger[metadataKey: "instance"] = .string(environment.instance)
        for warning in environment.warnings {
            logger.warning("\(warning)")
        }
        let readiness = ReadinessChecks()
        let http = try await StageHTTPServer.bind(
            host: environment.metricsHost, port: environment.metricsPort,
            registry: registry, readiness: readiness,
            readinessLabels: [("stage", stage)], logger: logger, limits: environment.httpLimits)
        return StageContext(
            stage: stage, environment: environment, logger: logger, registry: registry,
            metrics: StageMetrics(stage: stage, factory: HeraldMetrics.makeFactory(registry: registry)),
            readiness: readiness, http: http)
    }

    /// The runtime over the HTTP endpoint and `services` (in dependency order; the last listed stops first),
    /// with SIGTERM/SIGINT handling and `HERALD_SHUTDOWN_DEADLINE_MS`.
    public func runtime(services: [any Service]) -> StageRuntime {
        StageRuntime(
            http: http, services: services, readiness: readiness,
            shutdownDeadline: environment.shutdownDeadline, logger: logger)
    }
}

/// What holds for the whole process and may be set only once. Only executables call this (through
/// `StageContext.start`); libraries and tests never do.
public enum StageBootstrap {
    private static let bootstrapped = Mutex<PrometheusCollectorRegistry?>(nil)

    /// Once per process (later calls return the first registry and change nothing):
    /// - ignores SIGPIPE: hiredis and OpenSSL write to sockets with write(2), and a write to a connection the peer
    ///   reset would otherwise kill the process; ignored, it fails with EPIPE, which the adapters treat as a broken
    ///   connection and retry;
    /// - installs the JSON log handler at `logLevel` (swift-log allows one bootstrap per process);
    /// - installs the Prometheus metrics backend and returns its registry (swift-metrics, likewise).
    @discardableResult
    public static func bootstrapProcess(logLevel: Logger.Level) -> PrometheusCollectorRegistry {
        bootstrapped.withLock { registry in
            if let registry { return registry }
            signal(SIGPIPE, SIG_IGN)
            JSONLogHandler.bootstrap(level: logLevel)
            let made = HeraldMetrics.bootstrap()
            registry = made
            return made
        }
    }
}
