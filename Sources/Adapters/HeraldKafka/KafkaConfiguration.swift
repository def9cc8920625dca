import CRdKafka
import Foundation
import HeraldCore

/// Where to start when a consumer group has no committed offset for a partition.
public enum AutoOffsetReset: String, Sendable, Hashable {
    /// Start at the oldest retained record (the default: nothing published before the
    /// group first started is skipped).
    case earliest
    /// Start after the newest record.
    case latest
    /// Fail the partition with an error.
    case error
}

/// How a consumer group hands partitions over when a member joins or leaves.
public enum RebalanceProtocol: String, Sendable, Hashable, CaseIterable {
    /// Incremental cooperative rebalancing (KIP-429, librdkafka's `cooperative-sticky` assignor): a join or a leave
    /// moves only the partitions that change owner; every other partition keeps being fetched and processed
    /// through the rebalance. The default.
    case cooperative
    /// Eager rebalancing (`range,roundrobin`): every rebalance revokes the whole assignment of every member and
    /// assigns a new one, so the whole group stops for a join round. Kept for the first step of moving a running
    /// group from eager to cooperative (docs/kafka.md, "Rebalancing").
    case eager

    /// librdkafka's `partition.assignment.strategy` for this protocol.
    var assignmentStrategy: String {
        switch self {
        case .cooperative: "cooperative-sticky"
        case .eager: "range,roundrobin"
        }
    }
}

/// Settings shared by producers and consumers.
public struct KafkaClientConfiguration: Sendable, Hashable {
    /// Bootstrap brokers as `host:port`. Default: `["127.0.0.1:9092"]`.
    public var brokers: [String] = ["127.0.0.1:9092"]
    /// `client.id`, visible in broker logs. Default: `"herald"`.
    public var clientID: String = "herald"
    /// Raw librdkafka properties applied last (they win over everything typed here).
    /// For settings this struct does not model, e.g. `["security.protocol": "ssl"]`.
    public var extraProperties: [String: String] = [:]
    /// The nice value of every thread the client runs (librdkafka's own threads, set as each starts, and the
    /// adapter's poll thread); 0 leaves them as they are. A stage's bulk lane uses `kafka.bulk_nice`, so its
    /// fetching and producing yield the CPU to the priority lane's when both cores are busy. Default: 0.
    public var threadNice: Int = 0

    public init(
        brokers: [String] = ["127.0.0.1:9092"], clientID: String = "herald", extraProperties: [String: String] = [:]
    ) {
        self.brokers = brokers
        self.clientID = clientID
        self.extraProperties = extraProperties
    }
}

/// Producer settings. The producer is always idempotent (`enable.idempotence=true`,
/// which implies `acks=all` and bounded in-flight requests), so a retried send never
/// duplicates or reorders records within a partition.
public struct KafkaProducerConfiguration: Sendable, Hashable {
    public var client: KafkaClientConfiguration
    /// How long records wait to be batched together (`linger.ms`). Default: 2 ms.
    public var linger: Duration = .milliseconds(2)
    /// How long librdkafka keeps retrying a record before reporting it failed
    /// (`message.timeout.ms`). Default: 30 s.
    public var deliveryTimeout: Duration = .seconds(30)
    /// Maximum records waiting in the local queue (`queue.buffering.max.messages`).
    /// `send` waits (without blocking a thread) when the queue is full. Default: 100 000.
    public var maxQueuedRecords: Int = 100_000
    /// `compression.codec`: `none`, `gzip`, `snappy`, `lz4`, `zstd`. Default: `lz4`.
    public var compression: String = "lz4"
    /// How often the producer's own thread serves delivery reports when idle. Default: 100 ms.
    public var pollInterval: Duration = .milliseconds(100)
    /// Topics whose records are packed (`RecordPack`): the keyed records of one `enqueue` call that go to the same
    /// partition of such a topic travel as one Kafka record. Only for topics every reader unpacks (Herald's
    /// consumers do). Default: none.
    public var packTopics: Set<String> = []
    /// Most records in one pack. Default: 256.
    public var packMaxRecords: Int = 256
    /// Most bytes in one pack; a record larger than half of it is sent on its own. Default: 64 KiB.
    public var packMaxBytes: Int = 65_536
    /// Header keys a record may carry and still be packed: its headers then travel in the pack's
    /// `herald-part-headers` header (`PackHeaders`). A record with any other header is sent on its own. Default: the
    /// W3C trace context, `traceparent` and `tracestate`.
    public var packableHeaders: Set<String> = ["traceparent", "tracestate"]

