import CoreMetrics
import Foundation
import HeraldKafka
import HeraldRedis
import Logging
import ServiceLifecycle
import Synchronization

/// Wakes the idle consumers of the next stage when a stage has produced to their topic (`kafka.idle`'s
/// `doorbell_probe_interval_ms`, docs/kafka.md "Idle backoff").
///
/// A consumer with the idle backoff stops fetching after a quiet spell and only probes the broker's end offsets now
/// and then; on its own, the first record after a quiet spell would wait for the next probe at every stage. With the
/// doorbell, a stage's loop rings once the broker has acknowledged its outputs (`ring`), which publishes the topic
/// on a Redis channel; every stage listening on that topic (`DoorbellListener`) wakes its consumer, which fetches
/// at once. The record is already in the log when the ring is heard.
///
/// Rings are cheap and few: at most one per topic per `minInterval`, which is shorter than the consumers' idle
/// delay, so a consumer woken by one ring is still fetching when the records behind it arrive unrung. A lost ring
/// (Redis down, a subscriber reconnecting) only costs a probe interval: the probes go on.
public final class Doorbell: Sendable {
    /// The Redis channel of `topic`.
    public static func channel(_ topic: String) -> String { RedisKeys.doorbellChannel(topic: topic) }

    private let topics: Set<String>
    private let minInterval: Duration
    private let publish: @Sendable (String) async -> Bool
    private let lastRung = Mutex<[String: ContinuousClock.Instant]>([:])
    private let rings: Counter
    private let failures: Counter

    /// - Parameters:
    ///   - topics: the topics that are rung (the ones between stages); others (the dead-letter topic) are not.
    ///   - minInterval: the shortest time between two rings of one topic.
    ///   - publish: sends one ring (the topic's channel); false when it could not.
    public init(
        topics: Set<String>, minInterval: Duration, stage: String,
        publish: @escaping @Sendable (_ channel: String) async -> Bool
    ) {
        self.topics = topics
        self.minInterval = minInterval
        self.publish = publish
        self.rings = Counter(label: StageMetrics.Name.doorbellRings, dimensions: [("stage", stage)])
        self.failures = Counter(label: StageMetrics.Name.doorbellRingFailures, dimensions: [("stage", stage)])
    }

    /// A doorbell that publishes with `PUBLISH channel ""` on `connection`.
    public convenience init(topics: Set<String>, minInterval: Duration, stage: String, connection: RedisConnection) {
        self.init(topics: topics, minInterval: minInterval, stage: stage) { channel in
            (try? await connection.send("PUBLISH", channel, ""))?.int != nil
        }
    }

    /// Outputs to `produced` were acknowledged by the broker: ring for those topics whose last ring is older than
    /// `minInterval`. Returns at once; the rings go out on their own task.
    public func ring<S: Sequence>(_ produced: S) where S.Element == String {
        let now = ContinuousClock.now
        let due = lastRung.withLock { last -> [String] in
            var due: [String] = []
            for topic in produced where topics.contains(topic) {
                if let previous = last[topic], now - previous < minInterval { continue }
                last[topic] = now
                due.append(topic)
            }
            return due
        }
        guard !due.isEmpty else { return }
        Task { [publish, rings, failures] in
            for topic in due {
                if await publish(Self.channel(topic)) {
                    rings.increment()
                } else {
                    failures.increment()
                }
            }
        }
    }
}

/// Listens for the doorbell of a lane's topics and wakes its consumer (a subscriber connection and thread of its
/// own, see `RedisSubscriber`). Runs as one of the stage's services: subscribed from start-up to shutdown.
public struct DoorbellListener: Service {
    let subscriber: RedisSubscriber

    public init(
        configuration: RedisConfiguration, topics: [String], consumer: KafkaConsumer, stage: String, logger: Logger
    ) {
        let wakes = Counter(label: StageMetrics.Name.doorbellWakes, dimensions: [("stage", stage)])
        self.subscriber = RedisSubscriber(
            configuration: configuration, channels: topics.map(Doorbell.channel), logger: logger
        ) { _ in
            wakes.increment()
            consumer.wake()
        }
    }

    public var isSubscribed: Bool { subscriber.isSubscribed }

    public func run() async throws {
        subscriber.start()
        defer { subscriber.stop() }
        try? await gracefulShutdown()
    }
}
