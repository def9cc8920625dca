import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldPipeline
import HeraldRedis
import HeraldTracing
import Logging
import ServiceLifecycle
import Synchronization

/// What every stage executable builds before running its loop: the pipeline file, the stage context
/// (logs, metrics, HTTP endpoint), and the Kafka / Redis settings from the pipeline file and environment.
public struct StageSetup: Sendable {
    public let stage: StageName
    public let context: StageContext
    public let pipeline: PipelineConfig
    public let settings: StageSettings
    public let brokers: [String]
    public let sessionTimeout: Duration
    /// `kafka.rebalance` / `HERALD_KAFKA_REBALANCE`.
    public let rebalance: RebalanceProtocol
    /// `HERALD_KAFKA_GROUP_INSTANCE_ID`: static membership when set.
    public let groupInstanceID: String?
    public let maxInFlight: Int
    public let explainTTLMilliseconds: Int64
    /// The environment, read through `ConfigKey`s.
    public let config: ConfigReader
    /// The pipeline file's `tracing:` section with the `OTEL_*` environment over it.
    public let tracing: TracingSettings
    /// The span exporter when tracing is on; its service runs first in the stage's service group and stops last.
    public let spanExport: SpanExport?
    /// Shared by the stage's consumers: with the idle backoff, none of them goes idle while another one works.
    let consumerActivity = ConsumerActivity()

    /// Reads `HERALD_PIPELINE` and the environment, binds the metrics endpoint (`HERALD_METRICS_PORT`, else
    /// the pipeline's `stages.<stage>.metrics_port`) and logs unknown keys.
    /// `start` for a stage's `main`: a configuration error is one line on stderr and exit status 2.
    public static func startOrExit(_ stage: StageName, extraKnownKeys: Set<String> = []) async -> StageSetup {
        do { return try await start(stage, extraKnownKeys: extraKnownKeys) } catch { exitAtStartup(stage, error) }
    }

    private static func exitAtStartup(_ stage: StageName, _ error: any Error) -> Never {
        FileHandle.standardError.write(Data("herald-\(stage.rawValue): \(error)\n".utf8))
        exit(2)
    }

