// Every metric that Herald's alerts (deploy/prometheus/alerts.yml) and Grafana dashboard
// (deploy/grafana/dashboards/herald.json) query must be one the stages really export: read from a running
// stack's /metrics after traffic that makes every counter appear (deliveries, suppressions, a dead token, a
// dead letter).
import Foundation
import HeraldTestSupport
import Testing

@Suite(
    "Deployment: alert and dashboard metric names exist on a running stack", .serialized, .e2eStack,
    .timeLimit(.minutes(6)))
struct DeployMetricsTests {
    let stack: E2EStack
    init() throws { stack = try E2EStack.shared() }

    /// Metrics the dashboard charts that no stage exports yet. Empty: keep it so; the test fails once a listed name
    /// is exported, so an entry cannot linger.
    static let notYetExported: Set<String> = []
    /// Series Prometheus makes itself, not the stages.
    static let prometheusOwn: Set<String> = ["up"]

    static var repositoryRoot: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
    }

    @Test("the PromQL name extraction finds metrics and skips functions, labels, keywords and ranges")
    func extraction() {
        let names = PromQLNames.metrics(
            in: #"""
                sum by (stage, le) (rate(herald_stage_latency_seconds_bucket{stage=~"$stage", le!="+Inf"}[$__rate_interval]))
                  / on (stage) group_left sum(increase(herald_x_total[1h] offset 10m)) > bool 0.5 and up{job="herald"} == 0
                  or vector(0) unless label_values(herald_consumed_total, stage)
                """#)
        #expect(names == ["herald_stage_latency_seconds_bucket", "herald_x_total", "up", "herald_consumed_total"])
    }

    @Test("every metric the alerts and the dashboard query is exported by a running stage")
    func queriedMetricsAreExported() async throws {
        let queried = try Self.queriedMetricNames()
        // The alerts and the dashboard cover lag, DLQ, provider answers, dead tokens, readiness, in-flight and cost.
        for expected in [
            "herald_consumer_lag", "herald_dlq_total", "herald_apns_responses_total", "herald_token_feedback_total",
            "herald_ready", "herald_in_flight", "herald_stage_latency_seconds_bucket", "herald_suppressed_total",
            "process_cpu_seconds_total", "process_resident_memory_bytes",
        ] {
            #expect(queried.contains(expected), "\(expected) is not queried any more: update this test")
        }

        // Traffic that makes every counter appear: deliveries, suppressions, a dead token, an invalid event.
        for app in ["app1", "app2", "app3"] {
            let path = try stack.write("deploy-state-\(app).json", Scenarios.fixture(app))
            let r = try await stack.heraldctl(["state", "load", path, "--app", app])
            try #require(r.status == 0, "heraldctl state load \(app): \(r.stderr)")
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try await stack.publish([
            Scenarios.message(Scenarios.id("deploy-group"), conversation: "g1", createdAt: now),
            Scenarios.message(
                Scenarios.id("deploy-dnd"), conversation: "d8", type: "direct", recipients: ["r8"], createdAt: now),
            Scenarios.message(
                Scenarios.id("deploy-dead"), conversation: "ddt-deploy", type: "direct", recipients: ["dt"],
                createdAt: now),
            #"{"event_id": "deploy-invalid", "app_id": "app1", "kind": "message"}"#,
        ])
        let wanted = queried.subtracting(Self.prometheusOwn).subtracting(Self.notYetExported)
        var exported: Set<String> = []
        func missing() async -> [String] {
            exported = []
            for stage in E2EStack.stages {
                guard let port = try? stack.stageEnvironment(stage)["HERALD_METRICS_PORT"].flatMap(Int.init),
                    let answer = try? await TestHTTP.request(port: port, method: "GET", path: "/metrics"),
                    answer.status == 200
                else { continue }
                exported.formUnion(PromExposition.sampleNames(answer.body))
            }
            return wanted.subtracting(exported).sorted()
        }
        // Everything but the retry counter: that one needs APNs to fail past the client's own retries.
        _ = await eventually(timeout: .seconds(60), interval: .milliseconds(500)) {
            await missing() == ["herald_retries_total"]
        }
        // Then the stand-in answers every request 503: send schedules a retry through herald.retry.
        try await stack.startMock(extra: ["--rate-503", "1"])
        try await stack.publish([Scenarios.message(Scenarios.id("deploy-retry"), conversation: "g1", createdAt: now)])
        let found = await eventually(timeout: .seconds(60), interval: .milliseconds(500)) { await missing().isEmpty }
        let left = await missing()
        try await stack.startMock()
        #expect(found, "queried by deploy/prometheus/alerts.yml or the dashboard, exported by no stage: \(left)")
        let nowExported = Self.notYetExported.intersection(exported)
        #expect(nowExported.isEmpty, "\(nowExported.sorted()) are exported now: remove them from notYetExported")
        #expect(Self.notYetExported.isSubset(of: queried), "notYetExported lists names nothing queries")
    }

    @Test("heraldctl status reads readiness, lag, in-flight and rates from every stage; progress lines off a terminal")
    func operatorCommands() async throws {
        // state load off a terminal: plain progress lines on stderr, the JSON summary on stdout.
        let path = try stack.write("deploy-state-app1.json", Scenarios.fixture("app1"))
        let load = try await stack.heraldctl(["state", "load", path, "--app", "app1", "--batch", "3"])
        try #require(load.status == 0, "\(load.stderr)")
        let summary = try #require(load.lines.first)
        let entries = (summary["users"] as? Int ?? 0) + (summary["conversations"] as? Int ?? 0)
        #expect(entries > 3)
        let progress = load.stderr.split(separator: "\n").map(String.init)
        #expect(progress.last == "state load: \(entries)/\(entries) (100%)", "\(load.stderr)")
        #expect(!load.stderr.contains("\r"), "a bar was drawn on a pipe")

        let endpoints = try E2EStack.stages.map { stage -> String in
            let port = try #require(try stack.stageEnvironment(stage)["HERALD_METRICS_PORT"])
            return "http://127.0.0.1:\(port)"
        }
        // Rates need traffic between the two reads: publish a few events every half second while status watches,
        // and watch again until a window saw ingest consume (a busy host may delay the first records past one).
        let running = stack
        let publishing = Task {
            var round = 0
            while !Task.isCancelled {
                let now = Int64(Date().timeIntervalSince1970 * 1000)
                try await running.publish(
                    (0..<5).map {
                        Scenarios.message(
                            Scenarios.id("deploy-status-\(round)-\($0)"), conversation: "g1", createdAt: now)
                    })
                round += 1
                try await Task.sleep(for: .milliseconds(500))
            }
        }
        var status = try await stack.heraldctl(["status", "--json", "--interval", "4"] + endpoints)
        var ingestRate = 0.0
        for _ in 0..<10 {
            ingestRate = (status.lines.first?["rates_per_second"] as? [String: Any])?["in"] as? Double ?? 0
            if ingestRate > 0 || status.status != 0 { break }
            status = try await stack.heraldctl(["status", "--json", "--interval", "4"] + endpoints)
        }
        publishing.cancel()
        _ = try? await publishing.value
        #expect(status.status == 0, "\(status.stdout)\n\(status.stderr)")
        let reports = status.lines
        #expect(reports.map { $0["stage"] as? String } == E2EStack.stages, "\(status.stdout)")
        for report in reports {
            #expect(report["ready"] as? Bool == true && report["reachable"] as? Bool == true, "\(report)")
            #expect(report["lag"] is Int && report["in_flight"] is Int, "\(report)")
        }
        #expect(ingestRate > 0, "ingest consumed nothing while status watched: \(status.stdout)")

        // An endpoint that does not answer: reported unreachable, exit status 1; the table names it.
        let dead = try freePort()
        let down = try await stack.heraldctl(["status", "--interval", "0.2", endpoints[0], "http://127.0.0.1:\(dead)"])
        #expect(down.status == 1)
        let rows = down.stdout.split(separator: "\n")
        #expect(
            rows.count == 3 && rows[0].hasPrefix("STAGE") && rows[1].hasPrefix("ingest") && rows[1].hasSuffix("ready")
                && rows[2].hasSuffix("unreachable"), "\(down.stdout)")
    }

    /// Metric names in the alert expressions and in the dashboard's queries and template variables.
    static func queriedMetricNames() throws -> Set<String> {
        var expressions: [String] = []
        let alerts = try String(contentsOfFile: repositoryRoot + "/deploy/prometheus/alerts.yml", encoding: .utf8)
        // `expr: <one line>` or `expr: |` followed by the more indented lines of the block.
        let lines = alerts.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        var i = 0
        while i < lines.count {
            let line = lines[i]
            if let range = line.range(of: "expr:") {
                let rest = line[range.upperBound...].trimmingCharacters(in: .whitespaces)
                if rest == "|" || rest == ">" {
                    let indent = line.prefix { $0 == " " }.count
                    var block: [String] = []
                    i += 1
                    while i < lines.count,
                        lines[i].trimmingCharacters(in: .whitespaces).isEmpty
                            || lines[i].prefix(while: { $0 == " " }).count > indent
                    {
                        block.append(lines[i])
                        i += 1
                    }
                    expressions.append(block.joined(separator: "\n"))
                    continue
                }
                expressions.append(rest)
            }
            i += 1
        }
        let data = try Data(contentsOf: URL(fileURLWithPath: repositoryRoot + "/deploy/grafana/dashboards/herald.json"))
        func walk(_ value: Any) {
            if let o = value as? [String: Any] {
                for (key, v) in o {
                    if key == "expr" || key == "definition", let s = v as? String {
                        expressions.append(s)
                    } else {
                        walk(v)
                    }
                }
            } else if let a = value as? [Any] {
                a.forEach(walk)
            }
        }
        walk(try JSONSerialization.jsonObject(with: data))
        #expect(expressions.count >= 15, "found only \(expressions.count) expressions")
        return Set(expressions.flatMap(PromQLNames.metrics(in:)))
    }
}

/// Metric names in a PromQL expression (enough PromQL for Herald's own queries).
enum PromQLNames {
    static let keywords: Set<String> = [
        "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
        "group_right", "offset", "bool", "inf", "nan",
    ]

    static func metrics(in expression: String) -> [String] {
        var s = expression
        // label_values(metric, label): only the metric.
        s = s.replacingOccurrences(
            of: #"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,[^)]*\)"#, with: " $1 ",
            options: .regularExpression)
        for pattern in [
            #""(?:[^"\\]|\\.)*""#, #"'(?:[^'\\]|\\.)*'"#, #"\{[^}]*\}"#, #"\[[^\]]*\]"#,
            #"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"#,
        ] {
            s = s.replacingOccurrences(of: pattern, with: " ", options: .regularExpression)
        }
        var names: [String] = []
        let regex = try! NSRegularExpression(pattern: #"[A-Za-z0-9_:.$]+(\s*\()?"#)
        for match in regex.matches(in: s, range: NSRange(s.startIndex..., in: s)) {
            let token = String(s[Range(match.range, in: s)!])
            if token.hasSuffix("(") { continue }  // a function or an aggregation
            guard let first = token.first, first.isLetter || first == "_" || first == ":" else { continue }
            if token.contains("$") || token.contains(".") || keywords.contains(token.lowercased()) { continue }
            if !names.contains(token) { names.append(token) }
        }
        return names
    }
}

/// Sample names in a Prometheus text exposition.
enum PromExposition {
    static func sampleNames(_ body: String) -> Set<String> {
        var names: Set<String> = []
        for line in body.split(separator: "\n") where !line.hasPrefix("#") {
            let name = line.prefix { $0 != "{" && $0 != " " }
            if !name.isEmpty { names.insert(String(name)) }
        }
        return names
    }
}
