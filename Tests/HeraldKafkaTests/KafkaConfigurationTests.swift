import HeraldKafka
import Testing

@Suite("Typed configuration becomes librdkafka properties")
struct KafkaConfigurationTests {
    @Test("the consumer never stores offsets on its own and documents its defaults")
    func consumerProperties() {
        var c = KafkaConsumerConfiguration(
            brokers: ["a:1", "b:2"], groupID: "herald-send", topics: ["herald.outbound"])
        c.sessionTimeout = .milliseconds(4500)
        let p = c.librdkafkaProperties
        #expect(p["bootstrap.servers"] == "a:1,b:2")
        #expect(p["group.id"] == "herald-send")
        #expect(p["enable.auto.offset.store"] == "false")
        #expect(p["enable.auto.commit"] == "true")
        #expect(p["auto.commit.interval.ms"] == "1000")
        #expect(p["session.timeout.ms"] == "4500")
        #expect(p["heartbeat.interval.ms"] == "1500")
        #expect(p["auto.offset.reset"] == "earliest")
        #expect(p["partition.assignment.strategy"] == "cooperative-sticky")
        #expect(p["group.instance.id"] == nil, "dynamic membership unless an instance id is given")
        #expect(c.batchSize == 500 && c.batchMaxWait == .milliseconds(50))
    }

    @Test("eager rebalancing and static membership are settings")
    func rebalanceAndStaticMembership() throws {
        var c = KafkaConsumerConfiguration(brokers: ["a:1"], groupID: "herald-send", topics: ["herald.outbound"])
        c.rebalance = .eager
        c.groupInstanceID = "herald-send-0-bulk"
        #expect(c.librdkafkaProperties["partition.assignment.strategy"] == "range,roundrobin")
        #expect(try c.librdkafkaValue(of: "group.instance.id") == "herald-send-0-bulk")
        c.groupInstanceID = ""
        #expect(c.librdkafkaProperties["group.instance.id"] == nil, "an empty id is no id")
    }

    @Test("the producer is idempotent and extra properties win")
    func producerProperties() {
        let c = KafkaProducerConfiguration(
            brokers: ["x:9"], clientID: "herald-render",
            extraProperties: ["linger.ms": "20", "socket.keepalive.enable": "true"])
        let p = c.librdkafkaProperties
        #expect(p["enable.idempotence"] == "true")
        #expect(p["acks"] == "all")
        #expect(p["client.id"] == "herald-render")
        #expect(p["linger.ms"] == "20")
        #expect(p["socket.keepalive.enable"] == "true")
    }

    @Test("an unknown or invalid property is a KafkaError naming it, not a crash")
    func invalidProperty() {
        #expect {
            _ = try KafkaProducer(
                configuration: KafkaProducerConfiguration(brokers: ["x:9"], extraProperties: ["no.such.property": "1"]))
        } throws: { error in
            (error as? KafkaError)?.code == .configuration
                && (error as? KafkaError)?.context["property"] == "no.such.property"
        }
        var c = KafkaConsumerConfiguration(brokers: ["x:9"], groupID: "g", topics: ["t"])
        c.client.extraProperties = ["session.timeout.ms": "not-a-number"]
        #expect {
            _ = try KafkaConsumer(configuration: c)
        } throws: { error in
            (error as? KafkaError)?.code == .configuration
        }
        #expect(throws: KafkaError.self) {
            _ = try KafkaConsumer(configuration: KafkaConsumerConfiguration(brokers: ["x:9"], groupID: "g", topics: []))
        }
    }

    @Test("errors carry a stable code, librdkafka's name and context in their description")
    func errorDescription() {
        let e = KafkaError(code: .commit, reason: "commit failed", librdkafkaCode: 30, context: ["group": "g"])
        #expect(e.librdkafkaName == "GROUP_AUTHORIZATION_FAILED")
        #expect(e.description == "kafka.commit: commit failed [GROUP_AUTHORIZATION_FAILED (30)] {group=g}")
        #expect(!e.isRetriable)
        #expect(KafkaError(code: .produce, reason: "full", librdkafkaCode: -184).isRetriable)  // _QUEUE_FULL
    }
}