    public static func start(
        _ stage: StageName, extraKnownKeys: Set<String> = [],
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) async throws -> StageSetup {
        let config = ConfigReader(environment)
        let path = try config.text(.pipeline) ?? ConfigKey.pipeline.defaultValue ?? ""
        let loaded = try PipelineLoader.load(path: path)
        var pipeline = try loaded.config.applying(config)
        var settings = pipeline.stages[stage]
        var effective = environment
        if config.raw(.metricsPort) == nil {
            effective[ConfigKey.metricsPort.name] = String(settings.metricsPort)
        }
        let context = try await StageContext.start(
            stage: stage.rawValue, environment: effective,
            extraKnownKeys: extraKnownKeys.union(loaded.config.environmentKeys))
        for warning in loaded.warnings {
            context.logger.warning("pipeline file: \(warning)", metadata: ["file": "\(path)"])
        }
        context.logger.info("kafka profile", metadata: ["profile": "\(pipeline.kafka.profile.rawValue)"])
        for line in pipeline.kafka.profileOverrides {
            context.logger.notice("pipeline file: \(line)", metadata: ["file": "\(path)"])
        }
        // Secrets named by `kafka.properties_env` / `properties_file` are read here, once; their values are never
        // logged (an error names the property and the variable or file).
        pipeline.kafka.properties = try pipeline.kafka.resolvedProperties(environment: environment)
        KeyFiles.warnAboutExposedKafkaSecrets(pipeline.kafka.propertiesFile, logger: context.logger)

        if let group = try config.text(.groupID) { settings.groupID = group }
        if let size = try config.int(.batchSize) { settings.batchSize = size }
        if let wait = try config.int(.batchTimeoutMs) { settings.batchTimeoutMs = wait }
        let session = try config.int(.kafkaSessionTimeoutMs) ?? pipeline.kafka.sessionTimeoutMs
        pipeline.kafka.sessionTimeoutMs = session
        let rebalanceName = try config.text(.kafkaRebalance) ?? pipeline.kafka.rebalance
        pipeline.kafka.rebalance = rebalanceName
        let rebalance = RebalanceProtocol(rawValue: rebalanceName) ?? .cooperative
        let groupInstanceID = try config.text(.kafkaGroupInstanceID).flatMap { $0.isEmpty ? nil : $0 }
        let brokers = pipeline.kafka.brokers.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }
        let explainTTL = Int64(try config.requiredInt(.explainTTLSeconds)) * 1000
        let tracing = try TracingSettings(
            file: pipeline.tracing, environment: environment, stage: "herald-\(stage.rawValue)")
        let metrics = context.metrics
        let spanExport =
            tracing.enabled
            ? try SpanExport(
                settings: tracing, logger: context.logger,
                dropped: { reason, count in metrics.traceSpansDropped(reason: reason, count: count) })
            : nil
        if tracing.enabled {
            context.logger.info(
                "tracing on",
                metadata: [
                    "sample_ratio": "\(tracing.sampleRatio)", "endpoint": "\(tracing.tracesEndpoint)",
                    "service_name": "\(tracing.serviceName)",
                ])
        }
        context.logger.info(
            "stage starting",
            metadata: [
                "version": "\(HeraldVersion.current)", "pipeline": "\(path)",
                "brokers": "\(brokers.joined(separator: ","))", "group": "\(settings.groupID)",
                "batch_size": "\(settings.batchSize)", "session_timeout_ms": "\(session)",
                "rebalance": "\(rebalance.rawValue)", "static_membership": "\(groupInstanceID != nil)",
                "metrics_port": "\(context.http.port)",
            ])
        return StageSetup(
            stage: stage, context: context, pipeline: pipeline, settings: settings, brokers: brokers,
            sessionTimeout: .milliseconds(session), rebalance: rebalance, groupInstanceID: groupInstanceID,
            maxInFlight: try config.requiredInt(.maxInFlight),
            explainTTLMilliseconds: explainTTL, config: config, tracing: tracing, spanExport: spanExport)
    }

    public var logger: Logger { context.logger }

    /// `body`'s value, or for a bad value (`ConfigurationError`) one line on stderr naming the key and exit
    /// status 2: the rule for every key, at every stage.
    public func valueOrExit<T>(_ body: (ConfigReader) throws(ConfigurationError) -> T) -> T {
        do { return try body(config) } catch { Self.exitAtStartup(stage, error) }
    }

    /// Redis from `HERALD_REDIS_URL` (with `HERALD_REDIS_CA_FILE` and the other TLS keys for `rediss://`), else the
    /// pipeline's `redis:` section; registers the `redis` readiness probe: a PING on a connection of its own (a
    /// scrape never waits behind the stage's batches, nor adds to them), cached like the broker probe
    /// (`CachedProbe`), so `/readyz` and `/metrics` send Redis no command per request.
    public func redis() throws -> RedisConnection {
        let configuration = try redisConfiguration()
        let connection = RedisConnection(configuration: configuration, logger: logger)
        let probeConnection = RedisConnection(configuration: configuration, logger: logger)
        let probe = CachedProbe { await probeConnection.ping() }
        context.readiness.register("redis") { await probe.isUp() }
        return connection
    }

    /// `redis()` for a stage that cannot work without Redis: a bad Redis setting ends the process (status 2).
    public func redisOrExit() -> RedisConnection {
        do { return try redis() } catch { Self.exitAtStartup(stage, error) }
    }

    /// The explain-trail writer, on a Redis connection of its own: a write of the entries gathered over
    /// `explain.write_interval_ms` never holds up the stage's own Redis round trips (a connection runs one at a time).
    /// It is not a readiness check, and a bad Redis setting only turns the trail off (with a warning; a stage whose
    /// own work needs Redis has stopped at its own connection before).
    public func bestEffortExplainSink() -> RedisExplainSink? {
        do {
            return explainSink(RedisConnection(configuration: try redisConfiguration(), logger: logger))
        } catch {
            logger.warning("explain trail off: \(error)")
            return nil
        }
    }

    func redisConfiguration() throws -> RedisConfiguration {
        var configuration: RedisConfiguration
        if let url = config.raw(.redisURL) {
            configuration = try RedisConfiguration(url: url)
        } else {
            configuration = RedisConfiguration(host: pipeline.redis.host, port: pipeline.redis.port)
            configuration.database = pipeline.redis.database
        }
        try configuration.applyTLS(
            caFile: config.raw(.redisCAFile), certificateFile: config.raw(.redisCertFile),
            keyFile: config.raw(.redisKeyFile), serverName: config.raw(.redisServerName))
        if let keyFile = configuration.tls?.keyFile, let warning = KeyFiles.exposureWarning(path: keyFile) {
            logger.warning("\(warning)")
        }
        return configuration
    }

    /// The stage's consumer group member on `topics`; registers the `kafka` readiness probe.
    public func consumer(topics: [String], groupID: String? = nil, lane: String? = nil) throws -> KafkaConsumer {
        var configuration = KafkaConsumerConfiguration(
            brokers: brokers, groupID: groupID ?? settings.groupID, topics: topics,
            clientID: "\(pipeline.kafka.clientID)-\(stage.rawValue)-\(context.environment.instance)",
            extraProperties: pipeline.kafka.properties)
        configuration.sessionTimeout = sessionTimeout
        configuration.rebalance = rebalance
        // Only Herald's own topics between the stages carry packs; chat.events, herald.registry and the rest are read
        // as they are, whatever their bytes.
        configuration.packedTopics = Set(pipeline.kafka.topics.interStage)
        if let instance = groupInstanceID {
            // Unique per consumer of the group: a lane is a group of its own, the suffix keeps the names apart anyway.
            configuration.groupInstanceID = lane.map { "\(instance)-\($0)" } ?? instance
        }
        // The priority lane's records come few at a time: its batches (and so its prefetch and librdkafka's queue)
        // stay at most `priorityBatchSize` however large the stage's bulk batches are.
        configuration.batchSize =
            lane == Lane.priority.rawValue ? min(settings.batchSize, Self.priorityBatchSize) : settings.batchSize
        configuration.batchMaxWait = .milliseconds(settings.batchTimeoutMs)
        let flow = self.flow(lane: lane)
        configuration.fetchWait = .milliseconds(flow.fetchWaitMs)
        if let idle = pipeline.kafka.idleBackoff {
            configuration.idleAfter = .milliseconds(idle.afterMs)
            // A consumer the doorbell wakes probes only in case a ring was lost.
            let rung = idle.doorbell && isRung(topics)
            configuration.idleProbeInterval = .milliseconds(rung ? idle.doorbellProbeIntervalMs : idle.probeIntervalMs)
            configuration.activity = consumerActivity
        }
        configuration.client.threadNice = threadNice(lane: lane)
        let consumer = try KafkaConsumer(configuration: configuration, logger: logger)
        let probe = BrokerProbe(client: configuration.client, logger: logger)
        context.readiness.register("kafka", timeout: .seconds(3)) { await probe.isUp() }
        // Ready once the group was joined: a record published before that waits for the join (seconds).
        context.readiness.register(lane.map { "kafka_group_\($0)" } ?? "kafka_group") { consumer.hasJoinedGroup }
        return consumer
    }

    /// Whether every one of `topics` is a topic between stages, which the stages producing to it ring.
    func isRung(_ topics: [String]) -> Bool {
        let between = Set(pipeline.kafka.topics.interStage)
        return !topics.isEmpty && topics.allSatisfy(between.contains)
    }

    /// The stage's doorbell when the idle backoff has one (`kafka.idle.doorbell_probe_interval_ms`): rung through a
    /// Redis connection of its own, heard through the same Redis. Nil when off, or when Redis is not configured
    /// properly (with a warning: the consumers then only probe).
    func doorbell() -> (bell: Doorbell, configuration: RedisConfiguration)? {
        guard let idle = pipeline.kafka.idleBackoff, idle.doorbell else { return nil }
        do {
            let configuration = try redisConfiguration()
            let connection = RedisConnection(configuration: configuration, logger: logger)
            let bell = Doorbell(
                topics: Set(pipeline.kafka.topics.interStage), minInterval: .milliseconds(idle.afterMs / 2),
                stage: stage.rawValue, connection: connection)
            return (bell, configuration)
        } catch {
            logger.warning("idle doorbell off (consumers only probe): \(error)")
            return nil
        }
    }

    /// The crash-loop breaker's Redis connection, its own (a note never waits behind the stage's Redis work), shared
    /// by the stage's lanes. Nil, with a warning, when the Redis settings are bad (the stage then runs without the
    /// breaker; a stage that needs Redis for its work has stopped at its own connection before).
    func crashNotesConnection() -> RedisConnection? {
        do {
            return RedisConnection(configuration: try redisConfiguration(), logger: logger)
        } catch {
            logger.warning("crash-loop breaker off: \(error)")
            return nil
        }
    }

    /// The largest batch of a priority-lane consumer.
    public static let priorityBatchSize = 500

    /// The stage's idempotent producer.
    public func producer(lane: String? = nil) throws -> KafkaProducer {
        var configuration = KafkaProducerConfiguration(
            brokers: brokers, clientID: "\(pipeline.kafka.clientID)-\(stage.rawValue)-\(context.environment.instance)",
            extraProperties: pipeline.kafka.properties)
        configuration.linger = .milliseconds(flow(lane: lane).lingerMs)
        configuration.client.threadNice = threadNice(lane: lane)
        if pipeline.kafka.packMaxRecords > 1 {
            configuration.packTopics = Set(pipeline.kafka.topics.interStage)
            configuration.packMaxRecords = pipeline.kafka.packMaxRecords
            configuration.packMaxBytes = pipeline.kafka.packMaxBytes
        }
        return try KafkaProducer(configuration: configuration, logger: logger)
    }

    /// The fetch and linger settings of a lane (`kafka.flow` / `kafka.priority_flow`). Ingest reads every event,
    /// calls included, in one loop: it fetches like the priority lane.
    func flow(lane: String?) -> LaneFlow {
        if lane == Lane.priority.rawValue || (lane == nil && stage == .ingest) { return pipeline.kafka.priorityFlow }
        return pipeline.kafka.bulkFlow
    }

    /// The nice value of a lane's Kafka client threads: the bulk lane's run at `kafka.bulk_nice`, like its tasks'
    /// threads (`BulkThreadNice`), so its fetching and producing yield the CPU to the priority lane's.
    func threadNice(lane: String?) -> Int {
        lane == Lane.bulk.rawValue ? pipeline.kafka.bulkNice : 0
    }

    /// The explain trail writer over `connection`.
    public func explainSink(_ connection: RedisConnection) -> RedisExplainSink {
        RedisExplainSink(
            store: ExplainStore(
                connection: connection, ttlMilliseconds: explainTTLMilliseconds,
                fullTrail: pipeline.explain.fullTrail,
                lastDecisionShards: UInt64(pipeline.explain.lastDecisionShards),
                logShards: UInt64(pipeline.explain.logShards)))
    }

    /// Builds the loop and runs it with the HTTP endpoint until SIGTERM; returns the exit status.
    /// `before` services start first and stop last (e.g. an APNs client that must outlive the loop).
    public func run(
        processor: any StageProcessor, topics: [String], explain: (any ExplainSink)? = nil,
        maxConcurrentBatches: Int = 1, maxInFlight: Int? = nil,
        before: [any Service] = []
    ) async -> Int32 {
        await run(
            lanes: [
                StageLane(
                    name: nil, topics: topics, processor: processor,
                    maxConcurrentBatches: maxConcurrentBatches, maxInFlight: maxInFlight)
            ],
            explain: explain, before: before)
    }

    /// One stage loop per lane, each with its own consumer, producer and in-flight bound, so records of one
    /// lane never wait behind another lane's in Kafka, in the loop or in the producer. The bulk lane keeps the
    /// stage's consumer group; another lane's group is `<group>-<lane>` (docs/pipeline.md, "Priority lanes").
    public func run(lanes: [StageLane], explain: (any ExplainSink)? = nil, before: [any Service] = []) async -> Int32 {
        do {
            var loops: [any Service] = []
            let doorbell = self.doorbell()
            let notes = crashNotesConnection()
            for lane in lanes {
                var group = settings.groupID
                if let name = lane.name, name != Lane.bulk.rawValue { group += "-\(name)" }
                let consumer = try consumer(topics: lane.topics, groupID: group, lane: lane.name)
                let producer = try producer(lane: lane.name)
                let metrics = lane.name.map { context.metrics.lane($0) } ?? context.metrics
                var loopConfiguration = StageLoopConfiguration(
                    dlqTopic: pipeline.kafka.topics.dlq,
                    maxInFlight: lane.maxInFlight ?? self.maxInFlight,
                    maxConcurrentBatches: lane.maxConcurrentBatches)
                loopConfiguration.doorbell = doorbell?.bell
                loopConfiguration.explainInterval = .milliseconds(pipeline.explain.writeIntervalMs)
                if tracing.enabled {
                    // Events enter Herald on `chat.events` (ingest) and `herald.registry` (the registry); every other
                    // topic carries the context of traced events only.
                    loopConfiguration.tracing = StageTracing(
                        sampler: tracing.sampler,
                        entryTopics: [pipeline.kafka.topics.chatEvents, pipeline.kafka.topics.registry],
                        export: spanExport, stage: stage.rawValue)
                }
                if let doorbell, isRung(lane.topics) {
                    loops.append(
                        DoorbellListener(
                            configuration: doorbell.configuration, topics: lane.topics, consumer: consumer,
                            stage: stage.rawValue, logger: logger))
                }
                let loop = StageLoop(
                    consumer: consumer, producer: producer, makeProducer: { try self.producer(lane: lane.name) },
                    processor: lane.processor, configuration: loopConfiguration,
                    metrics: metrics, logger: logger, explain: explain,
                    breaker: notes.map {
                        CrashBreaker(
                            store: RedisCrashNotes(connection: $0, group: group), metrics: metrics, logger: logger)
                    })
                // With two cores busy with bulk work, the priority lane's tasks run first (task priority).
                switch lane.name {
                case Lane.priority.rawValue?: loops.append(PrioritizedService(inner: loop, priority: .high))
                case Lane.bulk.rawValue?: loops.append(PrioritizedService(inner: loop, priority: .utility))
                default: loops.append(loop)
                }
            }
            if lanes.contains(where: { $0.name == Lane.bulk.rawValue }), pipeline.kafka.bulkNice > 0 {
                loops.append(BulkThreadNice(nice: Int32(pipeline.kafka.bulkNice), logger: logger))
            }
            let exporter = spanExport.map { [$0.service] } ?? []
            return await context.runtime(services: exporter + before + loops).run()
        } catch {
            logger.critical("stage could not start", metadata: [LogKey.error: "\(error)"])
            return 1
        }
    }
}

