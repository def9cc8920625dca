import Foundation
import HeraldStage
import HeraldTestSupport
import Prometheus
import Testing

@Suite("Readiness checks: probe timeouts")
struct ReadinessTests {
    @Test("a probe that ignores cancellation fails /readyz at its timeout instead of holding the answer")
    func nonCancellableProbeTimesOut() async throws {
        // Like a Redis PING waiting on the connection's own thread: cancelling the task does not end the wait.
        let gate = Gate()
        let readiness = ReadinessChecks()
        readiness.set("broker", ready: true)
        readiness.register("redis", timeout: .milliseconds(200)) {
            await gate.wait()
            return true
        }
        // Released long after the timeout, so a readiness check that waits for the probe shows up as a slow answer
        // rather than a hung test. The bounds below leave room for a loaded machine (a starved test process has
        // been seen to take 10 s, once 25 s, for this 200 ms timeout while parallel suites ran on 2 cores) and
        // still tell the two apart: waiting for the probe takes 90 s.
        let release = Task {
            try? await Task.sleep(for: .seconds(90))
            gate.open()
        }
        defer { release.cancel(); gate.open() }

        let started = ContinuousClock.now
        let report = await readiness.evaluate()
        let took = ContinuousClock.now - started
        #expect(report.failing == ["redis"])
        #expect(report.checks == ["broker": true, "redis": false])
        #expect(took < .seconds(60), "evaluate() took \(took) with a 200 ms probe timeout")
        #expect(took >= .milliseconds(150))

        // The same through the endpoint, while the first probe is still stuck.
        let registry = PrometheusCollectorRegistry()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness)
        let serving = Task { try await server.run() }
        defer { serving.cancel() }
        let httpStarted = ContinuousClock.now
        let answer = try await RawHTTP.get(port: server.port, path: "/readyz")
        #expect(answer.status == 503)
        #expect(ContinuousClock.now - httpStarted < .seconds(60))
        let json = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
        #expect(json["failing"] as? [String] == ["redis"])
    }

    @Test("a probe that answers before its timeout decides the check")
    func probeAnswersInTime() async {
        let readiness = ReadinessChecks()
        readiness.register("up", timeout: .seconds(60)) { true }
        readiness.register("down", timeout: .seconds(60)) { false }
        let started = ContinuousClock.now
        let report = await readiness.evaluate()
        #expect(report.checks == ["up": true, "down": false])
        // Answered probes do not wait out their timeouts.
        #expect(ContinuousClock.now - started < .seconds(30))
    }
}
