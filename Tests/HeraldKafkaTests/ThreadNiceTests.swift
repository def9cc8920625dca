import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

/// A stage's bulk lane runs its Kafka clients with `threadNice` (`kafka.bulk_nice`): every thread librdkafka starts
/// for the client, and the adapter's poll thread, get that nice value. No other client in the test process uses
/// the values below, so a thread with one of them belongs to the client under test.
@Suite("Kafka client threads take the configured nice value")
struct ThreadNiceTests {
    /// (name, nice) of this process's threads.
    static func threads() -> [(name: String, nice: Int)] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap { tid in
            guard let name = try? String(contentsOfFile: "/proc/self/task/\(tid)/comm", encoding: .utf8),
                let stat = try? String(contentsOfFile: "/proc/self/task/\(tid)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return nil }
            // Fields after the name: state is field 3; nice is field 19.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 16, let nice = Int(fields[16]) else { return nil }
            return (name.trimmingCharacters(in: .whitespacesAndNewlines), nice)
        }
    }

    @Test("a consumer's and a producer's threads (librdkafka's and the poll thread) run at threadNice")
    func clientThreadsAreNiced() async throws {
        var consumerConfiguration = KafkaConsumerConfiguration(
            brokers: ["127.0.0.1:1"], groupID: "nice-test", topics: ["t"])
        consumerConfiguration.client.threadNice = 13
        let consumer = try KafkaConsumer(configuration: consumerConfiguration)
        var producerConfiguration = KafkaProducerConfiguration(brokers: ["127.0.0.1:1"])
        producerConfiguration.client.threadNice = 14
        let producer = try KafkaProducer(configuration: producerConfiguration)

        let found = await eventually(timeout: .seconds(60)) {
            let t = Self.threads()
            // librdkafka's threads by name; the adapter's poll thread is the one that is not librdkafka's (on
            // Linux it keeps the name of the thread that started it).
            func complete(_ names: [String]) -> Bool {
                names.contains("rdk:main") && names.contains { $0.hasPrefix("rdk:broker") }
                    && names.contains { !$0.hasPrefix("rdk:") }
            }
            return complete(t.filter { $0.nice == 13 }.map(\.name)) && complete(t.filter { $0.nice == 14 }.map(\.name))
        }
        #expect(found, "threads: \(Self.threads().filter { $0.nice >= 13 })")
        await consumer.shutdown()
        // Nothing was produced: the flush has nothing to wait for, whatever the (absent) broker does.
        try? await producer.shutdown(timeout: .seconds(1))
    }
}