/// Runs a service in a task of its own priority (its child tasks inherit it); cancelling the caller cancels it.
/// Task locals (the service group's graceful shutdown) carry over.
///
/// The caller waits through a continuation, not on the task's value: awaiting a task from a task of higher priority
/// raises the awaited task to that priority, which put the bulk lane's work back at the default priority.
struct PrioritizedService: Service {
    let inner: any Service
    let priority: TaskPriority

    func run() async throws {
        let inner = self.inner
        let priority = self.priority
        let task = Mutex<Task<Void, Never>?>(nil)
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                task.withLock {
                    $0 = Task(priority: priority) {
                        do {
                            try await inner.run()
                            continuation.resume()
                        } catch {
                            continuation.resume(throwing: error)
                        }
                    }
                }
            }
        } onCancel: {
            task.withLock { $0?.cancel() }
        }
    }
}

/// Lowers the CPU share of the bulk lane's threads: its work runs at `.utility` task priority, on the threads of
/// the runtime's utility pool (named `...utility-qos`), which Linux schedules like every other thread. Every
/// second this gives those threads a higher nice value (`setpriority` on each thread), so that when both cores
/// are busy a call or direct message on the priority lane gets the CPU first; while the priority lane is idle the
/// bulk lane still has all of it.
struct BulkThreadNice: Service {
    let nice: Int32
    let logger: Logger

