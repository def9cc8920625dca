import Foundation
import HeraldCore
import HeraldStage
import HeraldTestSupport
import Logging
import Prometheus
import Testing

@Suite("Stage set-up without process-wide bootstrap")
struct StageContextTests {
    /// A context over its own registry and log sink, as many times as a test likes in one process.
    func context(_ stage: String, _ environment: [String: String], sink: CapturingSink) async throws -> StageContext {
        let parsed = try StageEnvironment(environment: environment)
        let logger = Logger(label: "herald.\(stage)") { JSONLogHandler(label: $0, level: .debug, sink: sink) }
        return try await StageContext.make(
            stage: stage, environment: parsed, registry: PrometheusCollectorRegistry(),
            logger: logger)
    }

    @Test("make binds the endpoint, tags the logger, logs unknown keys, and keeps its metrics in its own registry")
    func makeIsSelfContained() async throws {
        let sinkA = CapturingSink()
        let sinkB = CapturingSink()
        let a = try await context(
            "resolve",
            [
                "HERALD_METRICS_HOST": "127.0.0.1", "HERALD_METRICS_PORT": "0",
                "HERALD_INSTANCE": "r-1", "HERALD_REDIS_ULR": "typo",
            ], sink: sinkA)
        let b = try await context(
            "render", ["HERALD_METRICS_HOST": "127.0.0.1", "HERALD_METRICS_PORT": "0"], sink: sinkB)
        let servingA = Task { try await a.http.run() }
        let servingB = Task { try await b.http.run() }
        defer { servingA.cancel(); servingB.cancel() }
        #expect(a.http.port > 0 && b.http.port > 0 && a.http.port != b.http.port)

        // The unknown key is warned about through the stage's logger, tagged with stage and instance.
        let warning = try #require(sinkA.lines.first { $0.contains("HERALD_REDIS_ULR") })
        let object = try #require(try JSONSerialization.jsonObject(with: Data(warning.utf8)) as? [String: Any])
        #expect(object["level"] as? String == "warning")
        let metadata = try #require(object["metadata"] as? [String: Any])
        #expect(metadata["stage"] as? String == "resolve")
        #expect(metadata["instance"] as? String == "r-1")
        #expect(!sinkB.lines.contains { $0.contains("HERALD_REDIS_ULR") })

        // Each context counts into its own registry, served by its own endpoint.
        a.metrics.consumed(topic: "herald.ingested", count: 2)
        b.metrics.consumed(topic: "herald.deliverable", count: 5)
        let bodyA = try await RawHTTP.get(port: a.http.port, path: "/metrics").body
        let bodyB = try await RawHTTP.get(port: b.http.port, path: "/metrics").body
        #expect(bodyA.contains(#"herald_consumed_total{stage="resolve",topic="herald.ingested"} 2"#), "\(bodyA)")
        #expect(!bodyA.contains("herald.deliverable"))
        #expect(
            bodyA.contains(#"herald_build_info{stage="resolve",version="\#(HeraldVersion.current)"} 1"#), "\(bodyA)")
        #expect(bodyB.contains(#"herald_consumed_total{stage="render",topic="herald.deliverable"} 5"#), "\(bodyB)")

        // Readiness is per context too.
        a.readiness.set("kafka", ready: false)
        #expect(try await RawHTTP.get(port: a.http.port, path: "/readyz").status == 503)
        #expect(try await RawHTTP.get(port: b.http.port, path: "/readyz").status == 200)
    }

    @Test("a bad environment value is a configuration error naming the key, before anything is bound")
    func badEnvironment() async {
        do {
            _ = try await context("send", ["HERALD_METRICS_PORT": "seventy"], sink: CapturingSink())
            Issue.record("accepted a bad port")
        } catch let error as ConfigurationError {
            #expect(error.key == "HERALD_METRICS_PORT")
        } catch {
            Issue.record("unexpected error \(error)")
        }
    }
}
