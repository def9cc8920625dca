// The client's swift-metrics counters, read through MetricsTestKit.
import Foundation
import HeraldCore
import HeraldPushProviders
import HeraldTestSupport
import Metrics
import MetricsTestKit
import Testing

/// MetricsSystem can be bootstrapped once per process.
let testMetrics: TestMetrics = {
    let m = TestMetrics()
    MetricsSystem.bootstrap(m)
    return m
}()

@Suite(.serialized)
struct MetricsTests {
    @Test func answersAreCountedByStatusAndReason() async throws {
        let metrics = testMetrics
        let pki = try await PKI.make()
        let server = try await startMock(pki, ["--rate-429", "0.3", "--seed", "11"])
        defer { server.stop() }
        let id = UUID().uuidString
        let config = APNsClientConfiguration(
            credential: try pki.tokenCredential(), endpoint: ServiceEndpoint(host: "127.0.0.1", port: server.port),
            trustedCAFile: pki.serverCert, connections: 1, retry: BackoffPolicy(maxAttempts: 1),
            metricDimensions: [("credential", id)])
        let c = try APNsClient(configuration: config)
        let responses = await sendAll(c, (0..<300).map { request($0) })
        await c.shutdown()
        let ok = responses.values.filter { $0.status == 200 }.count
        let throttled = responses.values.filter { $0.status == 429 }.count
        #expect(ok + throttled == 300)
        #expect(throttled > 0)
        #expect(
            metrics.counterTotal(
                label: "herald_apns_answers_total",
                dimensions: [("credential", id), ("status", "200"), ("reason", "")]) == Int64(ok))
        #expect(
            metrics.counterTotal(
                label: "herald_apns_answers_total",
                dimensions: [("credential", id), ("status", "429"), ("reason", "TooManyRequests")]) == Int64(throttled))
        #expect(
            metrics.counterTotal(label: "herald_apns_connections_opened_total", dimensions: [("credential", id)]) == 1)
        #expect(metrics.counterTotal(label: "herald_apns_jwt_renewals_total", dimensions: [("credential", id)]) == 1)
    }
}
