// The pipeline benchmark, reduced to a few seconds, so it cannot rot: `herald-bench pipeline` starts its own
// local stack (scripts/local-stack.sh --up on free ports, the built executables of HERALD_BIN_DIR), loads users,
// publishes a small backlog and writes its report. Asserted: the report's structure and that the counts add
// up (delivered + suppressed = recipients, suppressions as predicted, nothing lost or duplicated). Never a speed.
// A second run checks what a groups-of-5 backlog leaves in Redis per notification: memory, not time.
import Foundation
import HeraldTestSupport
import Testing

@Suite(.serialized) struct BenchSmokeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// Runs `herald-bench` with `arguments` (plus the repo, run and report directories) off the cooperative pool;
    /// returns its exit status, its output and the report directory.
    func runBench(_ name: String, _ arguments: [String]) async throws -> (Int32, String, String) {
        let root = Self.root
        let env = ProcessInfo.processInfo.environment
        let bin = env["HERALD_BIN_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? root + "/.build/debug"
        let bench = bin + "/herald-bench"
        #expect(FileManager.default.isExecutableFile(atPath: bench), "missing \(bench): run swift build first")
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(getpid())").path
        try? FileManager.default.removeItem(atPath: out)
        let arguments = arguments + ["--repo", root, "--run-dir", out + "/run", "--out", out]
        let log = out + ".log"
        // The bench runs for tens of seconds: wait for it off the cooperative pool (2 threads on this machine), so
        // the suites running beside it are not starved.
        let status = try await offPool { () throws -> Int32 in
            guard FileManager.default.createFile(atPath: log, contents: nil) else {
                throw TestSupportError("cannot create \(log)")
            }
            let p = try SpawnedProcess(
                bench, arguments, environment: ["HERALD_LOCAL_BIN": bin], stdout: .file(log), stderr: .toStandardOutput)
            return p.waitForExit()
        }
        let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        return (status, output, out)
    }

    @Test func pipelineBenchReportIsCompleteAndItsCountsAreConsistent() async throws {
        let (status, output, out) = try await runBench(
            "herald-bench-smoke",
            [
                "pipeline", "--backlog", "300", "--users", "600", "--conversation-size", "6",
                "--dnd", "0.15", "--muted", "0.15", "--online", "0.15", "--mixed", "--mixed-rate", "5",
                "--drain-timeout", "30", "--check",
            ])
        #expect(status == 0, "herald-bench pipeline failed:\n\(output.suffix(4000))")

        let md = try String(contentsOfFile: out + "/REPORT.md", encoding: .utf8)
        for heading in [
            "## Scenario", "## Results", "## Latency by kind", "## Processes", "## Suppressions by reason",
            "## Consistency", "## Over time",
        ] {
            #expect(md.contains(heading), "REPORT.md lacks \(heading)")
        }
        for row in [
            "herald-ingest", "herald-send", "**Herald (six stages)**", "broker", "Redis", "APNs stand-in",
        ] {
            #expect(md.contains("| \(row) |"), "REPORT.md lacks the \(row) row")
        }
        let svg = try String(contentsOfFile: out + "/REPORT.svg", encoding: .utf8)
        #expect(svg.hasPrefix("<svg") && svg.contains("<polyline") && svg.hasSuffix("</svg>\n"))

        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: out + "/REPORT.json")))
                as? [String: Any])
        let delivered = try #require(json["delivered"] as? Int)
        let expected = try #require(json["expected"] as? Int)
        let recipients = try #require(json["recipients"] as? Int)
        let suppressed = try #require(json["suppressed"] as? [String: Int])
        let predicted = try #require(json["suppressed_predicted"] as? [String: Int])
        #expect(delivered > 0)
        #expect(delivered == expected)
        #expect(delivered + suppressed.values.reduce(0, +) + (json["render_errors"] as? Int ?? -1) == recipients)
        #expect(suppressed == predicted)
        #expect(
            Set(suppressed.keys) == ["dnd", "muted", "online"], "the mix produces all three reasons: \(suppressed)")
        #expect(json["lost"] as? Int == 0)
        #expect(json["duplicated"] as? Int == 0)
        #expect(json["unexpected"] as? Int == 0)
        #expect(json["consistent"] as? Bool == true)
        let latency = try #require(json["latency_ms"] as? [String: Any])
        #expect(latency["count"] as? Int == delivered)
        let p50 = try #require(latency["p50_ms"] as? Int), p99 = try #require(latency["p99_ms"] as? Int)
        #expect(p50 <= p99)
        let kinds = try #require(json["latency_by_kind_ms"] as? [String: Any])
        #expect(Set(kinds.keys) == ["group", "call", "direct"], "mixed priorities report each kind: \(kinds.keys)")
        let processes = try #require(json["processes"] as? [String: [String: Any]])
        #expect(
            Set(processes.keys) == [
                "ingest", "resolve", "suppress", "render", "send", "registry", "kafka", "redis", "mock-apns",
            ])
        for (name, p) in processes {
            #expect((p["peak_rss_kb"] as? Int ?? 0) > 0, "\(name) has no peak RSS")
        }
        #expect(((json["herald"] as? [String: Any])?["cpu_seconds"] as? Double ?? 0) > 0)
        // The host's speed, measured before and after the run, so figures of different days can be scaled.
        let host = try #require(json["host_recipients_per_cpu_second"] as? [String: Double])
        #expect((host["before"] ?? 0) > 1000 && (host["after"] ?? 0) > 1000, "host speed: \(host)")
        #expect(md.contains("host speed (herald-bench decide"))
        // Herald's own time per hop, per stage, in its two parts.
        #expect(md.contains("## Time per hop"))
        let hops = try #require(json["hops"] as? [String: [String: Any]])
        #expect(Set(hops.keys) == ["ingest", "resolve", "suppress", "render", "send"], "\(hops.keys)")
        for (stage, hop) in hops {
            #expect((hop["records"] as? Int ?? 0) > 0, "\(stage): \(hop)")
            for part in ["total", "processing", "ack_wait"] {
                let q = try #require(hop[part] as? [String: Double], "\(stage) lacks \(part)")
                #expect((q["p50_ms"] ?? -1) <= (q["p99_ms"] ?? -2), "\(stage) \(part): \(q)")
            }
        }
        let series = try #require(json["series"] as? [[String: Any]])
        #expect(series.map { $0["delivered"] as? Int ?? 0 }.reduce(0, +) == delivered)
        // Redis's footprint of the run is reported.
        let redis = try #require(json["redis"] as? [String: Any])
        #expect((redis["commands_per_notification"] as? Double ?? 0) > 0, "\(redis)")
        // Its clients' round trips: at least one, and never more reads than commands (a read carries a pipeline).
        let reads = redis["reads"] as? Int ?? 0
        #expect(reads > 0 && reads <= (redis["commands"] as? Int ?? 0), "\(redis)")
        #expect(md.contains("| Redis reads and writes per notification"))
        #expect(md.contains("| Redis memory retained per notification"))
        #expect(output.contains("Redis per notification"))
        // The stack the bench started is gone.
        #expect(!FileManager.default.fileExists(atPath: out + "/run/send.pid"))
    }

    /// `herald-bench stage send`, reduced: the stages upstream of send make its backlog and stop, send drains it
    /// alone. Asserted: the report's structure, that every input was accounted for (0 lost, nothing duplicated) and
    /// that the suppressions on the way match the prediction. Never a speed.
    @Test func stageBenchFeedsSendAloneAndAccountsForEveryInput() async throws {
        let (status, output, out) = try await runBench(
            "herald-bench-stage",
            [
                "stage", "send", "--backlog", "300", "--users", "600", "--conversation-size", "5",
                "--drain-timeout", "30", "--check",
            ])
        #expect(status == 0, "herald-bench stage failed:\n\(output.suffix(4000))")
        let md = try String(contentsOfFile: out + "/REPORT.md", encoding: .utf8)
        for heading in ["# herald-bench stage send", "## Scenario", "## Results", "## Accounting", "## Method"] {
            #expect(md.contains(heading), "REPORT.md lacks \(heading)")
        }
        #expect(md.contains("host speed (herald-bench decide"))
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: out + "/REPORT.json")))
                as? [String: Any])
        #expect(json["stage"] as? String == "send")
        let notifications = try #require(json["notifications"] as? Int)
        let inputs = try #require(json["inputs"] as? Int)
        #expect(notifications > 0)
        #expect(inputs == notifications, "one outbound record per notification")
        #expect(json["consumed"] as? Int == inputs)
        #expect(json["outputs"] as? Int == notifications, "every notification answered 200 by the stand-in")
        #expect(json["expected"] as? Int == inputs)
        #expect(json["lost"] as? Int == 0)
        #expect(json["duplicated"] as? Int == 0)
        #expect(json["unexpected"] as? Int == 0)
        #expect(json["consistent"] as? Bool == true, "\(json["problems"] ?? "")")
        let through = try #require(json["suppressed_through_stage"] as? [String: Int])
        #expect(through == json["suppressed_predicted"] as? [String: Int])
        #expect(
            (json["recipients"] as? Int) == notifications + through.values.reduce(0, +),
            "recipients = notifications + suppressed on the way")
        // A reduced backlog may be drained before the first sample: the stage is then measured from its start.
        #expect(json["measured_from_start"] is Bool)
        #expect((json["cpu_seconds"] as? Double ?? 0) > 0)
        #expect((json["notifications_per_cpu_second"] as? Double ?? 0) > 0)
        #expect((json["multiple_of_core"] as? Double ?? 0) > 0)
        #expect((json["peak_rss_kb"] as? Int ?? 0) > 0)
        let hop = try #require(json["hop"] as? [String: Any])
        for part in ["total", "processing", "ack_wait"] {
            let q = try #require(hop[part] as? [String: Double], "hop lacks \(part)")
            #expect((q["p50_ms"] ?? -1) <= (q["p99_ms"] ?? -2), "\(part): \(q)")
        }
        #expect(!FileManager.default.fileExists(atPath: out + "/run/send.pid"))
    }

    /// What Redis keeps per notification: on a groups-of-5 backlog at the default preference mix, `used_memory`
    /// after the drain minus before (taken once the users' state is loaded), divided by the recipients decided.
    /// The layout before the compact records kept about 950 bytes here; the compact one about 52 at 20,000 events
    /// (docs/performance.md, "Redis footprint"). This smaller run carries more of the fixed per-shard keys per
    /// notification, so it is held to 100 bytes.
    @Test func groupsOfFiveBacklogRetainsAtMost100BytesOfRedisPerNotification() async throws {
        let (status, output, out) = try await runBench(
            "herald-bench-footprint",
            [
                "pipeline", "--backlog", "6000", "--users", "6000", "--conversation-size", "5", "--drain-timeout", "60",
                "--check",
            ])
        #expect(status == 0, "herald-bench pipeline failed:\n\(output.suffix(4000))")
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: out + "/REPORT.json")))
                as? [String: Any])
        let recipients = try #require(json["recipients"] as? Int)
        #expect(recipients == 6000 * 4, "every event reaches the 4 other members")
        #expect(json["lost"] as? Int == 0 && json["duplicated"] as? Int == 0)
        let redis = try #require(json["redis"] as? [String: Any])
        let retained = try #require(redis["retained_bytes_per_notification"] as? Double)
        #expect(retained > 0 && retained <= 100, "Redis kept \(retained) bytes per notification: \(redis)")
        #expect(!FileManager.default.fileExists(atPath: out + "/run/send.pid"))
    }
}
