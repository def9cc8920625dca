// Quantiles from Prometheus histogram buckets (the benchmarks' time per hop), and the per-stage figures taken from two
// scrapes of a stage's /metrics.
import Foundation
import HeraldCore
import HeraldToolSupport
import Testing

@testable import HeraldBenchSupport

@Suite("Time per hop from histogram buckets")
struct HopLatencyTests {
    /// 50 observations in (1 ms, 2 ms], 50 in (2 ms, 5 ms].
    let buckets: [(upperBound: Double, count: Double)] = [
        (0.001, 0), (0.002, 50), (0.005, 100), (.infinity, 100),
    ]

    @Test("the quantile is interpolated linearly inside the bucket that holds its rank")
    func interpolatesInsideTheBucket() throws {
        // Rank 99 lies 49 of the 50 observations into (2 ms, 5 ms].
        let p99 = try #require(histogramQuantile(0.99, buckets: buckets))
        #expect(abs(p99 - (0.002 + 0.003 * 49 / 50)) < 1e-12)
        // Rank 25 lies halfway into (1 ms, 2 ms].
        let p25 = try #require(histogramQuantile(0.25, buckets: buckets))
        #expect(abs(p25 - 0.0015) < 1e-12)
        // Rank 50 is the last observation of (1 ms, 2 ms]: its upper bound.
        #expect(histogramQuantile(0.5, buckets: buckets) == 0.002)
    }

    @Test("the first bucket starts at 0, and the order of the buckets given does not matter")
    func firstBucketFromZeroAnyOrder() throws {
        let b: [(upperBound: Double, count: Double)] = [(.infinity, 10), (0.0005, 10), (0.00025, 4)]
        // 4 observations in (0, 0.25 ms]: rank 2 is halfway.
        let p20 = try #require(histogramQuantile(0.2, buckets: b))
        #expect(abs(p20 - 0.000125) < 1e-12)
        // Rank 9 is 5 of the 6 observations into (0.25 ms, 0.5 ms].
        let p90 = try #require(histogramQuantile(0.9, buckets: b))
        #expect(abs(p90 - (0.00025 + 0.00025 * 5 / 6)) < 1e-12)
    }

    @Test("a rank in the +Inf bucket answers the highest finite bound; an empty histogram has no quantile")
    func infiniteBucketAndEmpty() {
        let b: [(upperBound: Double, count: Double)] = [(0.001, 90), (0.005, 95), (.infinity, 100)]
        #expect(histogramQuantile(0.99, buckets: b) == 0.005)
        #expect(histogramQuantile(0.5, buckets: [(0.001, 0), (.infinity, 0)]) == nil)
        #expect(histogramQuantile(0.5, buckets: []) == nil)
    }

    /// A stage's three histograms as /metrics shows them, with `n` observations per bucket bound (cumulative).
    func scrape(stage: String, _ counts: [String: [Double]]) -> StageMetrics {
        let bounds = ["0.001", "0.002", "0.005", "+Inf"]
        var text = ""
        for (metric, values) in counts {
            for (le, v) in zip(bounds, values) {
                text += "\(metric)_bucket{stage=\"\(stage)\",le=\"\(le)\"} \(v)\n"
            }
            text += "\(metric)_count{stage=\"\(stage)\"} \(values.last ?? 0)\n"
        }
        var m = StageMetrics()
        m.samples[stage] = MetricSamples(text).samples
        return m
    }

