import Foundation
import HeraldCore
import HeraldToolSupport

/// One Herald-against-h2load comparison (a target and a connection count) over its rounds.
struct Comparison {
    struct Round {
        var herald: APNsBench.Figures
        var h2load: APNsBench.Figures
        /// Herald's rate over h2load's: at least 1.0 is the target.
        var rateRatio: Double { h2load.rate > 0 ? herald.rate / h2load.rate : 0 }
        /// Herald's CPU per request over h2load's: at most 1.3 is the target.
        var cpuRatio: Double { h2load.cpuPer100k > 0 ? herald.cpuPer100k / h2load.cpuPer100k : 0 }
    }

    var target: String
    var connections: Int
    var streams: Int
    var rounds: [Round] = []

    /// Median, lowest and highest of a per-round figure.
    func summary(_ figure: KeyPath<Round, Double>) -> (median: Double, min: Double, max: Double) {
        let values = rounds.map { $0[keyPath: figure] }.sorted()
        guard let first = values.first, let last = values.last else { return (0, 0, 0) }
        let mid = values.count / 2
        let median = values.count % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2
        return (median, first, last)
    }
}

/// A herald-mock-apns run with injected latency: the rate against connections x streams / latency.
struct LatencyRun {
    var connections: Int
    var streams: Int
    var latencyMs: Int
    var notifications: Int
    var rate: Double
    var ideal: Double
    var ok: Int
}

/// What one herald-apns-bench invocation measured, written as REPORT.md and REPORT.json.
struct BenchReport {
    var requests: Int
    var streams: Int
    var payloadBytes: Int
    var rounds: Int
    /// The host's 1-minute load average when the bench started, and its cores: both sides of each ratio ran on
    /// this host in the same run, so the ratios hold across hosts; these say how busy it was.
    var loadAverage: Double?
    var cores: Int
    var comparisons: [Comparison] = []
    var latencyRuns: [LatencyRun] = []

    static func loadAverage() -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8) else { return nil }
        return text.split(separator: " ").first.flatMap { Double($0) }
    }

    static func stamp() -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "yyyyMMdd-HHmmss"
        return f.string(from: Date())
    }

    func markdown() -> String {
        var lines = [
            "# herald-apns-bench",
            "",
            "\(requests) notifications of \(payloadBytes) bytes per run, \(streams) streams per connection, "
                + "\(rounds) rounds per line (Herald and h2load alternate); host: \(cores) cores, load average "
                + (loadAverage.map { String(format: "%.2f", $0) } ?? "unknown") + " at the start.",
            "",
            "Targets: rate ratio (Herald / h2load) at least 1.0, CPU ratio (Herald / h2load, CPU-s per request) at "
                + "most 1.3.",
            "",
            "| target | conns x streams | rate ratio (median, range) | CPU ratio (median, range) "
                + "| Herald req/s | h2load req/s | Herald CPU-s/100k | h2load CPU-s/100k "
                + "| server CPU-s/100k serving Herald | serving h2load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in comparisons {
            let rate = c.summary(\.rateRatio)
            let cpu = c.summary(\.cpuRatio)
            func list(_ f: (Comparison.Round) -> Double, _ format: String) -> String {
                c.rounds.map { String(format: format, f($0)) }.joined(separator: ", ")
            }
            lines.append(
                "| \(c.target) | \(c.connections) x \(c.streams) | "
                    + String(format: "%.2f (%.2f-%.2f)", rate.median, rate.min, rate.max) + " | "
                    + String(format: "%.2f (%.2f-%.2f)", cpu.median, cpu.min, cpu.max) + " | "
                    + list({ $0.herald.rate }, "%.0f") + " | " + list({ $0.h2load.rate }, "%.0f") + " | "
                    + list({ $0.herald.cpuPer100k }, "%.2f") + " | " + list({ $0.h2load.cpuPer100k }, "%.2f") + " | "
                    + list({ $0.herald.serverCPUPer100k }, "%.2f") + " | "
                    + list({ $0.h2load.serverCPUPer100k }, "%.2f") + " |")
        }
        if !latencyRuns.isEmpty {
            lines += [
                "", "| herald-mock-apns latency | conns x streams | Herald req/s | of conns x streams / latency |",
                "| --- | --- | --- | --- |",
            ]
            for l in latencyRuns {
                lines.append(
                    "| \(l.latencyMs) ms | \(l.connections) x \(l.streams) | "
                        + String(format: "%.0f | %.0f%% of %.0f |", l.rate, 100 * l.rate / l.ideal, l.ideal))
            }
        }
        return lines.joined(separator: "\n") + "\n"
    }

    func json() throws -> String {
        func figures(_ f: APNsBench.Figures) -> JSONValue {
            .sorted([
                "requests_per_second": .double(f.rate), "cpu_seconds_per_100k": .double(f.cpuPer100k),
                "ok": .int(f.ok), "server_cpu_seconds_per_100k": .double(f.serverCPUPer100k),
            ])
        }
        func summary(_ s: (median: Double, min: Double, max: Double)) -> JSONValue {
            .sorted(["median": .double(s.median), "min": .double(s.min), "max": .double(s.max)])
        }
        let comparisons: [JSONValue] = comparisons.map { c in
            .sorted([
                "target": .string(c.target), "connections": .int(c.connections), "streams": .int(c.streams),
                "rate_ratio": summary(c.summary(\.rateRatio)), "cpu_ratio": summary(c.summary(\.cpuRatio)),
                "rounds": .array(
                    c.rounds.map { r in
                        .sorted([
                            "herald": figures(r.herald), "h2load": figures(r.h2load),
                            "rate_ratio": .double(r.rateRatio), "cpu_ratio": .double(r.cpuRatio),
                        ])
                    }),
            ])
        }
        let latency: [JSONValue] = latencyRuns.map {
            .sorted([
                "connections": .int($0.connections), "streams": .int($0.streams), "latency_ms": .int($0.latencyMs),
                "notifications": .int($0.notifications), "requests_per_second": .double($0.rate),
                "ideal": .double($0.ideal), "ok": .int($0.ok),
            ])
        }
        let root: JSONValue = .sorted([
            "requests": .int(requests), "streams": .int(streams), "payload_bytes": .int(payloadBytes),
            "rounds": .int(rounds), "load_average": .double(loadAverage), "cores": .int(cores),
            "targets": .sorted(["rate_ratio_at_least": .double(1.0), "cpu_ratio_at_most": .double(1.3)]),
            "comparisons": .array(comparisons), "latency": .array(latency),
        ])
        return root.prettyPrinted + "\n"
    }
}
