import ArgumentParser
import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldRegistryAPI
import HeraldToolSupport
import Logging

/// Where Kafka is. Every heraldctl command finds Kafka, Redis and the stages the same way: its option, else the
/// variable the stages read (`HERALD_KAFKA_BROKERS`, `HERALD_REDIS_URL`; `HERALD_STAGE_ENDPOINTS` for `status`),
/// else the stages' own default (127.0.0.1:9092, redis://127.0.0.1:6379, 127.0.0.1:9101-9106).
/// scripts/local-stack.sh prints the `export` line for its ports.
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

    /// The client configuration, once a bootstrap server accepted a TCP connection; else exit status 1 at once with
    /// one line naming the servers tried (librdkafka would keep retrying until its own timeout).
    var client: KafkaClientConfiguration {
        var failures: [String] = []
        for server in brokerList {
            let address = Self.hostAndPort(server)
            switch TCPConnect.open(host: address.host, port: address.port, timeout: 3) {
            case .success(let fd):
                close(fd)
                return KafkaClientConfiguration(brokers: brokerList, clientID: "heraldctl")
            case .failure(let error):
                failures.append("\(server): \(error)")
            }
        }
        CLI.fail(
            "kafka: no broker accepts connections (\(failures.joined(separator: "; "))); give --brokers or set HERALD_KAFKA_BROKERS"
        )
    }

    /// The host and port of a bootstrap server: `host:port` or `[v6]:port`, a `PLAINTEXT://` or similar prefix
    /// dropped, port 9092 when none is given (as librdkafka does). Text that is neither is tried as a host name.
    static func hostAndPort(_ server: String) -> ServiceEndpoint {
        var rest = Substring(server)
        if let scheme = rest.range(of: "://") { rest = rest[scheme.upperBound...] }
        return ServiceEndpoint(parsing: String(rest), defaultPort: 9092)
            ?? ServiceEndpoint(host: String(rest), port: 9092)
    }

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
            "Redis URL redis://[[user]:password@]host[:port][/db], or rediss:// for TLS, or a Redis Cluster redis+cluster:// (rediss+cluster://) with [user:password@]host:port[,host:port...] (default: $HERALD_REDIS_URL, else redis://127.0.0.1:6379)."
    )
    var url: String?

    /// The environment keys of the TLS options, which the stages read too.
    enum TLSKey: String {
        case caFile = "HERALD_REDIS_CA_FILE"
        case certificateFile = "HERALD_REDIS_CERT_FILE"
        case keyFile = "HERALD_REDIS_KEY_FILE"
        case serverName = "HERALD_REDIS_SERVER_NAME"

        /// The help of the option whose default this key holds.
        func help(_ text: String) -> ArgumentHelp { ArgumentHelp("rediss://: \(text) (default: $\(rawValue)).") }
    }

    @Option(
        name: .customLong("redis-ca-file"),
        help: TLSKey.caFile.help("PEM CA certificates to trust instead of the system store"))
    var caFile: String?
    @Option(
        name: .customLong("redis-cert-file"),
        help: TLSKey.certificateFile.help("PEM client certificate, with --redis-key-file"))
    var certificateFile: String?
    @Option(name: .customLong("redis-key-file"), help: TLSKey.keyFile.help("PEM private key of the client certificate"))
    var keyFile: String?
    @Option(
        name: .customLong("redis-server-name"),
        help: TLSKey.serverName.help("the name Redis's certificate must carry, when not the URL's host"))
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
            caFile: caFile ?? Self.environment(TLSKey.caFile.rawValue),
            certificateFile: certificateFile ?? Self.environment(TLSKey.certificateFile.rawValue),
            keyFile: keyFile ?? Self.environment(TLSKey.keyFile.rawValue),
            serverName: serverName ?? Self.environment(TLSKey.serverName.rawValue))
        return configuration
    }

    /// A connected state store, or exit status 1 with one line naming the problem.
    func store(deliveredShards: UInt64 = RedisKeys.deliveredShards) async -> StateStore {
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
        return StateStore(connection: connection, logger: CLI.quietLogger, deliveredShards: deliveredShards)
    }

    /// Runs `body` with a connected state store; a Redis error ends heraldctl with exit status 1 and
    /// `redis: <error>`.
    func withStore<T>(_ body: (StateStore) async throws -> T) async -> T {
        let store = await store()
        do {
            return try await body(store)
        } catch {
            CLI.fail("redis: \(error)")
        }
    }
}

