import HeraldKafka
import HeraldTestSupport
import Testing

@testable import HeraldStage

/// `/readyz`'s broker check connects the way the stage's own clients do, and keeps its connection.
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

    @Test("checks reuse one client and its connection: the bootstrap address is connected to once, not per check")
    func checksReuseTheirConnection() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        let proxy = try FreezingProxy(upstreamPort: broker.port)
        defer { proxy.stop() }
        var configuration = KafkaAdminConfiguration(
            client: KafkaClientConfiguration(brokers: ["127.0.0.1:\(proxy.port)"], clientID: "herald-test-check"))
        configuration.requestTimeout = .seconds(2)
        let check = KafkaClusterCheck(configuration: configuration)
        try await waitUntil("the broker answers the check", timeout: .seconds(120)) { await check.answers() }
        let connections = proxy.connectionsAccepted
        for _ in 0..<5 { #expect(await check.answers()) }
        // A client made per check would reach the cluster through its bootstrap address (the proxy) each time.
        #expect(proxy.connectionsAccepted == connections)
        #expect(check.clientsMade == 1)
        #expect(connections >= 1)
    }

    @Test("a check fails while the broker is away and passes again once it is back, on the same client")
    func checkFollowsTheBroker() async throws {
        let broker = try await TansuBroker.start()
        defer { broker.stop() }
        var configuration = KafkaAdminConfiguration(
            client: KafkaClientConfiguration(brokers: broker.brokers, clientID: "herald-test-check"))
        configuration.requestTimeout = .seconds(1)
        let check = KafkaClusterCheck(configuration: configuration)
        try await waitUntil("the broker answers the check", timeout: .seconds(120)) { await check.answers() }
        broker.stop()
        try await waitUntil("the check fails with the broker stopped", timeout: .seconds(60)) {
            await !check.answers()
        }
        try await broker.restart()
        try await waitUntil("the check passes with the broker back", timeout: .seconds(120)) { await check.answers() }
        #expect(check.clientsMade == 1)
    }
}
