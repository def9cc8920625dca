// The APNs scenarios: the stand-in answering with a mix of 503, 429, GOAWAY and connection resets, and the stand-in
// silent for a while (send's memory must stay bounded).
import Foundation
import Glibc
import HeraldBenchSupport
import HeraldToolSupport

extension ChaosRunner {
    func apnsFaultMix() async throws -> ChaosOutcome {
        // GOAWAY every 50 streams by default. The issue's figure, 5,000 (`--apns-goaway-every 5000`), is rarely
        // reached with 1 % of streams resetting their connection, and connections then carry many streams when they
        // are reset: the case that once sent answered notifications twice, and that still dead-letters a few now
        // and then (docs/testing.md).
        let mock = "--rate-503 0.05 --rate-429 0.01 --goaway-every \(options.apnsGoawayEvery) --rate-reset 0.01"
        let session = try open(mockArgs: mock)
        defer { session.close(keep: options.stack.keep) }
        let notifications = reduced ? 5_000 : 100_000
        let driver = try await LoadDriver(session: session, workload: workload(mix: false))
        let r = try await driver.run(mode: .backlog(notifications / 4), mixed: nil, drainTimeout: drainTimeout)
        let mm =
            httpRequest(port: session.info.mockMetricsPort, path: "/metrics").map { MetricSamples($0).samples } ?? []
        func mv(_ n: String) -> Int { Int(mm.filter { $0.name == n }.map(\.value).reduce(0, +)) }
        let injected = mm.filter { $0.name == "herald_mock_apns_faults_injected_total" }
            .map { "\($0.labels["reason"] ?? "?") \(Int($0.value))" }.joined(separator: ", ")
        var problems: [String] = []
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        return outcome(
            r, extraProblems: problems,
            detail:
                "\(r.expected) notifications; injected: \(injected); GOAWAYs \(mv("herald_mock_apns_goaways_total")), connection resets \(mv("herald_mock_apns_random_resets_total"))"
        )
    }

    // MARK: APNs stall

    func apnsStall() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        let stall = reduced ? 10.0 : 30.0
        let rate = reduced ? 100.0 : 300.0
        let seconds = 3 + stall + 5
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        let memory = startFault(at: 3, watching: "send", driver: driver, session: session) {
            if httpRequest(port: session.info.mockMetricsPort, method: "POST", path: "/pause?ms=\(Int(stall * 1000))")
                == nil
            {
                faults.note("the stand-in did not accept POST /pause")
            }
            faults.add(.init(stage: "mock-apns", action: "pause", at: nowMillis(), status: nil))
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: stall + drainTimeout)
        var problems = faults.allNotes
        let growthMB = memory.growthMB
        if growthMB > Double(options.memoryLimitMB) {
            problems.append(
                String(format: "herald-send grew by %.0f MB (limit %d MB)", growthMB, options.memoryLimitMB))
        }
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        return outcome(
            r, extraProblems: problems,
            detail: String(
                format: "stand-in silent for %.0f s; herald-send RSS %.0f MB before, %.0f MB peak; latency p99 %d ms",
                stall, Double(memory.beforeKB) / 1024, Double(memory.peakKB) / 1024, r.overall.p99))
    }
}