/// Where a registry change goes: straight into Redis (the operator path, applied at once), or with --via-kafka as
/// a record on herald.registry that herald-registry applies. With --via-kafka, `--traceparent` (and `--tracestate`)
/// put a W3C trace context on the record, so herald-registry continues that trace (docs/operations.md "Tracing").
struct RegistryWriteOptions: ParsableArguments {
    @Flag(name: .customLong("via-kafka"), help: "Publish to the registry topic instead of writing Redis.")
    var viaKafka = false
    @Option(
        name: .customLong("traceparent"),
        help: "With --via-kafka: a W3C traceparent the record carries, so herald-registry continues that trace.")
    var traceparent: String?
    @Option(name: .customLong("tracestate"), help: "With --traceparent: the W3C tracestate passed on with it.")
    var tracestate: String?
    @OptionGroup var redis: RedisOptions
    @OptionGroup var kafka: KafkaOptions
    @OptionGroup var topics: TopicOptions

    /// The trace context the record carries (nil without `--traceparent`).
    var trace: RegistryTrace? { RegistryTrace(traceparent: traceparent, tracestate: tracestate) }

    func validate() throws {
        if tracestate != nil && traceparent == nil { throw ValidationError("--tracestate needs --traceparent") }
        guard let traceparent else { return }
        if !viaKafka { throw ValidationError("--traceparent needs --via-kafka (a Redis write makes no record)") }
        if RegistryTrace(traceparent: traceparent) == nil {
            throw ValidationError("--traceparent is not a valid W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
        }
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

    static func out(_ line: String) { write(line + "\n") }

    static func warn(_ line: String) {
        write(line.replacingOccurrences(of: "\n", with: " ") + "\n", to: .standardError)
    }

    /// Writes `text` as it is. Foundation's non-throwing `write(_:)` traps when the reader has gone (`heraldctl
    /// ... | head`): standard output that cannot be written ends heraldctl with 141, as a writer killed by SIGPIPE
    /// would; standard error that cannot be written is given up.
    static func write(_ text: String, to handle: FileHandle = .standardOutput) {
        do {
            try handle.write(contentsOf: Data(text.utf8))
        } catch {
            if handle.fileDescriptor == FileHandle.standardOutput.fileDescriptor { Foundation.exit(141) }
        }
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

    /// A report object as one line of compact JSON, its keys sorted, written by HeraldCore's JSON writer (the one
    /// codec, docs/architecture.md, "JSON").
    static func json(_ members: [String: JSONValue]) -> String { JSONValue.sorted(members).serialized }

    static func iso(_ millis: Int64) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return f.string(from: Date(timeIntervalSince1970: Double(millis) / 1000))
    }
}

/// How the pipeline file lays out the keys that grow with traffic (docs/pipeline-config.md): send's replay window
/// and the three shard counts. Commands that read those keys must be given the file's values when they differ
/// from the defaults.
struct KeyLayoutOptions: ParsableArguments {
    @Option(
        name: .customLong("replay-window-seconds"),
        help: "send's replay window (the pipeline file's idempotency.replay_window_seconds).")
    var replayWindowSeconds = Int(StateStore.defaultReplayWindowMilliseconds / 1000)
    @Option(
        name: .customLong("delivery-shards"),
        help: "send's delivery-record shards (the pipeline file's idempotency.shards).")
    var deliveryShards = Int(RedisKeys.deliveredShards)
    @Option(
        name: .customLong("last-decision-shards"),
        help: "Shards of the users' latest decisions (the pipeline file's explain.last_decision_shards).")
    var lastDecisionShards = Int(RedisKeys.lastDecisionShards)
    @Option(
        name: .customLong("log-shards"), help: "Shards of the explain trail's hourly logs (explain.log_shards).")
    var logShards = Int(RedisKeys.explainShards)

    func validate() throws {
        guard replayWindowSeconds >= 1, deliveryShards >= 1, lastDecisionShards >= 1, logShards >= 1 else {
            throw ValidationError(
                "--replay-window-seconds, --delivery-shards, --last-decision-shards and --log-shards must be at least 1"
            )
        }
    }

    var windowMilliseconds: Int64 { Int64(replayWindowSeconds) * 1000 }
}
