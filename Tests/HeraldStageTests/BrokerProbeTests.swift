import HeraldKafka
import HeraldTestSupport
import Testing

@testable import HeraldStage

/// `/readyz`'s broker check connects the way the stage's own clients do.
@Suite("Broker readiness check")
struct BrokerProbeTests {
    @Test(
        "the broker check uses the stage clients' librdkafka properties: a stage set for TLS is not ready against a plaintext broker"
    )
    func brokerProbeConnectsAsTheClientsDo() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let plaintext = KafkaClientConfiguration(brokers: broker.brokers, clientID: "herald-test-probe")
        // A new probe each time: one probe keeps its answer for 5 s, and the broker may still be settling.
        try await waitUntil("a plaintext client's broker check passes", timeout: .seconds(120)) {
            await BrokerProbe(client: plaintext).isUp()
        }
        var tls = plaintext
        tls.extraProperties = ["security.protocol": "ssl"]
        // The stage's consumer and producer would speak TLS to this broker and fail; so does its check.
        #expect(await !BrokerProbe(client: tls).isUp())
        #expect(await BrokerProbe(client: plaintext).isUp())
    }
}
