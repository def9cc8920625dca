import Foundation
import Logging

/// The environment of a stage process, typed.
public struct StageEnvironment: Sendable, Hashable {
    public var pipelineFile: String
    public var kafkaBrokers: String
    public var redisURL: String
    public var metricsHost: String
    public var metricsPort: Int
    public var shutdownDeadline: Duration
    public var logLevel: Logger.Level
    public var instance: String
    /// Empty when unset.
    public var apnsHost: String
    /// Empty when unset.
    public var apnsCAFile: String
    /// Limits of the HTTP endpoint (and of the registry API): `HERALD_HTTP_READ_TIMEOUT_MS`,
    /// `HERALD_HTTP_IDLE_TIMEOUT_MS`, `HERALD_HTTP_MAX_CONNECTIONS`.
    public var httpLimits: HTTPServerLimits
    /// One line per unknown `HERALD_*` key; log them at startup (`warning`).
    public var warnings: [String]

    /// Reads `environment` (the process environment by default) through `ConfigKey` (ConfigKeys.swift, the one
    /// list of keys). Empty values count as unset.
    /// - Parameter extraKnownKeys: further `HERALD_*` keys not to report as unknown (tests).
    public init(
        environment: [String: String] = ProcessInfo.processInfo.environment,
        extraKnownKeys: Set<String> = []
    ) throws {
        let config = ConfigReader(environment)
        pipelineFile = try config.text(.pipeline) ?? ""
        kafkaBrokers = try config.text(.kafkaBrokers) ?? ""
        redisURL = try config.text(.redisURL) ?? ""
        metricsHost = try config.text(.metricsHost) ?? ""
        metricsPort = try config.requiredInt(.metricsPort)
        shutdownDeadline = .milliseconds(try config.requiredInt(.shutdownDeadlineMs))
        let level = try config.text(.logLevel) ?? "info"
        guard let parsedLevel = Logger.Level(rawValue: level) else {
            throw ConfigurationError(key: ConfigKey.logLevel.name, value: level, reason: "not a log level")
        }
        logLevel = parsedLevel
        instance = try config.text(.instance) ?? ProcessInfo.processInfo.hostName
        apnsHost = try config.text(.apnsHost) ?? ""
        apnsCAFile = try config.text(.apnsCAFile) ?? ""
        httpLimits = HTTPServerLimits(
            readTimeout: .milliseconds(try config.requiredInt(.httpReadTimeoutMs)),
            idleTimeout: .milliseconds(try config.requiredInt(.httpIdleTimeoutMs)),
            maxConnections: try config.requiredInt(.httpMaxConnections),
            writeTimeout: .milliseconds(try config.requiredInt(.httpWriteTimeoutMs)))
        warnings = config.unknownKeyWarnings(extraKnownKeys: extraKnownKeys)
    }
}