    func run() async throws {
        var lowered = Set<Int32>()
        // How often each thread's name was read: twice, a second apart (a new thread may not be named yet at the
        // first look), then never again, so an idle process lists its threads once a second and reads nothing more.
        var looks: [Int32: Int] = [:]
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let tids = Self.threadIDs()
            for tid in tids where looks[tid, default: 0] < 2 {
                looks[tid, default: 0] += 1
                guard !lowered.contains(tid), Self.name(of: tid)?.contains("utility-qos") == true else { continue }
                if setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(tid), nice) == 0 {
                    lowered.insert(tid)
                } else {
                    logger.debug("could not lower a bulk thread's priority", metadata: ["errno": "\(errno)"])
                }
            }
            // Forget threads that ended (their ids may come back).
            if looks.count > tids.count {
                let live = Set(tids)
                looks = looks.filter { live.contains($0.key) }
                lowered = lowered.intersection(live)
            }
            try? await Task.sleep(for: .seconds(1))
        }
    }

    /// This process's thread ids (`/proc/self/task`).
    static func threadIDs() -> [Int32] {
        ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []).compactMap { Int32($0) }
    }

    /// A thread's name (`/proc/self/task/TID/comm`).
    static func name(of tid: Int32) -> String? {
        try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8)
    }

    /// This process's threads whose name contains `fragment`.
    static func threads(named fragment: String) -> [Int32] {
        threadIDs().filter { name(of: $0)?.contains(fragment) == true }
    }
}