    @Test("a stage's figures are taken from the difference of two scrapes, each part from its own histogram")
    func measuresTheWindowBetweenTwoScrapes() throws {
        // Before the window: 1,000 fast records that must not count.
        let before = scrape(
            stage: "render",
            [
                HopLatency.totalMetric: [1000, 1000, 1000, 1000],
                HopLatency.processingMetric: [1000, 1000, 1000, 1000],
                HopLatency.ackWaitMetric: [1000, 1000, 1000, 1000],
            ])
        // In the window: 100 records, all of total in (2 ms, 5 ms]; processing in (0, 1 ms]; ack wait split.
        let after = scrape(
            stage: "render",
            [
                HopLatency.totalMetric: [1000, 1000, 1100, 1100],
                HopLatency.processingMetric: [1100, 1100, 1100, 1100],
                HopLatency.ackWaitMetric: [1000, 1050, 1100, 1100],
            ])
        let hop = try #require(HopLatency.measure(stage: "render", before: before, after: after))
        #expect(hop.records == 100)
        #expect(abs(hop.total.p50 - 3.5) < 1e-9)  // halfway into (2, 5] ms
        #expect(abs(hop.total.p99 - (2 + 3 * 0.99)) < 1e-9)
        #expect(abs(hop.processing.p50 - 0.5) < 1e-9)
        #expect(abs(hop.ackWait.p50 - 2) < 1e-9)
        #expect(abs(hop.ackWait.p99 - (2 + 3 * 49 / 50)) < 1e-9)
        // A stage that completed nothing in the window has no figures.
        #expect(HopLatency.measure(stage: "render", before: after, after: after) == nil)
        #expect(HopLatency.measure(stage: "send", before: before, after: after) == nil)
        let table = HopLatency.markdownTable([hop])
        #expect(table.contains("| render | 100 | 3.50 / 4.97 | 0.50 / 0.99 | 2.00 / 4.94 |"), "\(table)")
    }

    @Test("the run-queue figures join their stage's row; a stage without them shows a dash")
    func runQueueColumn() throws {
        let before = scrape(stage: "render", [HopLatency.totalMetric: [0, 0, 0, 0]])
        let after = scrape(
            stage: "render",
            [
                HopLatency.totalMetric: [10, 10, 10, 10], HopLatency.processingMetric: [10, 10, 10, 10],
                HopLatency.ackWaitMetric: [10, 10, 10, 10],
            ])
        let hops = HopLatency.measureAll(
            before: before, after: after, runQueue: ["render": (running: 0.5, waiting: 1.0), "send": (1, 1)])
        #expect(hops.map(\.stage) == ["render"])
        let table = HopLatency.markdownTable(hops)
        #expect(table.contains("| render | 10 |"), "\(table)")
        #expect(table.hasSuffix("| 2.00 (1.00 s of 0.50 s) |\n"), "\(table)")
        let json = try #require(HopLatency.json(hops)["render"])
        #expect(json["waited_for_a_core_seconds"] == .number("1"))
        #expect(json["cpu_seconds"] == .number("0.5"))
        var without = try #require(hops.first)
        without.runQueue = nil
        #expect(HopLatency.markdownTable([without]).hasSuffix("| - |\n"))
    }

    @Test("run-queue figures count each thread's growth; a thread started since counts from zero, one gone is left out")
    func runQueueDifference() {
        var earlier = RunQueueSample(pid: -1)
        #expect(earlier.threads.isEmpty)
        earlier.threads = [1: (2.0, 1.0), 2: (5.0, 4.0)]
        var now = RunQueueSample(pid: -1)
        now.threads = [1: (2.5, 1.75), 3: (0.25, 0.5)]  // thread 2 exited, thread 3 started
        let d = now.since(earlier)
        #expect(d.running == 0.75)
        #expect(d.waiting == 1.25)
    }

    @Test("this process's threads' time on a core grows while one of them works")
    func runQueueOfThisProcess() {
        let start = RunQueueSample(pid: getpid())
        #expect(!start.threads.isEmpty)
        var spun = 0.0
        var x: UInt64 = 1
        // Work until the kernel's account shows 20 ms more on a core; the rounds allowed hold seconds of work.
        for _ in 0..<100_000 where spun < 0.02 {
            for _ in 0..<100_000 { x = x &* 6_364_136_223_846_793_005 &+ 1 }
            keep(x)
            spun = RunQueueSample(pid: getpid()).since(start).running
        }
        #expect(spun >= 0.02)
        #expect(RunQueueSample(pid: getpid()).since(start).waiting >= 0)
    }
}

/// Keeps a computed value alive, so the work that made it is done.
@inline(never) func keep(_ value: UInt64) { _ = value }
