import Foundation
import HeraldStage
import HeraldTestSupport
import Prometheus
import Synchronization
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
        // The probe stays stuck until the test ends, so an answer that comes while the gate is still closed did not
        // wait for it, however long a loaded machine took to get there (a starved test process has been seen to
        // take 61 s for this 200 ms timeout while parallel suites and a build ran on 2 cores). A readiness check
        // that waits for the probe would answer only once this watchdog opens the gate: a failure, not a hang.
        let release = Task {
            try? await Task.sleep(for: .seconds(600))
            gate.open()
        }
        defer { release.cancel(); gate.open() }

        let started = ContinuousClock.now
        let report = await readiness.evaluate()
        let took = ContinuousClock.now - started
        #expect(!gate.isOpen, "evaluate() answered only once the stuck probe was released (after \(took))")
        #expect(report.failing == ["redis"])
        #expect(report.checks == ["broker": true, "redis": false])
        #expect(took >= .milliseconds(150))

        // The same through the endpoint, while the first probe is still stuck.
        let registry = PrometheusCollectorRegistry()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness)
        let serving = Task { try await server.run() }
        defer { serving.cancel() }
        let answer = try await RawHTTP.get(port: server.port, path: "/readyz")
        #expect(answer.status == 503)
        #expect(!gate.isOpen, "/readyz answered only once the stuck probe was released")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
        #expect(json["failing"] as? [String] == ["redis"])
    }

    @Test("a probe that answers before its timeout decides the check")
    func probeAnswersInTime() async {
        let readiness = ReadinessChecks()
        // Timeouts no busy host comes near: the evaluation ending before them is the probes' answers deciding it.
        // (A bound of half the timeout failed on a loaded test host, where the two answers waited 32 s for a thread.)
        readiness.register("up", timeout: .seconds(3600)) { true }
        readiness.register("down", timeout: .seconds(3600)) { false }
        let started = ContinuousClock.now
        let report = await readiness.evaluate()
        #expect(report.checks == ["up": true, "down": false])
        // Answered probes do not wait out their timeouts.
        #expect(ContinuousClock.now - started < .seconds(3600))
    }

    /// A probe whose answers and pauses the test sets, counting its runs.
    final class ScriptedProbe: Sendable {
        private let state = Mutex((runs: 0, answer: true, gate: Gate?.none))

        var runs: Int { state.withLock { $0.runs } }

        func next(answer: Bool, gate: Gate?) {
            state.withLock {
                $0.answer = answer; $0.gate = gate
            }
        }

        func run() async -> Bool {
            let (answer, gate) = state.withLock { s -> (Bool, Gate?) in
                s.runs += 1
                return (s.answer, s.gate)
            }
            await gate?.wait()
            return answer
        }
    }

    @Test("a fresh answer comes from the cache: one probe run for many requests")
    func cachedWhileFresh() async {
        let probe = ScriptedProbe()
        let cached = CachedProbe(maxAge: .seconds(3600)) { await probe.run() }
        for _ in 0..<5 { #expect(await cached.isUp()) }
        #expect(probe.runs == 1)
    }

    @Test("a stale answer is refreshed by one run; while that run is slow requests get the last answer, then its own")
    func slowRefreshAnswersWithTheLastAnswer() async throws {
        let probe = ScriptedProbe()
        let cached = CachedProbe(maxAge: .zero, grace: .milliseconds(10), patience: .seconds(3600)) {
            await probe.run()
        }
        #expect(await cached.isUp())  // the first answer is waited for
        let gate = Gate()
        // Opened long after, so a request that waits for the run fails below instead of hanging the test.
        let release = Task {
            try? await Task.sleep(for: .seconds(60))
            gate.open()
        }
        defer { release.cancel(); gate.open() }
        probe.next(answer: false, gate: gate)
        // The refresh cannot finish while the gate is shut: these requests take the last answer, sharing one run.
        #expect(await cached.isUp())
        #expect(await cached.isUp())
        #expect(probe.runs == 2)
        gate.open()
        // Once the run is over its answer is the one given (the probes after it answer the same).
        var answer = true
        for _ in 0..<10_000 where answer {
            answer = await cached.isUp()
            if answer { try await Task.sleep(for: .milliseconds(5)) }
        }
        #expect(answer == false)
    }

    @Test("a refresh running past its patience is waited for, so a hung dependency fails the readiness timeout")
    func hungRefreshFailsTheCheck() async {
        let probe = ScriptedProbe()
        let cached = CachedProbe(maxAge: .zero, grace: .milliseconds(10), patience: .zero) { await probe.run() }
        #expect(await cached.isUp())
        let gate = Gate()
        defer { gate.open() }
        probe.next(answer: true, gate: gate)
        let readiness = ReadinessChecks()
        readiness.register("redis", timeout: .milliseconds(200)) { await cached.isUp() }
        let report = await readiness.evaluate()
        #expect(report.checks == ["redis": false])
    }
}