/// One lane of a stage: the topics its loop reads and the processor that writes to the lane's next topics.
public struct StageLane: Sendable {
    /// `priority` or `bulk` (labels the `herald_lane_*` metrics); nil for a stage without lanes.
    public var name: String?
    public var topics: [String]
    public var processor: any StageProcessor
    public var maxConcurrentBatches: Int
    public var maxInFlight: Int?

    public init(
        name: String?, topics: [String], processor: any StageProcessor, maxConcurrentBatches: Int = 1,
        maxInFlight: Int? = nil
    ) {
        self.name = name
        self.topics = topics
        self.processor = processor
        self.maxConcurrentBatches = maxConcurrentBatches
        self.maxInFlight = maxInFlight
    }

    public init(
        _ lane: Lane, topics: [String], processor: any StageProcessor, maxConcurrentBatches: Int = 1,
        maxInFlight: Int? = nil
    ) {
        self.init(
            name: lane.rawValue, topics: topics, processor: processor,
            maxConcurrentBatches: maxConcurrentBatches, maxInFlight: maxInFlight)
    }
}

/// `/readyz`'s broker check: a metadata request for the brokers, cached for 5 s (`CachedProbe`), over one client
/// kept for the stage's life (`KafkaClusterCheck`). It connects as the stage's own clients do (`client`: their
/// brokers, client id and librdkafka properties, so TLS and SASL settings too): a check that connected otherwise
/// would fail against a secured cluster the stage itself reaches.
final class BrokerProbe: Sendable {
    private let cached: CachedProbe
    let check: KafkaClusterCheck

