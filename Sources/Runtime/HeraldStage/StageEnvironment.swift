import Foundation
import Logging

/// Every environment key a Herald stage reads, with its default next to it. This file is the one place they are
/// bound (docs/operations.md lists them). Keys of the form `HERALD_*` that are not listed here (or passed as
/// `extraKnownKeys`) are reported as warnings: a typo must not silently fall back to a default.
public enum EnvironmentKey: String, CaseIterable, Sendable {
    /// Pipeline file (YAML, `pipelines/`): topics, group ids, batch sizes, concurrency, per-app configuration.
    case pipeline = "HERALD_PIPELINE"
    /// Kafka bootstrap servers, comma separated.
    case kafkaBrokers = "HERALD_KAFKA_BROKERS"
    /// Redis, `redis://[:password@]host[:port][/db]`.
    case redisURL = "HERALD_REDIS_URL"
    /// Address the HTTP endpoint (/metrics, /healthz, /readyz) binds.
    case metricsHost = "HERALD_METRICS_HOST"
    /// Port of the HTTP endpoint; 0 picks a free one (logged at startup).
    case metricsPort = "HERALD_METRICS_PORT"
    /// After SIGTERM/SIGINT, the process exits (status 0) no later than this, in milliseconds.
    case shutdownDeadlineMs = "HERALD_SHUTDOWN_DEADLINE_MS"
    /// trace, debug, info, notice, warning, error, critical.
    case logLevel = "HERALD_LOG_LEVEL"
    /// Identifies this process in logs and as the Kafka client id; the host name when empty.
    case instance = "HERALD_INSTANCE"
    /// APNs host:port override (herald-send; tests point it at herald-mock-apns).
    case apnsHost = "HERALD_APNS_HOST"
    /// Extra CA certificate file to trust for APNs (herald-send with herald-mock-apns).
    case apnsCAFile = "HERALD_APNS_CA_FILE"

    /// The default used when the key is unset or empty.
    public var defaultValue: String {
        switch self {
        case .pipeline: return "pipelines/example.yaml"
        case .kafkaBrokers: return "127.0.0.1:9092"
        case .redisURL: return "redis://127.0.0.1:6379"
        case .metricsHost: return "127.0.0.1"
        case .metricsPort: return "9100"
        case .shutdownDeadlineMs: return "25000"
        case .logLevel: return "info"
        case .instance: return ""
        case .apnsHost: return ""
        case .apnsCAFile: return ""
        }
    }
}

/// A configuration value that could not be used.
public struct ConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    public let key: String
    public let value: String
    public let reason: String

    public var description: String { "\(key)=\(value): \(reason)" }
}

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
    /// One line per unknown `HERALD_*` key; log them at startup (`warning`).
    public var warnings: [String]

    /// Reads `environment` (the process environment by default). Empty values count as unset.
    /// - Parameter extraKnownKeys: further `HERALD_*` keys a particular executable reads itself, so they are not
    ///   reported as unknown.
    public init(environment: [String: String] = ProcessInfo.processInfo.environment,
                extraKnownKeys: Set<String> = []) throws {
        func value(_ key: EnvironmentKey) -> String {
            if let raw = environment[key.rawValue]?.trimmingCharacters(in: .whitespaces), !raw.isEmpty { return raw }
            return key.defaultValue
        }
        pipelineFile = value(.pipeline)
        kafkaBrokers = value(.kafkaBrokers)
        redisURL = value(.redisURL)
        metricsHost = value(.metricsHost)
        let port = value(.metricsPort)
        guard let portNumber = Int(port), (0...65535).contains(portNumber) else {
            throw ConfigurationError(key: EnvironmentKey.metricsPort.rawValue, value: port, reason: "expected a port number 0-65535")
        }
        metricsPort = portNumber
        let deadline = value(.shutdownDeadlineMs)
        guard let deadlineMs = Int64(deadline), deadlineMs > 0 else {
            throw ConfigurationError(key: EnvironmentKey.shutdownDeadlineMs.rawValue, value: deadline, reason: "expected a positive number of milliseconds")
        }
        shutdownDeadline = .milliseconds(deadlineMs)
        let level = value(.logLevel).lowercased()
        guard let parsedLevel = Logger.Level(rawValue: level) else {
            throw ConfigurationError(key: EnvironmentKey.logLevel.rawValue, value: level,
                                     reason: "expected one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        logLevel = parsedLevel
        let instanceValue = value(.instance)
        instance = instanceValue.isEmpty ? ProcessInfo.processInfo.hostName : instanceValue
        apnsHost = value(.apnsHost)
        apnsCAFile = value(.apnsCAFile)

        let known = Set(EnvironmentKey.allCases.map(\.rawValue)).union(extraKnownKeys)
        warnings = environment.keys.filter { $0.hasPrefix("HERALD_") && !known.contains($0) }.sorted().map {
            "unknown environment key \($0) (ignored); known keys: \(known.sorted().joined(separator: ", "))"
        }
    }
}