    public init(client: KafkaClientConfiguration = .init()) { self.client = client }

    public init(brokers: [String], clientID: String = "herald", extraProperties: [String: String] = [:]) {
        self.client = KafkaClientConfiguration(brokers: brokers, clientID: clientID, extraProperties: extraProperties)
    }
}

/// Consumer settings. Offsets are managed by the adapter: librdkafka never stores an
/// offset on its own (`enable.auto.offset.store=false`); the adapter stores the
/// low-water mark of records the caller marked complete, and librdkafka commits the
/// stored offsets every `autoCommitInterval` plus once more on rebalance and shutdown.
public struct KafkaConsumerConfiguration: Sendable, Hashable {
    public var client: KafkaClientConfiguration
    /// Consumer group id (`group.id`). Each stage is its own group. Required.
    public var groupID: String
    /// Topics to subscribe to.
    public var topics: [String]
    /// `session.timeout.ms`: how long the group waits for a silent member before
    /// rebalancing. Default: 10 s (tests use 2-6 s; a join takes about half of it).
    public var sessionTimeout: Duration = .seconds(10)
    /// `heartbeat.interval.ms`. Default: nil, meaning a third of `sessionTimeout`.
    public var heartbeatInterval: Duration? = nil
    /// `max.poll.interval.ms`. The adapter polls on its own thread continuously, so
    /// this only trips if that thread is stuck. Default: 300 s.
    public var maxPollInterval: Duration = .seconds(300)
    /// Largest batch handed to the caller (N). Default: 500.
    public var batchSize: Int = 500
    /// Longest a batch request waits when nothing is there (T). A request returns at once
    /// with what is buffered (up to `batchSize`); with nothing buffered it returns as soon
    /// as a record arrives, or empty after `batchMaxWait`. Default: 50 ms.
    public var batchMaxWait: Duration = .milliseconds(50)
    /// Records fetched ahead of the caller, as a multiple of `batchSize`; past this the
    /// adapter pauses fetching until the caller catches up. Default: 2.
    public var prefetchBatches: Int = 2
    /// Records the adapter fetches ahead of the caller: `batchSize × prefetchBatches`.
    public var prefetchCapacity: Int { batchSize * max(1, prefetchBatches) }
    /// `auto.offset.reset`. Default: `.earliest`.
    public var autoOffsetReset: AutoOffsetReset = .earliest
    /// `auto.commit.interval.ms`: how often stored offsets are committed. Default: 1 s.
    public var autoCommitInterval: Duration = .seconds(1)
    /// How often per-partition lag gauges are refreshed. Default: 5 s.
    public var lagInterval: Duration = .seconds(5)
    /// `fetch.wait.max.ms`: how long the broker may hold a fetch that finds nothing. Tansu answers such a fetch
    /// only when (about half) the wait is over, not when a record arrives, so this bounds each hop's delay while
    /// records trickle in, and sets how many empty fetches an idle consumer makes. Default: 500 ms (librdkafka's).
    public var fetchWait: Duration = .milliseconds(500)
    /// Fetching less while nothing arrives: after `idleAfter` without a record the consumer pauses its
    /// partitions and, every `idleProbeInterval`, asks the broker for their end offsets (one ListOffsets request
    /// per broker); when one is beyond the consumer's position it resumes at once and fetches continuously again.
    /// The same answers keep the lag gauges current while idle. For brokers that answer an empty fetch only when
    /// its wait is over (Tansu): there a short `fetchWait` would otherwise keep every idle consumer fetching many
    /// times a second. A record arriving while idle waits for the next probe. Default: nil (off: Apache Kafka
    /// holds a fetch until a record arrives, so an idle consumer there costs little).
    public var idleAfter: Duration? = nil
    /// How often an idle consumer asks for end offsets (see `idleAfter`). Default: 1 s.
    public var idleProbeInterval: Duration = .seconds(1)
    /// Consumers of one process that share an activity are busy while any of them receives records: a lane whose
    /// own records are few (the priority lane under a load of group messages) neither goes idle nor stays idle
    /// while its siblings work, so its next record does not wait for a wake. Default: nil (on its own).
    public var activity: ConsumerActivity? = nil
    /// Label prefix for swift-metrics objects. Default: `"herald_kafka"`.
    public var metricsPrefix: String = "herald_kafka"
    /// The topics whose records may be packs (`RecordPack`, written by Herald's own producers between the stages):
    /// only their records are unpacked. A record of any other topic is handed out as it is, whatever its bytes, so
    /// an external record that happens to start with the pack's magic is never split into parts. nil: every
    /// topic's (tools reading Herald's own topics). The stages set the topics between the stages. Default: nil.
    public var packedTopics: Set<String>? = nil
    /// How the group moves partitions between members (`partition.assignment.strategy`). Every member of a group
    /// must use the same protocol, except during the two-step move from eager to cooperative. Default:
    /// `.cooperative`.
    public var rebalance: RebalanceProtocol = .cooperative
    /// `group.instance.id` (static membership, KIP-345): a member that leaves and comes back with the same id
    /// within `sessionTimeout` gets its partitions back without a rebalance, and a member closing does not leave
    /// the group (its partitions wait for it, or for the session timeout). Unique within the group. Default: nil
    /// (dynamic membership: a closing member leaves at once).
    public var groupInstanceID: String? = nil
    /// How long a revoke waits for the records already handed out from the revoked partitions to complete, so that
    /// their offsets are committed before the partitions go to another member (which otherwise processes them
    /// again). Records still buffered, not handed out, are given back at once. Default: 2 s.
    public var revokeDrainTimeout: Duration = .seconds(2)

