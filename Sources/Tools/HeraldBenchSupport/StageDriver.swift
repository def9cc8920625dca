// One stage fed alone (herald-bench stage): a backlog of the stage's own input, made by the stages upstream of it
// from the pipeline benchmark's workload (so its records are exactly what those stages produce, packed as they pack
// them), then the stage started alone to drain it while its process is measured from /proc and its /metrics.
import Foundation
import HeraldConfig

/// The five stages a notification passes through, in order, with the topics each reads and forwards to.
package enum BenchStage: String, CaseIterable {
    case ingest, resolve, suppress, render, send

    /// The stages before this one.
    package var upstream: [BenchStage] { Array(Self.allCases.prefix { $0 != self }) }

    /// The topics the backlog is made on (both lanes).
    package func inputs(_ t: TopicNames) -> [String] {
        switch self {
        case .ingest: return [t.chatEvents]
        case .resolve: return [t.ingested, t.ingestedPriority]
        case .suppress: return [t.resolved, t.resolvedPriority]
        case .render: return [t.deliverable, t.deliverablePriority]
        case .send: return [t.outbound, t.outboundPriority]
        }
    }

    /// The topics its outputs go to, DLQ excluded (send's outputs are the provider's answers).
    package func outputs(_ t: TopicNames) -> [String] {
        switch self {
        case .ingest: return [t.ingested, t.ingestedPriority]
        case .resolve: return [t.resolved, t.resolvedPriority]
        case .suppress: return [t.deliverable, t.deliverablePriority]
        case .render: return [t.outbound, t.outboundPriority]
        case .send: return []
        }
    }
}

extension StageMetrics {
    /// A counter of `stage` summed over the given topics.
    package func sum(_ name: String, stage: String, topics: [String]) -> Double {
        let set = Set(topics)
        return sum(name, stage: stage) { set.contains($0["topic"] ?? "") }
    }

    /// A counter of `stage` by one label's value (zeros left out).
    package func byLabel(_ name: String, label: String, stage: String) -> [String: Int] {
        var out: [String: Int] = [:]
        for x in samples[stage] ?? [] where x.name == name { out[x.labels[label] ?? "", default: 0] += Int(x.value) }
        return out.filter { $0.value != 0 }
    }
}

