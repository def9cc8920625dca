import Foundation
import HeraldKafka
import HeraldRedis
import HeraldStage
import HeraldTestSupport
import Logging
import Synchronization
import Testing

// The idle doorbell: a stage's loop rings once its outputs are acknowledged, and the next stage's idle consumer,
// listening through Redis, fetches at once instead of at its next probe.

@Suite("Idle doorbell", .serialized)
struct DoorbellTests {
    @Test("rings only topics between stages, at most once per topic per interval")
    func ringsAreFilteredAndSpaced() async throws {
        let published = Mutex<[String]>([])
        let bell = Doorbell(topics: ["a", "b"], minInterval: .seconds(3600), stage: "test") { channel in
            published.withLock { $0.append(channel) }
            return true
        }
        bell.ring(["a", "dlq", "b", "a"])
        try await waitUntil("two rings published", timeout: .seconds(60)) { published.withLock { $0.count } == 2 }
        #expect(Set(published.withLock { $0 }) == [Doorbell.channel("a"), Doorbell.channel("b")])
        bell.ring(["a", "b"])  // within the interval: nothing more

        let eager = Doorbell(topics: ["a"], minInterval: .zero, stage: "test") { channel in
            published.withLock { $0.append("eager " + channel) }
            return true
        }
        eager.ring(["a"])
        try await waitUntil("the eager bell rang", timeout: .seconds(60)) {
            published.withLock { $0.contains("eager " + Doorbell.channel("a")) }
        }
        #expect(published.withLock { $0.count } == 3, "\(published.withLock { $0 })")
        #expect(Doorbell.channel("herald.resolved") == "herald:doorbell:herald.resolved")
    }

    @Test(
        "a stage loop's acknowledged output wakes the next stage's idle consumer, whose next probe is 10 minutes away")
    func loopOutputWakesTheNextConsumer() async throws {
        let broker = try await TansuBroker.start()
        try await broker.createTopics([("in", 1), ("out", 1), ("dlq", 1)])
        let redisServer = try await RedisServer.start()
        let redisConfiguration = RedisConfiguration(host: "127.0.0.1", port: redisServer.port)
        let redis = RedisConnection(configuration: redisConfiguration)
        defer { redis.close() }

        // The next stage: idle after 300 ms, then probing only every 10 minutes.
        var downstreamConfiguration = KafkaConsumerConfiguration(
            brokers: broker.brokers, groupID: "next-1", topics: ["out"])
        downstreamConfiguration.sessionTimeout = .seconds(3)
        downstreamConfiguration.idleAfter = .milliseconds(300)
        downstreamConfiguration.idleProbeInterval = .seconds(600)
        let downstream = try KafkaConsumer(configuration: downstreamConfiguration)
        let listener = DoorbellListener(
            configuration: redisConfiguration, topics: ["out"], consumer: downstream, stage: "next",
            logger: Logger(label: "test"))
        let listening = Task { try await listener.run() }
        defer { listening.cancel() }
        try await waitUntil("the next stage joined, went idle and listens", timeout: .seconds(120)) {
            downstream.hasJoinedGroup && downstream.isIdle && listener.isSubscribed
        }

        // The stage: echoes `in` to `out` and rings.
        var consumerConfiguration = KafkaConsumerConfiguration(
            brokers: broker.brokers, groupID: "echo-1", topics: ["in"])
        consumerConfiguration.sessionTimeout = .seconds(3)
        let consumer = try KafkaConsumer(configuration: consumerConfiguration)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(brokers: broker.brokers))
        var configuration = StageLoopConfiguration(dlqTopic: "dlq")
        configuration.doorbell = Doorbell(
            topics: ["out"], minInterval: .milliseconds(500), stage: "echo", connection: redis)
        let loop = StageLoop(
            consumer: consumer, producer: producer, processor: EchoProcessor(), configuration: configuration,
            metrics: StageMetrics(stage: "echo"), logger: Logger(label: "test"))
        let running = Task { try await loop.run() }
        try await produce(["ok-1"], topic: "in", brokers: broker.brokers)

        // Only the ring can bring the record now: the consumer's one probe was made when it went idle, before the
        // record existed, and the next is 10 minutes away (without the ring this waits that long, then fails).
        var got: [ConsumerRecord] = []
        let deadline = ContinuousClock.now + .seconds(120)
        while got.isEmpty, ContinuousClock.now < deadline {
            guard let batch = try await downstream.nextBatch() else { break }
            got += batch
        }
        #expect(got.map { String(decoding: $0.value ?? [], as: UTF8.self) } == ["OK-1"])
        loop.stop()
        try await running.value
        await downstream.shutdown()
    }
}
