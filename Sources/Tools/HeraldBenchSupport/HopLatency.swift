// Herald's own time per hop, from the stages' scraped histograms: `herald_stage_latency_seconds` (consumption to
// outputs acknowledged) split into `herald_stage_processing_seconds` (the stage's own work, up to handing the outputs
// to the producer) and `herald_stage_ack_wait_seconds` (the broker's acknowledgement after it). The quantiles are
// taken from the bucket counts the way Prometheus's histogram_quantile takes them.
import Foundation
import HeraldCore
import HeraldToolSupport

/// A quantile from a Prometheus histogram's cumulative buckets, as `histogram_quantile` computes it: the bucket
/// holding the rank `q × total` is found, and the value is interpolated linearly between that bucket's lower bound
/// (the previous bucket's upper bound, 0 for the first) and its upper bound, as if its observations were spread
/// evenly. A rank in the `+Inf` bucket answers the highest finite bound. Nil when the histogram is empty.
///
/// - Parameters:
///   - q: the quantile, 0...1.
///   - buckets: (upper bound, cumulative count) pairs; `Double.infinity` for `+Inf`. Any order.
package func histogramQuantile(_ q: Double, buckets: [(upperBound: Double, count: Double)]) -> Double? {
    let sorted = buckets.sorted { $0.upperBound < $1.upperBound }
    guard let total = sorted.last?.count, total > 0 else { return nil }
    let rank = min(max(q, 0), 1) * total
    var lowerBound = 0.0
    var below = 0.0
    for bucket in sorted {
        if bucket.count >= rank && bucket.count > below {
            if bucket.upperBound == .infinity { return lowerBound }
            let inBucket = bucket.count - below
            return lowerBound + (bucket.upperBound - lowerBound) * (rank - below) / inBucket
        }
        if bucket.upperBound != .infinity { lowerBound = bucket.upperBound }
        below = bucket.count
    }
    return lowerBound
}

