import CoreMetrics
import HeraldCore
import Metrics
import Prometheus
import Synchronization

/// A Prometheus duration histogram that takes a batch's records in one step: every record of a batch counts once
/// with the batch's time, so `record(_:count:)` adds `count` observations of one value under one lock. (Recorded
/// through swift-metrics, each observation takes the histogram's lock and walks its buckets: four histograms per
/// record were 2-3 % of a stage's CPU.) `/metrics` shows it in the registry's text format, after the registry's own
/// series (`HeraldMetrics.emit(_:)`).
final class CountedHistogram: Sendable {
    struct State {
        /// Observations per bucket, not cumulative: `bounds[i - 1] < value <= bounds[i]`; the last is `+Inf`'s own.
        var buckets: [Int]
        var sum: Duration = .zero
        var count = 0
    }

    let name: String
    /// The series' labels as written between the braces (`stage="send",lane="bulk"`).
    let labels: String
    let bounds: [Duration]
    private let state: Mutex<State>

    /// Each line's text up to its value (`<name>_bucket{<labels>,le="0.005"} `; the last is `+Inf`'s), then the
    /// sum's and the count's: written once, so a scrape appends bytes and numbers and makes no string per line.
    private let bucketHeads: [[UInt8]]
    private let sumHead: [UInt8]
    private let countHead: [UInt8]

    init(name: String, labels: [(String, String)], bounds: [Duration]) {
        self.name = name
        let labels = labels.map { "\($0.0)=\"\(Self.escaped($0.1))\"" }.joined(separator: ",")
        self.labels = labels
        self.bounds = bounds
        self.state = Mutex(State(buckets: [Int](repeating: 0, count: bounds.count + 1)))
        let prefix = labels.isEmpty ? "" : labels + ","
        bucketHeads = (bounds.map(\.bucketRepresentation) + ["+Inf"]).map {
            Array("\(name)_bucket{\(prefix)le=\"\($0)\"} ".utf8)
        }
        let braces = labels.isEmpty ? "" : "{\(labels)}"
        sumHead = Array("\(name)_sum\(braces) ".utf8)
        countHead = Array("\(name)_count\(braces) ".utf8)
    }

    /// `count` observations of `value`.
    func record(_ value: Duration, count: Int) {
        guard count > 0 else { return }
        let bucket = bounds.firstIndex { value <= $0 } ?? bounds.count
        state.withLock { s in
            s.buckets[bucket] += count
            s.sum += value * count
            s.count += count
        }
    }

    /// The series' lines: cumulative buckets, `+Inf`, sum and count (the `# TYPE` line is the caller's).
    func emit(into buffer: inout [UInt8]) {
        let s = state.withLock { $0 }
        var cumulative = 0
        for index in bounds.indices {
            cumulative += s.buckets[index]
            Self.appendLine(bucketHeads[index], cumulative, to: &buffer)
        }
        Self.appendLine(bucketHeads[bounds.count], s.count, to: &buffer)
        buffer.append(contentsOf: sumHead)
        buffer.append(contentsOf: s.sum.bucketRepresentation.utf8)
        buffer.append(10)
        Self.appendLine(countHead, s.count, to: &buffer)
    }

    /// `head`, `value` in decimal and a newline, without making a string.
    private static func appendLine(_ head: [UInt8], _ value: Int, to buffer: inout [UInt8]) {
        buffer.append(contentsOf: head)
        DecimalASCII.append(Int64(value), to: &buffer)
        buffer.append(10)
    }

    static func escaped(_ value: String) -> String {
        var out = ""
        for character in value {
            switch character {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(character)
            }
        }
        return out
    }
}

/// The counted histograms made for one registry, by name and labels (asking again for a series gives the same one,
/// as the registry does for its own).
final class CountedHistograms: Sendable {
    private let series = Mutex<[String: [CountedHistogram]]>([:])

    func histogram(name: String, labels: [(String, String)], bounds: [Duration]) -> CountedHistogram {
        let made = CountedHistogram(name: name, labels: labels, bounds: bounds)
        return series.withLock { byName in
            if let existing = byName[name]?.first(where: { $0.labels == made.labels }) { return existing }
            byName[name, default: []].append(made)
            return made
        }
    }

    func emit(into buffer: inout [UInt8]) {
        let byName = series.withLock { $0 }
        for name in byName.keys.sorted() {
            buffer.append(contentsOf: "# TYPE \(name) histogram\n".utf8)
            for histogram in byName[name] ?? [] { histogram.emit(into: &buffer) }
        }
    }
}

/// A stage's duration histogram fed a batch at a time: a `CountedHistogram` when the metrics go to a Prometheus
/// registry, else (a test's own metrics factory) a swift-metrics timer recorded once per observation.
struct BatchTimer: Sendable {
    private let counted: CountedHistogram?
    private let timer: Metrics.Timer?

    init(label: String, dimensions: [(String, String)], factory: any MetricsFactory) {
        if let prometheus = factory as? PrometheusMetricsFactory {
            counted = HeraldMetrics.counted(for: prometheus.registry).histogram(
                name: label, labels: dimensions, bounds: HeraldMetrics.latencyBuckets)
            timer = nil
        } else {
            counted = nil
            timer = Metrics.Timer(label: label, dimensions: dimensions, factory: factory)
        }
    }

    /// `count` observations of `duration`.
    func record(_ duration: Duration, count: Int = 1) {
        if let counted {
            counted.record(duration, count: count)
        } else if let timer {
            for _ in 0..<max(0, count) { timer.record(duration: duration) }
        }
    }
}
