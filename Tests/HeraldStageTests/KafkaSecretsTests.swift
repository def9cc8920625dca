import Foundation
import HeraldConfig
import HeraldKafka
import Testing

/// librdkafka's mock cluster answers no SASL handshake, and Tansu's SCRAM users cannot be created once it requires
/// authentication (memory storage), so no broker here can check a password: these tests read back, through
/// `rd_kafka_conf_get`, what the built librdkafka configuration holds.
@Suite("Kafka secrets from files and the environment reach librdkafka")
struct KafkaSecretsTests {
    @Test(
        "a SASL password from a file and a key password from the environment are in the consumer's and producer's librdkafka configuration"
    )
    func secretsReachLibrdkafka() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-kafka-sasl-\(getpid())")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("password").path
        try "from-a-mounted-secret\n".write(toFile: file, atomically: true, encoding: .utf8)
        let pipeline = try PipelineLoader.load(
            yaml: """
                kafka:
                  properties: {security.protocol: SASL_SSL, sasl.mechanisms: SCRAM-SHA-512, sasl.username: herald}
                  properties_file: {sasl.password: \(file)}
                  properties_env: {ssl.key.password: HERALD_TEST_KEY_PASSWORD}
                """
        ).config
        let properties = try pipeline.kafka.resolvedProperties(environment: ["HERALD_TEST_KEY_PASSWORD": "pem-pass"])
        let consumer = KafkaConsumerConfiguration(
            brokers: ["127.0.0.1:1"], groupID: "g", topics: ["t"], extraProperties: properties)
        #expect(try consumer.librdkafkaValue(of: "sasl.password") == "from-a-mounted-secret")
        #expect(try consumer.librdkafkaValue(of: "ssl.key.password") == "pem-pass")
        #expect(try consumer.librdkafkaValue(of: "sasl.username") == "herald")
        #expect(try consumer.librdkafkaValue(of: "security.protocol") == "sasl_ssl")
        let producer = KafkaProducerConfiguration(brokers: ["127.0.0.1:1"], extraProperties: properties)
        #expect(try producer.librdkafkaValue(of: "sasl.password") == "from-a-mounted-secret")
        #expect(try producer.librdkafkaValue(of: "sasl.mechanisms") == "SCRAM-SHA-512")
    }

    @Test("the profile's fetch settings are what librdkafka gets")
    func profileReachesLibrdkafka() throws {
        var c = KafkaConsumerConfiguration(brokers: ["127.0.0.1:1"], groupID: "g", topics: ["t"])
        c.fetchWait = .milliseconds(PipelineConfig().kafka.bulkFlow.fetchWaitMs)
        #expect(try c.librdkafkaValue(of: "fetch.wait.max.ms") == "500")
        #expect(try c.librdkafkaValue(of: "fetch.min.bytes") == "1")
        #expect(try c.librdkafkaValue(of: "no.such.property") == nil)
    }
}