    init(client: KafkaClientConfiguration, logger: Logger = Logger(label: "herald.kafka.check")) {
        var configuration = KafkaAdminConfiguration(client: client)
        configuration.requestTimeout = .seconds(2)
        let check = KafkaClusterCheck(configuration: configuration, logger: logger)
        self.check = check
        cached = CachedProbe { await check.answers() }
    }

    func isUp() async -> Bool { await cached.isUp() }
}

extension PipelineConfig {
    /// The pipeline file's values with the environment's overrides: `HERALD_KAFKA_BROKERS`, `HERALD_KAFKA_PROFILE`,
    /// `HERALD_REDIS_HOST`,
    /// `HERALD_REDIS_PORT` (`HERALD_REDIS_URL` wins over the last two when Redis is opened).
    public func applying(_ config: ConfigReader) throws(ConfigurationError) -> PipelineConfig {
        var applied = self
        if let brokers = config.raw(.kafkaBrokers) { applied.kafka.brokers = brokers }
        if let name = try config.text(.kafkaProfile), let profile = KafkaProfile(rawValue: name) {
            applied.kafka.profile = profile
        }
        if let host = try config.text(.redisHost) { applied.redis.host = host }
        if let port = try config.int(.redisPort) { applied.redis.port = port }
        return applied
    }
}
