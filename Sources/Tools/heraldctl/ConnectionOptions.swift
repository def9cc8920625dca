import ArgumentParser
import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldRedis
import Logging

/// Where Kafka is. Defaults come from the environment the stages read (HERALD_KAFKA_BROKERS).
struct KafkaOptions: ParsableArguments {
    @Option(
        name: .long,
        help: "Kafka bootstrap servers, comma separated (default: $HERALD_KAFKA_BROKERS, else 127.0.0.1:9092).")
    var brokers: String?

    var brokerList: [String] {
        let raw =
            brokers ?? ProcessInfo.processInfo.environment["HERALD_KAFKA_BROKERS"].flatMap { $0.isEmpty ? nil : $0 }
            ?? "127.0.0.1:9092"
        return raw.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    var client: KafkaClientConfiguration { KafkaClientConfiguration(brokers: brokerList, clientID: "heraldctl") }

    func producer() throws -> KafkaProducer {
        var configuration = KafkaProducerConfiguration(client: client)
        configuration.deliveryTimeout = .seconds(15)
        do {
            return try KafkaProducer(configuration: configuration, logger: CLI.quietLogger)
        } catch {
            CLI.fail("kafka: \(error.description)")
        }
    }
}

/// Where Redis is. Defaults from HERALD_REDIS_URL and the HERALD_REDIS_* TLS keys, like the stages.
struct RedisOptions: ParsableArguments {
    @Option(
        name: .customLong("redis"),
        help:
            "Redis URL redis://[[user]:password@]host[:port][/db], or rediss:// for TLS (default: $HERALD_REDIS_URL, else redis://127.0.0.1:6379)."
    )
    var url: String?

    @Option(
        name: .customLong("redis-ca-file"),
        help: "rediss://: PEM CA certificates to trust instead of the system store (default: $HERALD_REDIS_CA_FILE).")
    var caFile: String?

    @Option(
        name: .customLong("redis-cert-file"),
        help: "rediss://: PEM client certificate, with --redis-key-file (default: $HERALD_REDIS_CERT_FILE).")
    var certificateFile: String?

    @Option(
        name: .customLong("redis-key-file"),
        help: "rediss://: PEM private key of the client certificate (default: $HERALD_REDIS_KEY_FILE).")
    var keyFile: String?

    @Option(
        name: .customLong("redis-server-name"),
        help:
            "rediss://: the name Redis's certificate must carry, when not the URL's host (default: $HERALD_REDIS_SERVER_NAME)."
    )
    var serverName: String?

    var resolvedURL: String {
        url ?? Self.environment("HERALD_REDIS_URL") ?? "redis://127.0.0.1:6379"
    }

    private static func environment(_ name: String) -> String? {
        ProcessInfo.processInfo.environment[name].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The URL with the TLS options (or their environment keys) applied.
    func configuration() throws -> RedisConfiguration {
        var configuration = try RedisConfiguration(url: resolvedURL)
        try configuration.applyTLS(
            caFile: caFile ?? Self.environment("HERALD_REDIS_CA_FILE"),
            certificateFile: certificateFile ?? Self.environment("HERALD_REDIS_CERT_FILE"),
            keyFile: keyFile ?? Self.environment("HERALD_REDIS_KEY_FILE"),
            serverName: serverName ?? Self.environment("HERALD_REDIS_SERVER_NAME"))
        return configuration
    }

    /// A connected state store, or exit status 1 with one line naming the problem.
    func store() async -> StateStore {
        let configuration: RedisConfiguration
        do {
            configuration = try self.configuration()
        } catch {
            CLI.fail("redis: \(error)", status: 2)
        }
        let connection = RedisConnection(configuration: configuration, logger: CLI.quietLogger)
        do {
            try await connection.connect()
        } catch {
            CLI.fail("redis: cannot connect to \(RedisConfiguration.redacted(resolvedURL)): \(error)")
        }
        return StateStore(connection: connection, logger: CLI.quietLogger)
    }
}

/// Topic names: defaults of docs/behaviour.md §1, or those of a pipeline file.
struct TopicOptions: ParsableArguments {
    @Option(name: .long, help: "Pipeline YAML whose kafka.topics names to use (default: the standard names).")
    var pipeline: String?

    func topics() -> TopicNames {
        guard let pipeline else { return TopicNames() }
        do {
            return try PipelineLoader.load(path: pipeline).config.kafka.topics
        } catch {
            CLI.fail("pipeline: \(error.description)", status: 2)
        }
    }
}

/// Small helpers shared by the subcommands.
enum CLI {
    /// librdkafka and hiredis log lines are not wanted on an operator's terminal (errors surface as thrown errors).
    static let quietLogger: Logger = {
        var logger = Logger(label: "heraldctl")
        logger.logLevel = .critical
        return logger
    }()

    static func nowMillis() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }

    static func out(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    static func warn(_ line: String) {
        FileHandle.standardError.write(Data((line.replacingOccurrences(of: "\n", with: " ") + "\n").utf8))
    }

    /// One line on stderr and the exit status: 2 for bad input, 1 for a failure of Kafka or Redis.
    static func fail(_ line: String, status: Int32 = 1) -> Never {
        warn(line)
        Foundation.exit(status)
    }

    static func read(_ path: String, what: String) -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: path) else {
            fail("\(what): cannot read file \(path)", status: 2)
        }
        return Array(data)
    }

    /// A token shortened for output (8 characters and an ellipsis), as the logs do.
    static func short(_ token: String) -> String { token.count > 8 ? token.prefix(8) + "…" : token }

    /// Compact JSON of a Foundation object with sorted keys.
    static func json(_ object: Any) -> String {
        guard
            let data = try? JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        else {
            return "{}"
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// The value, or JSON null.
    static func orNull(_ value: Any?) -> Any { value ?? NSNull() }

    static func iso(_ millis: Int64) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return f.string(from: Date(timeIntervalSince1970: Double(millis) / 1000))
    }
}
