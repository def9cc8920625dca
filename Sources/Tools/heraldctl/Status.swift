import ArgumentParser
import Foundation
import HeraldCore
import HeraldToolSupport

/// `heraldctl status`: each stage's readiness, consumer lag, in-flight work and rates, read from the stages' own
/// HTTP endpoints (`/readyz`, and `/metrics` twice, `--interval` apart, for the rates).
struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show each stage's readiness, consumer lag, in-flight work and rates from its HTTP endpoint.",
        discussion: """
            Give the stages' endpoints (http://HOST:PORT, e.g. one per pod behind `kubectl port-forward`); else \
            $HERALD_STAGE_ENDPOINTS (comma separated; scripts/local-stack.sh prints the line to export); else the \
            six stages on 127.0.0.1 at their default metrics ports, 9101 to 9106 (--local-base N: N+1 to N+6). \
            Rates are per second over --interval. Exits 1 when an endpoint is unreachable or a stage is not ready.
            """)

    @Argument(help: "Stage endpoints, http://HOST:PORT (default: $HERALD_STAGE_ENDPOINTS, else 127.0.0.1:9101-9106).")
    var endpoints: [String] = []

    @Option(
        name: .customLong("local-base"),
        help: "The six stages on 127.0.0.1, ports N+1 to N+6 (ingest, resolve, suppress, render, send, registry).")
    var localBase: Int?

    /// The stages' default metrics ports are 9101 to 9106 (pipeline `stages.<stage>.metrics_port`).
    static let defaultBase = 9100
    /// The variable the local stack's export line sets; the stages know it and do not warn about it.
    static let endpointsVariable = "HERALD_STAGE_ENDPOINTS"

    @Option(name: .long, help: "Seconds between the two /metrics reads the rates come from.")
    var interval: Double = 2

    @Option(name: .long, help: "Seconds to wait for an endpoint's answer.")
    var timeout: Int = 3

    @Flag(name: .long, help: "One JSON object per endpoint instead of a table.")
    var json = false

    static let localStages = ["ingest", "resolve", "suppress", "render", "send", "registry"]

    func validate() throws {
        guard interval > 0, interval <= 60 else { throw ValidationError("--interval: between 0 and 60 seconds") }
        guard timeout > 0 else { throw ValidationError("--timeout: a positive number of seconds") }
        for e in endpoints + environmentEndpoints where StageEndpoint(url: e) == nil {
            throw ValidationError("not an http://HOST:PORT endpoint: \(e)")
        }
    }

    /// $HERALD_STAGE_ENDPOINTS, split at commas (empty when unset or when endpoints are given).
    var environmentEndpoints: [String] {
        guard endpoints.isEmpty, localBase == nil,
            let raw = ProcessInfo.processInfo.environment[Self.endpointsVariable]
        else { return [] }
        return raw.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    func run() async throws {
        var targets: [(name: String?, endpoint: StageEndpoint)] = (endpoints + environmentEndpoints).compactMap { e in
            StageEndpoint(url: e).map { (name: String?.none, endpoint: $0) }
        }
        if targets.isEmpty {
            let base = localBase ?? Self.defaultBase
            targets = Self.localStages.enumerated().map { i, stage in
                (stage, StageEndpoint(host: "127.0.0.1", port: base + i + 1))
            }
        }
        let interval = self.interval
        let timeout = self.timeout
        let chosen = targets
        let reports = await withTaskGroup(of: (Int, StageReport).self) { group in
            for (i, target) in chosen.enumerated() {
                group.addTask {
                    (
                        i,
                        await StageReport.read(
                            target.endpoint, expectedStage: target.name, interval: interval, timeout: timeout)
                    )
                }
            }
            var out: [(Int, StageReport)] = []
            for await r in group { out.append(r) }
            return out.sorted { $0.0 < $1.0 }.map(\.1)
        }
        if json {
            for r in reports { CLI.out(r.json.serialized) }
        } else {
            for line in StageReport.table(reports) { CLI.out(line) }
        }
        if reports.contains(where: { !$0.ready }) { throw ExitCode(1) }
    }
}

/// One stage endpoint, http://HOST:PORT.
struct StageEndpoint: Sendable, CustomStringConvertible {
    var address: ServiceEndpoint

    init(host: String, port: Int) { address = ServiceEndpoint(host: host, port: port) }

    /// `http://HOST:PORT`, `http://[v6]:PORT` or the same without `http://`; a path after the port is ignored. Nil
    /// without a port.
    init?(url: String) {
        var rest = Substring(url)
        if rest.hasPrefix("http://") { rest = rest.dropFirst(7) }
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        // A port is required: `host` and `[v6]` alone would get ServiceEndpoint's default port.
        guard rest.contains(":"), rest.last != "]", let parsed = ServiceEndpoint(parsing: String(rest)) else {
            return nil
        }
        address = parsed
    }