/// One stage's time per hop over a measured window: records and p50 / p99 of each part, in milliseconds.
package struct HopLatency {
    package struct Quantiles {
        package var p50: Double
        package var p99: Double
    }

    package var stage: String
    /// Records completed in the window (each carries its batch's time).
    package var records: Int
    /// Consumption to outputs acknowledged.
    package var total: Quantiles
    /// Consumption to outputs handed to the producer: Herald's own processing.
    package var processing: Quantiles
    /// Outputs handed to the producer to the broker's last acknowledgement: the broker's share.
    package var ackWait: Quantiles
    /// Over the window, the stage's threads' seconds on a core and seconds runnable but waiting for one (nil when
    /// its process could not be read): on a host the stages share with the broker, the processing p99 is mostly
    /// such waits.
    package var runQueue: (running: Double, waiting: Double)?

    package static let totalMetric = "herald_stage_latency_seconds"
    package static let processingMetric = "herald_stage_processing_seconds"
    package static let ackWaitMetric = "herald_stage_ack_wait_seconds"

    /// How the figures are computed, for the reports.
    package static let method =
        "Per stage, from its /metrics at the start and at the end of the measured window: the difference of each "
        + "histogram's bucket counts, and the quantile interpolated linearly inside the bucket that holds it (as "
        + "Prometheus's histogram_quantile does; buckets 0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 10, 25 ms, ...). Each record "
        + "counts once with its batch's time. total = consumption (the batch handed to the stage loop, after the "
        + "broker's fetch) to the outputs acknowledged; processing = to the outputs handed to the producer (Herald's "
        + "own work, with its Redis round trips and, at send, the provider's answers); ack wait = from there to the "
        + "broker's last acknowledgement (producer linger, produce round trip). waited for a core = the stage's "
        + "threads' time runnable but not running over the window (/proc/<pid>/task/*/schedstat), per second they "
        + "ran: time the host's other processes (the broker among them) held both cores."

    /// The window's figures for `stage`, from scrapes taken before and after it; nil when the stage completed no
    /// record in the window.
    package static func measure(stage: String, before: StageMetrics, after: StageMetrics) -> HopLatency? {
        func buckets(_ name: String) -> [(upperBound: Double, count: Double)] {
            func counts(_ m: StageMetrics) -> [String: Double] {
                var out: [String: Double] = [:]
                for sample in m.samples[stage] ?? [] where sample.name == name + "_bucket" {
                    if let le = sample.labels["le"] { out[le, default: 0] += sample.value }
                }
                return out
            }
            let start = counts(before)
            return counts(after).map { le, count in
                (le == "+Inf" ? Double.infinity : Double(le) ?? .infinity, count - (start[le] ?? 0))
            }
        }
        func quantiles(_ name: String) -> Quantiles {
            let b = buckets(name)
            return Quantiles(
                p50: (histogramQuantile(0.5, buckets: b) ?? 0) * 1000,
                p99: (histogramQuantile(0.99, buckets: b) ?? 0) * 1000)
        }
        let totalBuckets = buckets(totalMetric)
        let records = Int(totalBuckets.first { $0.upperBound == .infinity }?.count ?? 0)
        guard records > 0 else { return nil }
        return HopLatency(
            stage: stage, records: records, total: quantiles(totalMetric), processing: quantiles(processingMetric),
            ackWait: quantiles(ackWaitMetric))
    }

    /// The five notification stages' figures (registry carries no notifications).
    /// `runQueue` gives each stage's run-queue figures over the same window, when they were read.
    package static func measureAll(
        before: StageMetrics, after: StageMetrics,
        runQueue: [String: (running: Double, waiting: Double)] = [:]
    ) -> [HopLatency] {
        stageNames.filter { $0 != "registry" }.compactMap { stage in
            var hop = measure(stage: stage, before: before, after: after)
            hop?.runQueue = runQueue[stage]
            return hop
        }
    }

    /// A Markdown table of `hops`.
    package static func markdownTable(_ hops: [HopLatency]) -> String {
        var s =
            "| stage | records | total p50 / p99 ms | processing p50 / p99 ms | ack wait p50 / p99 ms "
            + "| waited for a core, s per CPU-s |\n"
        s += "| --- | --- | --- | --- | --- | --- |\n"
        func f(_ q: Quantiles) -> String { String(format: "%.2f / %.2f", q.p50, q.p99) }
        for h in hops {
            s +=
                "| \(h.stage) | \(h.records) | \(f(h.total)) | \(f(h.processing)) | \(f(h.ackWait)) "
                + "| \(waitText(h)) |\n"
        }
        return s
    }

    /// "waiting / running" as a ratio with both figures, or "-" when the stage's process was not read.
    static func waitText(_ h: HopLatency) -> String {
        guard let q = h.runQueue, q.running > 0 else { return "-" }
        return String(format: "%.2f (%.2f s of %.2f s)", q.waiting / q.running, q.waiting, q.running)
    }

    /// One line per stage, for the console.
    package static func summaryLines(_ hops: [HopLatency]) -> [String] {
        hops.map { h in
            "  \(h.stage): \(h.records) records, "
                + String(
                    format:
                        "total p50 %.2f / p99 %.2f ms; processing p50 %.2f / p99 %.2f ms; ack wait p50 %.2f / p99 %.2f ms",
                    h.total.p50, h.total.p99, h.processing.p50, h.processing.p99, h.ackWait.p50,
                    h.ackWait.p99) + (h.runQueue == nil ? "" : "; waited for a core \(waitText(h)) per CPU-s")
        }
    }

    /// The JSON object of `hops`, keyed by stage.
    package static func json(_ hops: [HopLatency]) -> [String: JSONValue] {
        var out: [String: JSONValue] = [:]
        for h in hops {
            func q(_ x: Quantiles) -> JSONValue { .sorted(["p50_ms": .double(x.p50), "p99_ms": .double(x.p99)]) }
            var entry: [String: JSONValue] = [
                "records": .int(h.records), "total": q(h.total), "processing": q(h.processing),
                "ack_wait": q(h.ackWait),
            ]
            if let r = h.runQueue {
                entry["cpu_seconds"] = .double(r.running)
                entry["waited_for_a_core_seconds"] = .double(r.waiting)
            }
            out[h.stage] = .sorted(entry)
        }
        return out
    }
}
