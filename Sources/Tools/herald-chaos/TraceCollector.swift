// The trace-collector scenarios: the stages trace every event (OTEL_TRACES_SAMPLER_ARG=1.0) and export their spans
// to a stand-in collector inside herald-chaos (CollectorStandIn). A backlog drains while the collector answers (the
// baseline); then the collector refuses connections (`collector-refused`) or accepts them and never answers
// (`collector-hung`) and a backlog of the same size drains again. Passes when nothing is lost or duplicated,
// every stage stays the same ready process, herald_trace_spans_dropped_total grows on each pipeline stage, and the
// backlog under the fault does not stall (drains within the drain timeout and at most `stallFactor` times slower than
// the baseline; the ratio is reported, never judged against a tight bound).
import Foundation
import Glibc
import HeraldBenchSupport

extension ChaosRunner {
    /// The backlog under the fault may take at most this many times the baseline's drain (floored at
    /// `stallFloorSeconds`) before it counts as a stall: the exporter must not hold up the pipeline, and a loaded CI
    /// host makes two drains of the same backlog differ by far less than this.
    static let stallFactor = 5.0
    static let stallFloorSeconds = 4.0

    /// The stages that must count dropped spans: every stage an event of the workload goes through (the registry
    /// sees no traced record in this workload, so its counter is reported but not required to grow).
    static let tracedStages = ["ingest", "resolve", "suppress", "render", "send"]

    func traceCollector(fault: CollectorStandIn.Mode) async throws -> ChaosOutcome {
        let collector = try CollectorStandIn()
        defer { collector.stop() }
        // The stages read these at startup: scripts/local-stack.sh passes the environment on to them. The endpoint
        // is set explicitly, so it wins over any collector the script would give the stages otherwise; a traces
        // endpoint or OTEL_SDK_DISABLED from the caller's environment would win over it, so they are unset.
        let environment = ScopedEnvironment([
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_TRACES_SAMPLER_ARG": "1.0",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": nil, "OTEL_SDK_DISABLED": nil,
        ])
        defer { environment.restore() }
        let session = try open()
        defer {
            // A held export would hold a stage's shutdown up to the export timeout: let go of it first.
            collector.stop()
            session.close(keep: options.stack.keep)
        }
        var problems: [String] = []
        let pidsBefore = Dictionary(uniqueKeysWithValues: stageNames.map { ($0, session.info.pid($0)) })

        // The stages got the endpoint (read from their environment, not assumed).
        let missing = stageNames.filter {
            guard let pid = session.info.pid($0) else { return true }
            return processEnvironment(pid)["OTEL_EXPORTER_OTLP_ENDPOINT"] != collector.endpoint
        }
        if !missing.isEmpty {
            problems.append(
                "OTEL_EXPORTER_OTLP_ENDPOINT=\(collector.endpoint) did not reach \(missing.joined(separator: ", "))")
        }

        // Warm-up, not measured: the first records of a fresh stack pay for connections and group joins. The
        // collector must get spans from it, else tracing is not on and the scenario would prove nothing.
        let warmup = try await LoadDriver(session: session, workload: workload(mix: false))
        warmup.quiet = true
        let warm = try await warmup.run(mode: .backlog(reduced ? 50 : 200), mixed: nil, drainTimeout: drainTimeout)
        if !(try await waitFor(seconds: 30) { collector.answered > 0 }) {
            problems.append("the stand-in collector got no export request: tracing is not on in the stages")
        }

        // The baseline: the collector answers every export.
        let droppedAtStart = droppedSpans(session)
        let baseline = try await LoadDriver(session: session, workload: workload(mix: false))
        let (base, baseSeconds) = try await drainTimed(baseline)
        let answeredBefore = collector.answered
        let droppedBefore = droppedSpans(session)
        let failedInBaseline = stageNames.filter {
            droppedBefore[$0, "export_failed"] > droppedAtStart[$0, "export_failed"]
        }
        if !failedInBaseline.isEmpty {
            problems.append(
                "exports failed while the collector answered, on \(failedInBaseline.joined(separator: ", "))")
        }

        // The fault, then the same backlog again while the stages' readiness is probed every second.
        let faultStarted = monotonicSeconds()
        switch fault {
        case .refuse: collector.refuse()
        case .hold: collector.hold()
        case .answer: break
        }
        let faulty = try await LoadDriver(session: session, workload: workload(mix: false))
        var notReady: [String: Int] = [:]
        var notReadyInARow: [String: Int] = [:]
        var notReadyTwice = Set<String>()
        faulty.onTick = { _ in
            for stage in stageNames {
                if httpRequest(port: session.info.metricsPort(stage: stage), path: "/readyz") == nil {
                    notReady[stage, default: 0] += 1
                    notReadyInARow[stage, default: 0] += 1
                    if notReadyInARow[stage]! >= 2 { notReadyTwice.insert(stage) }
                } else {
                    notReadyInARow[stage] = 0
                }
            }
        }
        let (r, faultSeconds) = try await drainTimed(faulty)

        // The dropped spans: an export that cannot connect fails; a held one fails at the export timeout (10 s).
        // Both within 90 s. Only `export_failed` proves the fault was seen: `queue_full` also counts spans of a
        // burst the exporter does not keep up with while the collector answers (reported for both backlogs).
        let waitSeconds = 90.0
        var droppedNow = droppedBefore
        let grew = try await waitFor(seconds: waitSeconds) {
            droppedNow = droppedSpans(session)
            return Self.tracedStages.allSatisfy {
                droppedNow[$0, "export_failed"] > droppedBefore[$0, "export_failed"]
            }
        }
        let countedAfter = monotonicSeconds() - faultStarted
        func growth(_ reason: String, from: DroppedSpans, to: DroppedSpans) -> String {
            stageNames.map { "\($0) +\(Int(to[$0, reason] - from[$0, reason]))" }.joined(separator: " ")
        }
        if !grew {
            let flat = Self.tracedStages.filter {
                droppedNow[$0, "export_failed"] <= droppedBefore[$0, "export_failed"]
            }
            problems.append(
                "herald_trace_spans_dropped_total{reason=\"export_failed\"} did not grow within \(Int(waitSeconds)) s on \(flat.joined(separator: ", "))"
            )
        }
        if fault == .refuse, collector.answered > answeredBefore {
            problems.append("the collector answered \(collector.answered - answeredBefore) exports after it closed")
        }

        // Still ready, still the same processes.
        for stage in stageNames {
            var ready = false
            for _ in 0..<3 where !ready {
                ready = httpRequest(port: session.info.metricsPort(stage: stage), path: "/readyz") != nil
                if !ready { try await Task.sleep(for: .seconds(1)) }
            }
            if !ready { problems.append("\(stage) not ready at the end") }
        }
        if !notReadyTwice.isEmpty {
            problems.append("not ready at two probes in a row: \(notReadyTwice.sorted().joined(separator: ", "))")
        }
        let replaced = stageNames.filter { session.info.pid($0) != pidsBefore[$0] }
        if !replaced.isEmpty { problems.append("restarted meanwhile: \(replaced.joined(separator: ", "))") }
        problems += faultProblems(FaultLog(), session)
        for (name, phase) in [("warm-up", warm), ("baseline", base)] {
            if phase.lost > 0 || !phase.duplicates.isEmpty {
                problems.append("\(name): \(phase.lost) lost, \(phase.duplicates.count) duplicated")
            }
        }

        let ratio = faultSeconds / max(baseSeconds, 0.001)
        if faultSeconds > Self.stallFactor * max(baseSeconds, Self.stallFloorSeconds) {
            problems.append(
                String(
                    format: "the backlog stalled: %.1f s under the fault, more than %.0f× the baseline's %.1f s",
                    faultSeconds, Self.stallFactor, baseSeconds))
        }
        let what = fault == .hold ? "collector accepts and never answers" : "collector refuses connections"
        let probes =
            notReady.isEmpty
            ? ""
            : "; failed readiness probes: "
                + notReady.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        return outcome(
            r, extraProblems: problems,
            detail: String(
                format:
                    "%@; %d notifications per backlog; drain %.1f s with the collector answering, %.1f s under the fault (ratio %.2f); spans dropped under the fault (every pipeline stage counting %.0f s after it began): export_failed %@, queue_full %@; queue_full in the baseline: %@; exports answered %d, held %d%@",
                what, r.expected, baseSeconds, faultSeconds, ratio, countedAfter,
                growth("export_failed", from: droppedBefore, to: droppedNow),
                growth("queue_full", from: droppedBefore, to: droppedNow),
                growth("queue_full", from: droppedAtStart, to: droppedBefore), collector.answered, collector.held,
                probes))
    }