    var description: String { "http://\(address)" }

    /// GET `path`: status and body, or nil when the endpoint cannot be reached or answers nonsense.
    func get(_ path: String, timeout: Int) -> HTTPProbe.Answer? {
        HTTPProbe.request(address, path: path, timeout: timeout)
    }
}

extension MetricSamples {
    /// The `stage` label Herald puts on its series.
    var stage: String? {
        samples.first { $0.name.hasPrefix("herald_") && $0.labels["stage"] != nil }?.labels["stage"]
    }
}

/// What `heraldctl status` shows for one endpoint.
struct StageReport: Sendable {
    static let rateMetrics: [(key: String, metric: String)] = [
        ("in", "herald_consumed_total"), ("out", "herald_produced_total"), ("suppressed", "herald_suppressed_total"),
        ("dlq", "herald_dlq_total"), ("provider_answers", "herald_apns_responses_total"),
    ]

    var endpoint: String
    var stage: String
    var reachable: Bool
    var ready: Bool
    var failing: [String]
    var lag: Double?
    var inFlight: Double?
    /// Per second over the interval, by `rateMetrics` key.
    var rates: [String: Double]

    static func read(
        _ endpoint: StageEndpoint, expectedStage: String?, interval: Double, timeout: Int
    ) async -> StageReport {
        var report = StageReport(
            endpoint: endpoint.description, stage: expectedStage ?? "?", reachable: false, ready: false,
            failing: [], lag: nil, inFlight: nil, rates: [:])
        let clock = ContinuousClock()
        let t0 = clock.now
        guard let first = await fetch(endpoint, "/metrics", timeout), first.status == 200 else { return report }
        try? await Task.sleep(for: .milliseconds(Int(interval * 1000)))
        let t1 = clock.now
        guard let second = await fetch(endpoint, "/metrics", timeout), second.status == 200 else { return report }
        report.reachable = true
        let before = MetricSamples(first.body)
        let after = MetricSamples(second.body)
        if let stage = after.stage { report.stage = stage }
        report.lag = after.sum("herald_consumer_lag")
        report.inFlight = after.sum("herald_in_flight")
        let seconds = Double((t1 - t0).components.seconds) + Double((t1 - t0).components.attoseconds) / 1e18
        for (key, metric) in rateMetrics {
            guard let now = after.sum(metric) else { continue }
            report.rates[key] = max(0, now - (before.sum(metric) ?? 0)) / max(seconds, 0.001)
        }
        if let readyz = await fetch(endpoint, "/readyz", timeout) {
            report.ready = readyz.status == 200
            if let o = try? JSONValue.parse(readyz.body), case .array(let failing)? = o["failing"] {
                report.failing = failing.compactMap(\.stringValue)
            }
        }
        return report
    }

    private static func fetch(
        _ endpoint: StageEndpoint, _ path: String, _ timeout: Int
    ) async -> HTTPProbe.Answer? {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: endpoint.get(path, timeout: timeout)) }.start()
        }
    }

    var readiness: String {
        if !reachable { return "unreachable" }
        return ready ? "ready" : "NOT READY" + (failing.isEmpty ? "" : " (\(failing.joined(separator: ", ")))")
    }

    var json: JSONValue {
        .sorted([
            "endpoint": .string(endpoint), "stage": .string(stage), "reachable": .bool(reachable),
            "ready": .bool(ready), "failing": .strings(failing), "lag": .int(lag.map { Int($0) }),
            "in_flight": .int(inFlight.map { Int($0) }),
            "rates_per_second": .sorted(rates.mapValues { .double(($0 * 100).rounded() / 100) }),
        ])
    }

    static func table(_ reports: [StageReport]) -> [String] {
        func number(_ v: Double?) -> String { v.map { String(Int($0)) } ?? "-" }
        func rate(_ v: Double?) -> String { v.map { String(format: "%.1f", $0) } ?? "-" }
        let header = [
            "STAGE", "ENDPOINT", "LAG", "IN FLIGHT", "IN/s", "OUT/s", "SUPPRESSED/s", "DLQ/s", "APNS/s", "READINESS",
        ]
        var rows = [header]
        for r in reports {
            rows.append([
                r.stage, r.endpoint, number(r.lag), number(r.inFlight), rate(r.rates["in"]), rate(r.rates["out"]),
                rate(r.rates["suppressed"]), rate(r.rates["dlq"]), rate(r.rates["provider_answers"]), r.readiness,
            ])
        }
        let widths = header.indices.map { c in rows.map { $0[c].count }.max() ?? 0 }
        return rows.map { row in
            row.enumerated().map { c, cell in
                c == row.count - 1 ? cell : cell.padding(toLength: widths[c], withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }
    }
}
