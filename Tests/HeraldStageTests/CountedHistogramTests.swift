import Foundation
import Prometheus
import Testing

@testable import HeraldStage

/// The per-record duration histograms take a batch's records in one step (`CountedHistogram`); `/metrics` must show
/// them exactly as swift-prometheus shows a histogram fed the same observations one at a time.
@Suite("Counted histograms: a batch's records in one step, the registry's text format")
struct CountedHistogramTests {
    static func lines(_ bytes: [UInt8]) -> [String] {
        String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
    }

    @Test("observations recorded by the batch give the lines the registry's histogram gives one by one")
    func sameTextAsTheRegistry() {
        let registry = PrometheusCollectorRegistry()
        let reference = registry.makeDurationHistogram(
            descriptor: MetricNameDescriptor(metricName: "herald_x", unitName: "seconds", helpText: ""),
            labels: [("stage", "send"), ("lane", "bulk")], buckets: HeraldMetrics.latencyBuckets)
        let counted = CountedHistogram(
            name: "herald_x_seconds", labels: [("stage", "send"), ("lane", "bulk")],
            bounds: HeraldMetrics.latencyBuckets)
        // Values on bucket bounds, between them, past the last one, and zero.
        let batches: [(Duration, Int)] = [
            (.microseconds(100), 3), (.microseconds(101), 2), (.milliseconds(5), 40), (.microseconds(4_999), 1),
            (.seconds(31), 2), (.zero, 4), (.milliseconds(2500), 7), (.nanoseconds(1_234_567), 250),
        ]
        for (value, count) in batches {
            for _ in 0..<count { reference.record(value) }
            counted.record(value, count: count)
        }
        counted.record(.milliseconds(1), count: 0)
        var mine: [UInt8] = []
        counted.emit(into: &mine)
        let theirs = Self.lines(registry.emitToBuffer()).filter { !$0.hasPrefix("#") }
        #expect(Self.lines(mine) == theirs)
        #expect(theirs.contains(#"herald_x_seconds_count{stage="send",lane="bulk"} 309"#))
    }

    @Test("/metrics shows a stage's latency series once each, with one TYPE line per name, lanes included")
    func servedWithTheRegistry() {
        let registry = PrometheusCollectorRegistry()
        let factory = HeraldMetrics.makeFactory(registry: registry)
        let metrics = StageMetrics(stage: "render", factory: factory)
        let priority = metrics.lane("priority")
        metrics.recordLatencyParts(processing: .milliseconds(3), ackWait: .microseconds(200), count: 40)
        priority.recordLatency(.milliseconds(7), count: 5)
        metrics.recordLatency(.milliseconds(7))
        // A second StageMetrics for the same stage and registry shares the series.
        StageMetrics(stage: "render", factory: factory).recordLatency(.milliseconds(20), count: 2)
        metrics.consumed(topic: "herald.deliverable", count: 46)

        let lines = Self.lines(HeraldMetrics.emit(registry))
        #expect(lines.contains(#"herald_stage_processing_seconds_count{stage="render"} 40"#))
        #expect(lines.contains(#"herald_stage_processing_seconds_bucket{stage="render",le="0.003"} 40"#))
        #expect(lines.contains(#"herald_stage_processing_seconds_bucket{stage="render",le="0.002"} 0"#))
        #expect(lines.contains(#"herald_stage_processing_seconds_sum{stage="render"} 0.12"#))
        #expect(lines.contains(#"herald_stage_ack_wait_seconds_bucket{stage="render",le="0.00025"} 40"#))
        #expect(lines.contains(#"herald_stage_latency_seconds_count{stage="render"} 8"#))
        #expect(lines.contains(#"herald_stage_latency_seconds_bucket{stage="render",le="0.01"} 6"#))
        #expect(lines.contains(#"herald_lane_latency_seconds_count{stage="render",lane="priority"} 5"#))
        #expect(lines.contains(#"herald_consumed_total{stage="render",topic="herald.deliverable"} 46"#))
        for name in [
            "herald_stage_latency_seconds", "herald_stage_processing_seconds", "herald_stage_ack_wait_seconds",
            "herald_lane_latency_seconds",
        ] {
            #expect(lines.filter { $0 == "# TYPE \(name) histogram" }.count == 1, "\(name)")
            #expect(lines.filter { $0.hasPrefix("\(name)_count{") }.count == 1, "\(name)")
        }
        // Another registry sees none of them.
        #expect(!Self.lines(HeraldMetrics.emit(PrometheusCollectorRegistry())).contains { $0.contains("render") })
    }
}