    /// Drains one backlog and returns its result and its drain time: from the first event published to the last
    /// notification delivered.
    private func drainTimed(_ driver: LoadDriver) async throws -> (LoadDriver.Result, Double) {
        let events = reduced ? 1_500 : 5_000
        let started = nowMillis()
        let r = try await driver.run(mode: .backlog(events), mixed: nil, drainTimeout: drainTimeout)
        let seconds = Double(max(driver.ledger.lastDeliveryAt, started) - started) / 1000
        return (r, seconds)
    }

    /// The stages' herald_trace_spans_dropped_total now.
    private func droppedSpans(_ session: BenchSession) -> DroppedSpans {
        DroppedSpans(metrics: StageMetrics.scrape(session.info))
    }

    /// Polls `condition` every 250 ms until it holds (true) or `seconds` pass (false).
    private func waitFor(seconds: Double, _ condition: () throws -> Bool) async throws -> Bool {
        let deadline = monotonicSeconds() + seconds
        while true {
            if try condition() { return true }
            if monotonicSeconds() >= deadline { return false }
            try await Task.sleep(for: .milliseconds(250))
        }
    }
}

/// The stages' herald_trace_spans_dropped_total at one scrape, by stage and reason (0 where a stage has none).
struct DroppedSpans {
    let metrics: StageMetrics

    subscript(stage: String, reason: String) -> Double {
        metrics.sum("herald_trace_spans_dropped_total", stage: stage) { $0["reason"] == reason }
    }
}

/// A process's environment as it started (`/proc/<pid>/environ`).
func processEnvironment(_ pid: Int32) -> [String: String] {
    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/environ") else { return [:] }
    var out: [String: String] = [:]
    for entry in data.split(separator: 0) {
        let text = String(decoding: entry, as: UTF8.self)
        guard let eq = text.firstIndex(of: "=") else { continue }
        out[String(text[..<eq])] = String(text[text.index(after: eq)...])
    }
    return out
}

/// Sets (or, with nil, unsets) variables of herald-chaos's own environment, which the stacks it starts inherit, and
/// puts the previous values back on `restore()`.
final class ScopedEnvironment {
    private var previous: [String: String?] = [:]

    init(_ values: [String: String?]) {
        for (name, value) in values {
            previous[name] = getenv(name).map { String(cString: $0) }
            if let value { setenv(name, value, 1) } else { unsetenv(name) }
        }
    }

    func restore() {
        for (name, value) in previous {
            if let value { setenv(name, value, 1) } else { unsetenv(name) }
        }
        previous = [:]
    }
}