/// Makes the backlog, runs the stage alone and measures it.
package final class StageDriver {
    package let driver: LoadDriver
    package let stage: BenchStage
    package var drainTimeout: Double
    package var quiet = false

    package var session: BenchSession { driver.session }
    private var topics: TopicNames { driver.workload.topics }

    package init(driver: LoadDriver, stage: BenchStage, drainTimeout: Double) {
        self.driver = driver
        self.stage = stage
        self.drainTimeout = drainTimeout
    }

    package struct Result {
        package var stage: BenchStage
        package var options: WorkloadOptions
        package var events: Int
        /// Recipients the workload predicts (decided: delivered, suppressed or a render error).
        package var recipients: Int
        /// Notifications the workload predicts delivered (one per APNs request).
        package var notifications: Int
        package var predictedSuppressed: [String: Int]
        package var renderErrors: Int
        /// Records in the stage's input topics before it started (the backlog).
        package var inputs: Int
        /// Seconds the upstream stages took to make the backlog.
        package var backlogSeconds: Double
        /// What the stage must account for: its inputs, or the recipients at resolve (it fans events out).
        package var expectedUnits: Int
        /// Records the stage consumed in all, and while measured (from its first sample after it was ready, or
        /// from its start when `measuredFromStart`).
        package var consumed: Int
        package var consumedMeasured: Int
        /// True when the stage had consumed most of a small backlog before its first sample: it is then measured
        /// from its process's start (its start-up cost included) over everything it consumed.
        package var measuredFromStart: Bool
        /// Outputs produced to the next stage's topics (send: unique provider answers with 200).
        package var produced: Int
        package var producedByTopic: [String: Int]
        package var suppressed: [String: Int]
        /// Suppressions by reason of the upstream stages and this one together (to compare with the prediction).
        package var suppressedThroughStage: [String: Int]
        package var deadLettered: [String: Int]
        /// send: the stand-in's record against the workload's prediction.
        package var lostAnswers: Int
        package var duplicates: Int
        package var unexpected: Int
        package var drainSeconds: Double
        /// CPU seconds of every process while the stage drained.
        package var cpu: [String: Double]
        /// The stage's VmHWM: its peak resident memory since it started.
        package var peakRSSKB: Int
        package var hop: HopLatency?
        package var loadSeconds: Double

        /// outputs + suppressions + dead letters: what became of the stage's work.
        package var accounted: Int { produced + suppressed.values.reduce(0, +) + deadLettered.values.reduce(0, +) }
        package var lost: Int { max(0, expectedUnits - accounted) }
        package var stageCPU: Double { cpu[stage.rawValue] ?? 0 }
        /// The delivered notifications the measured part of the backlog carries (the backlog's notifications in
        /// proportion to the inputs consumed while measured): the denominator shared with `herald-bench pipeline`.
        package var notificationsMeasured: Double {
            inputs > 0 ? Double(notifications) * Double(consumedMeasured) / Double(inputs) : 0
        }

        package func consistencyProblems() -> [String] {
            var p: [String] = []
            if consumed != inputs { p.append("consumed \(consumed) records of a backlog of \(inputs)") }
            if accounted < expectedUnits {
                p.append(
                    "\(expectedUnits - accounted) of \(expectedUnits) lost (outputs \(produced) + suppressed + dead-lettered = \(accounted))"
                )
            }
            if accounted > expectedUnits {
                p.append("\(accounted - expectedUnits) more outputs than the \(expectedUnits) expected")
            }
            let dlq = deadLettered.values.reduce(0, +)
            if dlq > renderErrors { p.append("\(dlq) dead-lettered (\(renderErrors) predicted): \(deadLettered)") }
            switch stage {
            case .ingest:
                if produced != events { p.append("ingested \(produced) of \(events) events") }
            case .resolve:
                break
            case .suppress:
                if suppressedThroughStage != predictedSuppressed.filter({ $0.value > 0 }) {
                    p.append("suppressions \(suppressedThroughStage) differ from the prediction \(predictedSuppressed)")
                }
                if produced != notifications { p.append("\(produced) deliverable of \(notifications) predicted") }
            case .render:
                if produced != notifications { p.append("rendered \(produced) of \(notifications) predicted") }
            case .send:
                if lostAnswers > 0 { p.append("\(lostAnswers) notifications without a 200 from the stand-in") }
                if duplicates > 0 { p.append("\(duplicates) duplicated") }
                if unexpected > 0 { p.append("\(unexpected) unexpected notifications") }
            }
            return p
        }
    }

    private func log(_ s: String) { if !quiet { HeraldBenchSupport.log(s) } }

    package func run(events: Int) async throws -> Result {
        let name = stage.rawValue
        // 1. The chat events, as the pipeline benchmark publishes them.
        let fillStart = monotonicSeconds()
        for n in 0..<events { await driver.publish(driver.workload.groupEvent(n, createdAt: nowMillis())) }
        await driver.publisher.flush()
        if driver.publisher.unrecovered > 0 {
            throw BenchError("the broker refused \(driver.publisher.unrecovered) events")
        }
        // 2. The upstream stages make the backlog; they stop once it is complete.
        var inputs = events
        var suppressedUpstream: [String: Int] = [:]
        if !stage.upstream.isEmpty {
            for s in stage.upstream { try session.control.start(s.rawValue) }
            let m = try await waitForBacklog(events: events)
            let last = stage.upstream.last!
            inputs = Int(m.sum("herald_produced_total", stage: last.rawValue, topics: last.outputs(topics)))
            for s in stage.upstream {
                for (r, v) in m.byLabel("herald_suppressed_total", label: "reason", stage: s.rawValue) {
                    suppressedUpstream[r, default: 0] += v
                }
            }
            for s in stage.upstream where !(try session.control.stopStage(s.rawValue)) {
                throw BenchError("herald-\(s.rawValue) did not stop within 30 s")
            }
        }
        let backlogSeconds = monotonicSeconds() - fillStart
        log("backlog of \(inputs) records for herald-\(name) made in " + String(format: "%.1f s", backlogSeconds))

        // 3. The stage alone: measured from its first sample after it is ready to the moment it drained.
        let procs = ProcessAccounting(stack: session.info)
        try session.control.start(name)
        procs.sample()
        let first = StageMetrics.scrape(session.info)
        let start = monotonicSeconds()
        let consumedAtStart = Int(first.sum("herald_consumed_total", stage: name, topics: stage.inputs(topics)))
        let expectedUnits = stage == .resolve ? driver.recipientsDecided : inputs
        var last = first
        var lastChange = start
        var seen = (-1, -1)
        var end = start
        var lastProgress = start
        while true {
            try await Task.sleep(for: .milliseconds(250))
            driver.step()
            procs.sample()
            last = StageMetrics.scrape(session.info)
            end = monotonicSeconds()
            let consumed = Int(last.sum("herald_consumed_total", stage: name, topics: stage.inputs(topics)))
            let accounted = self.accounted(last)
            let inFlight = last.sum("herald_in_flight", stage: name)
            if consumed >= inputs && inFlight == 0 && accounted >= expectedUnits { break }
            if (consumed, accounted) != seen {
                seen = (consumed, accounted)
                lastChange = end
            } else if end - lastChange > drainTimeout {
                log("nothing new for \(Int(drainTimeout)) s: stopping with \(expectedUnits - accounted) unaccounted")
                break
            }
            if end - lastProgress >= 1 {
                lastProgress = end
                log(
                    String(format: "t=%5.1fs ", end - start)
                        + "herald-\(name) consumed \(consumed) of \(inputs), accounted \(accounted) of \(expectedUnits), "
                        + String(format: "CPU %.2f s", procs.cpuSeconds(name)))
            }
        }
        var cpu: [String: Double] = [:]
        for c in ProcessAccounting.components { cpu[c] = procs.cpuSeconds(c) }
        // A backlog small enough to be mostly drained before the first sample leaves too little in the window to
        // measure (nothing at all when it was drained whole): the stage is then measured over its whole life.
        let measuredFromStart = consumedAtStart * 2 > inputs
        if measuredFromStart {
            cpu[name] = procs.cpuSecondsSinceStart(name)
            log(
                "herald-\(name) consumed \(consumedAtStart) of \(inputs) before its first sample: measured from its start"
            )
        }
        let peak = procs.peakRSSKB(name)
        if stage == .send {
            // One more look for duplicates still in flight.
            try await Task.sleep(for: .milliseconds(1500))
            driver.step()
            last = StageMetrics.scrape(session.info)
        }
        let consumed = Int(last.sum("herald_consumed_total", stage: name, topics: stage.inputs(topics)))
        let suppressed = last.byLabel("herald_suppressed_total", label: "reason", stage: name)
        var through = suppressedUpstream
        for (r, v) in suppressed { through[r, default: 0] += v }
        var producedByTopic: [String: Int] = [:]
        for t in stage.outputs(topics) {
            let v = Int(last.sum("herald_produced_total", stage: name, topics: [t]))
            if v > 0 { producedByTopic[t] = v }
        }
        let ledger = driver.ledger
        return Result(
            stage: stage, options: driver.workloadOptions, events: events, recipients: driver.recipientsDecided,
            notifications: ledger.expectedCount, predictedSuppressed: driver.predictedSuppressed,
            renderErrors: driver.renderErrors, inputs: inputs, backlogSeconds: backlogSeconds,
            expectedUnits: expectedUnits, consumed: consumed,
            consumedMeasured: measuredFromStart ? consumed : consumed - consumedAtStart,
            measuredFromStart: measuredFromStart,
            produced: produced(last), producedByTopic: producedByTopic, suppressed: suppressed,
            suppressedThroughStage: through.filter { $0.value > 0 },
            deadLettered: last.byLabel("herald_dlq_total", label: "reason", stage: name),
            lostAnswers: stage == .send ? ledger.lost : 0, duplicates: stage == .send ? ledger.duplicates.count : 0,
            unexpected: stage == .send ? ledger.unexpected200 : 0, drainSeconds: end - start, cpu: cpu,
            peakRSSKB: peak,
            hop: HopLatency.measure(stage: name, before: measuredFromStart ? StageMetrics() : first, after: last),
            loadSeconds: driver.loadSeconds)
    }

    /// The stage's outputs: records acknowledged on the next stage's topics, or at send the notifications the
    /// stand-in answered with 200 (once each).
    private func produced(_ m: StageMetrics) -> Int {
        if stage == .send { return driver.ledger.delivered }
        return Int(m.sum("herald_produced_total", stage: stage.rawValue, topics: stage.outputs(topics)))
    }

    private func accounted(_ m: StageMetrics) -> Int {
        let name = stage.rawValue
        return produced(m) + Int(m.sum("herald_suppressed_total", stage: name) + m.sum("herald_dlq_total", stage: name))
    }

    /// Waits until each upstream stage consumed everything the one before it produced (ingest: every event), none
    /// has work in flight, and the counts held still for a second; returns the last scrape.
    private func waitForBacklog(events: Int) async throws -> StageMetrics {
        var previous: [Double] = []
        var stableSince = monotonicSeconds()
        var lastChange = monotonicSeconds()
        let started = monotonicSeconds()
        var lastProgress = started
        while true {
            try await Task.sleep(for: .milliseconds(250))
            let m = StageMetrics.scrape(session.info)
            var complete = true
            var expected = Double(events)
            var counts: [Double] = []
            for s in stage.upstream {
                let consumed = m.sum("herald_consumed_total", stage: s.rawValue, topics: s.inputs(topics))
                let produced = m.sum("herald_produced_total", stage: s.rawValue, topics: s.outputs(topics))
                if consumed < expected || m.sum("herald_in_flight", stage: s.rawValue) != 0 { complete = false }
                counts += [consumed, produced]
                expected = produced
            }
            let now = monotonicSeconds()
            if counts != previous {
                previous = counts
                stableSince = now
                lastChange = now
            }
            if complete && now - stableSince >= 1 { return m }
            if now - lastChange > drainTimeout {
                throw BenchError(
                    "the upstream stages made no progress for \(Int(drainTimeout)) s (consumed, produced per stage: \(counts))"
                )
            }
            if now - lastProgress >= 2 {
                lastProgress = now
                log(
                    String(format: "t=%5.1fs making the backlog: ", now - started)
                        + zip(stage.upstream, stride(from: 0, to: counts.count, by: 2)).map {
                            "\($0.0.rawValue) \(Int(counts[$0.1])) in / \(Int(counts[$0.1 + 1])) out"
                        }.joined(separator: ", "))
            }
        }
    }
}