    /// The idle policy `FetchFlowControl` applies; nil when `idleAfter` is nil.
    public var idlePolicy: FetchFlowControl.IdlePolicy? {
        guard let after = idleAfter else { return nil }
        return FetchFlowControl.IdlePolicy(after: after, probeInterval: idleProbeInterval)
    }

    public init(client: KafkaClientConfiguration = .init(), groupID: String, topics: [String]) {
        self.client = client
        self.groupID = groupID
        self.topics = topics
    }

    public init(
        brokers: [String], groupID: String, topics: [String], clientID: String = "herald",
        extraProperties: [String: String] = [:]
    ) {
        self.client = KafkaClientConfiguration(brokers: brokers, clientID: clientID, extraProperties: extraProperties)
        self.groupID = groupID
        self.topics = topics
    }
}

/// Settings for the topic administration helper.
public struct KafkaAdminConfiguration: Sendable, Hashable {
    public var client: KafkaClientConfiguration
    /// How long a CreateTopics request may take. Default: 10 s.
    public var requestTimeout: Duration = .seconds(10)
    public init(client: KafkaClientConfiguration = .init()) { self.client = client }
    public init(brokers: [String]) { self.client = KafkaClientConfiguration(brokers: brokers) }
}

// MARK: - The one place typed configuration becomes librdkafka's string properties

enum LibrdkafkaProperties {
    static func client(_ c: KafkaClientConfiguration) -> [String: String] {
        [
            "bootstrap.servers": c.brokers.joined(separator: ","),
            "client.id": c.clientID,
            // Loopback brokers and tests: fail fast instead of logging connection noise forever.
            "reconnect.backoff.max.ms": "2000",
        ]
    }

    static func producer(_ p: KafkaProducerConfiguration) -> [String: String] {
        var d = client(p.client)
        d["enable.idempotence"] = "true"
        d["acks"] = "all"
        d["linger.ms"] = String(p.linger.milliseconds)
        d["message.timeout.ms"] = String(max(1, p.deliveryTimeout.milliseconds))
        d["queue.buffering.max.messages"] = String(max(1, p.maxQueuedRecords))
        d["compression.codec"] = p.compression
        // Delivery reports carry only what the adapter reads (offset, partition, error).
        d["delivery.report.only.error"] = "false"
        // Packs go to the partition this partitioner gives their parts' keys (`RecordPack.partition`).
        d["partitioner"] = "consistent_random"
        return d.merging(p.client.extraProperties) { _, extra in extra }
    }

