// Quantiles from Prometheus histogram buckets (the benchmarks' time per hop), and the per-stage figures taken from two
// scrapes of a stage's /metrics.
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
        m.samples[stage] = parseMetrics(text)
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
}