    static func consumer(_ c: KafkaConsumerConfiguration) -> [String: String] {
        var d = client(c.client)
        d["group.id"] = c.groupID
        d["session.timeout.ms"] = String(c.sessionTimeout.milliseconds)
        d["heartbeat.interval.ms"] = String(max(1, (c.heartbeatInterval ?? c.sessionTimeout / 3).milliseconds))
        d["max.poll.interval.ms"] = String(c.maxPollInterval.milliseconds)
        d["auto.offset.reset"] = c.autoOffsetReset.rawValue
        d["enable.auto.commit"] = "true"
        d["auto.commit.interval.ms"] = String(c.autoCommitInterval.milliseconds)
        d["enable.auto.offset.store"] = "false"
        // Cooperative by default: a rebalance moves only the partitions that change owner (`RebalanceProtocol`).
        d["partition.assignment.strategy"] = c.rebalance.assignmentStrategy
        if let instance = c.groupInstanceID, !instance.isEmpty { d["group.instance.id"] = instance }
        d["enable.partition.eof"] = "false"
        d["fetch.wait.max.ms"] = String(max(0, c.fetchWait.milliseconds))
        // Answer a fetch as soon as one record is there (librdkafka's default, stated: the profiles rely on it).
        d["fetch.min.bytes"] = "1"
        // librdkafka's own fetch queue, ahead of the adapter's buffer, kept shallow: about two batches per partition,
        // at most 4 MB, fetched 256 KB per partition at a time, and refilled as soon as it has room. A deep queue
        // (librdkafka's defaults: 100,000 records per partition, 64 MB) puts a record of one partition behind
        // everything already queued from the others: at ingest a call waited behind a whole backlog of group
        // messages on another partition. With the default `fetch.queue.backoff.ms` (1 s) a consumer whose queue
        // had been full fetched again only a second later, and a busy stage drained in one burst per second.
        d["queued.min.messages"] = String(max(100, c.prefetchCapacity))
        d["queued.max.messages.kbytes"] = "4096"
        d["fetch.message.max.bytes"] = "262144"
        d["fetch.queue.backoff.ms"] = String(max(1, min(c.fetchWait.milliseconds, 20)))
        return d.merging(c.client.extraProperties) { _, extra in extra }
    }

    static func admin(_ a: KafkaAdminConfiguration) -> [String: String] {
        client(a.client).merging(a.client.extraProperties) { _, extra in extra }
    }

    /// Builds an `rd_kafka_conf_t` (caller owns it until `rd_kafka_new` takes it).
    static func makeConf(_ properties: [String: String]) throws(KafkaError) -> OpaquePointer {
        guard let conf = rd_kafka_conf_new() else {
            throw KafkaError(code: .configuration, reason: "rd_kafka_conf_new returned NULL")
        }
        var errbuf = [CChar](repeating: 0, count: 512)
        for (key, value) in properties.sorted(by: { $0.key < $1.key }) {
            let result = rd_kafka_conf_set(conf, key, value, &errbuf, errbuf.count)
            if result != RD_KAFKA_CONF_OK {
                rd_kafka_conf_destroy(conf)
                let message = cStringBuffer(errbuf)
                throw KafkaError(code: .configuration, reason: message, context: ["property": key])
            }
        }
        return conf
    }
}

/// Decodes a NUL-terminated C character buffer without trusting it to be terminated.
func cStringBuffer(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

extension KafkaProducerConfiguration {
    /// The librdkafka properties this configuration becomes (for logs and `heraldctl`).
    public var librdkafkaProperties: [String: String] { LibrdkafkaProperties.producer(self) }
}

extension KafkaConsumerConfiguration {
    /// The librdkafka properties this configuration becomes (for logs and `heraldctl`).
    public var librdkafkaProperties: [String: String] { LibrdkafkaProperties.consumer(self) }
}

extension LibrdkafkaProperties {
    /// What librdkafka holds for `name` once `properties` are set on a fresh `rd_kafka_conf_t` (nil when the
    /// property is unknown). Nothing is logged: the value may be a secret.
    static func value(of name: String, in properties: [String: String]) throws(KafkaError) -> String? {
        let conf = try makeConf(properties)
        defer { rd_kafka_conf_destroy(conf) }
        var size = 0
        guard rd_kafka_conf_get(conf, name, nil, &size) == RD_KAFKA_CONF_OK else { return nil }
        var buffer = [CChar](repeating: 0, count: max(1, size))
        guard rd_kafka_conf_get(conf, name, &buffer, &size) == RD_KAFKA_CONF_OK else { return nil }
        return cStringBuffer(buffer)
    }
}

extension KafkaProducerConfiguration {
    /// The value librdkafka holds for the property `name` when this configuration is built (for checks and tests).
    public func librdkafkaValue(of name: String) throws(KafkaError) -> String? {
        try LibrdkafkaProperties.value(of: name, in: librdkafkaProperties)
    }
}

extension KafkaConsumerConfiguration {
    /// The value librdkafka holds for the property `name` when this configuration is built (for checks and tests).
    public func librdkafkaValue(of name: String) throws(KafkaError) -> String? {
        try LibrdkafkaProperties.value(of: name, in: librdkafkaProperties)
    }
}
