// The pipeline bench's report: Markdown for people, JSON for tools, and an SVG plot of
// throughput and latency over time (drawn here, no plotting library).
import Foundation
import HeraldBenchSupport
import HeraldCore
import HeraldToolSupport

/// The decision core's cost in a run: herald-bench decide's recipients per CPU-second on one thread, taken before
/// and after the run. Herald's CPU per notification divided by the core's per recipient is a ratio that holds on
/// any host, because both sides are measured in the same run with the same build (CPU-seconds per 100k from
/// different days compare only after scaling by it).
struct CoreMarker {
    var before: Double?
    var after: Double?

    /// One second of the decide benchmark (`DecideWorkload.hostRecipientsPerCPUSecond`).
    static func measure() -> Double? { DecideWorkload.hostRecipientsPerCPUSecond() }

    /// The decision core's CPU time per recipient (decided and rendered on one thread); nil without a marker.
    var secondsPerRecipient: Double? {
        let speeds = [before, after].compactMap { $0 }.filter { $0 > 0 }
        guard !speeds.isEmpty else { return nil }
        return Double(speeds.count) / speeds.reduce(0, +)
    }

    /// `cpuSeconds` per notification as a multiple of the core's cost per recipient.
    func multiple(cpuSeconds: Double, notifications: Double) -> Double? {
        guard let core = secondsPerRecipient, notifications > 0 else { return nil }
        return cpuSeconds / notifications / core
    }

    var line: String {
        func f(_ v: Double?) -> String { v.map { String(format: "%.0f", $0) } ?? "-" }
        return "host speed (herald-bench decide, recipients per CPU-second, one thread): before \(f(before)), "
            + "after \(f(after))"
    }
}

struct BenchReport {
    let result: LoadDriver.Result
    let command: String
    /// The host's speed before and after the run, and the decision core's cost per recipient from it.
    var core = CoreMarker()

    var hostSpeedLine: String { core.line }

    static let heraldProcesses = stageNames

    /// The six stages' CPU per delivered notification as a multiple of the decision core's cost per recipient: what
    /// the pipeline adds around the decision (records, broker clients, Redis, HTTP/2), independent of the host's
    /// speed because both sides are measured in the same run with the same build.
    var coreMultiple: Double? {
        core.multiple(cpuSeconds: heraldCPU, notifications: Double(result.delivered))
    }

    var coreMultipleLine: String {
        guard let core = core.secondsPerRecipient, let multiple = coreMultiple else {
            return "Herald's cost as a multiple of the decision core: - (no host-speed marker)"
        }
        return String(
            format:
                "Herald's six stages: %.1f µs of CPU per delivered notification = %.1f × the decision core's %.2f µs per recipient (herald-bench decide, taken in this run)",
            heraldCPU / Double(result.delivered) * 1e6, multiple, core * 1e6)
    }

    var heraldCPU: Double { Self.heraldProcesses.reduce(0) { $0 + (result.cpu[$1] ?? 0) } }
    var heraldPeakRSSKB: Int { Self.heraldProcesses.reduce(0) { $0 + (result.peakRSSKB[$1] ?? 0) } }

    func per100k(_ cpu: Double) -> Double {
        result.delivered > 0 ? cpu * 100_000 / Double(result.delivered) : 0
    }

    func f2(_ d: Double) -> String { String(format: "%.2f", d) }

    func fmtMB(_ kb: Int) -> String { String(format: "%.1f MB", Double(kb) / 1024) }

    func summaryLines() -> [String] {
        let r = result
        var lines: [String] = []
        lines.append(
            String(
                format: "delivered %d of %d notifications in %.1f s: %.0f delivered/s", r.delivered, r.expected,
                r.deliverySeconds, r.deliveredPerSecond))
        lines.append(coreMultipleLine)
        lines.append(
            "latency created_at -> APNs answer: p50 \(r.overall.p50) ms, p99 \(r.overall.p99) ms, p99.9 \(r.overall.p999) ms, max \(r.overall.max) ms"
        )
        for k in NotificationKind.allCases {
            if let p = r.perKind[k], r.mixed || k == .group {
                lines.append("  \(k.name): \(p.count) notifications, p50 \(p.p50) ms, p99 \(p.p99) ms")
            }
        }
        lines.append(
            String(
                format:
                    "CPU per 100k delivered: Herald (six stages) %.2f s, broker %.2f s, Redis %.2f s, stand-in %.2f s",
                per100k(heraldCPU), per100k(r.cpu["kafka"] ?? 0), per100k(r.cpu["redis"] ?? 0),
                per100k(r.cpu["mock-apns"] ?? 0)))
        if let line = redisLine { lines.append(line) }
        lines.append(
            "peak RSS: Herald (six stages, summed) \(fmtMB(heraldPeakRSSKB)), broker \(fmtMB(r.peakRSSKB["kafka"] ?? 0)), Redis \(fmtMB(r.peakRSSKB["redis"] ?? 0)), stand-in \(fmtMB(r.peakRSSKB["mock-apns"] ?? 0))"
        )
        lines.append(
            "suppressed: "
                + r.observedSuppressed.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(
                    separator: ", "))
        lines.append(
            "lost \(r.lost), duplicated \(r.duplicates.count), unexpected \(r.unexpected200), dead-lettered \(r.dlq)")
        if !r.hops.isEmpty {
            lines.append("Herald's own time per hop (from the stages' histograms, after the warm-up):")
            lines += HopLatency.summaryLines(r.hops)
        }
        lines.append(hostSpeedLine)
        return lines
    }

    /// Redis's footprint of the run, per notification (a recipient decided: delivered, suppressed or failed).
    var redisLine: String? {
        guard let f = result.redis else { return nil }
        let n = result.recipients
        return String(
            format:
                "Redis per notification (%d recipients decided): %.1f bytes retained (used_memory %+d bytes), %.2f commands (%d in all); per delivered: %.1f bytes, %.2f commands",
            n, f.perNotification(f.retainedBytes, n), f.retainedBytes, f.perNotification(f.commands, n), f.commands,
            f.perNotification(f.retainedBytes, result.delivered), f.perNotification(f.commands, result.delivered))
    }

    func markdown() -> String {
        let r = result
        var s = "# herald-bench pipeline\n\n"
        s += "Command: `\(command)`\n\n"
        s += String(format: "**%.0f delivered/s**; ", result.deliveredPerSecond) + coreMultipleLine + "\n\n"
        s += hostSpeedLine + "\n\n"
        s += "## Scenario\n\n"
        s += "| setting | value |\n| --- | --- |\n"
        s += "| input | \(r.mode)\(r.mixed ? " + mixed priorities (calls to a VoIP token, direct messages)" : "") |\n"
        s += r.options.scenarioRows
        s += String(format: "| users loaded into Redis in | %.2f s |\n\n", r.loadSeconds)
        s += "## Results\n\n"
        s += "| measure | value |\n| --- | --- |\n"
        s +=
            "| events published | \(r.eventsPublished) ("
            + NotificationKind.allCases.compactMap { k in r.eventsByKind[k].map { "\(k.name) \($0)" } }.joined(
                separator: ", ") + ") |\n"
        s += "| events published again after the broker refused them | \(r.republished) |\n"
        s += "| recipients decided | \(r.recipients) |\n"
        s += "| notifications expected | \(r.expected) |\n"
        s += "| delivered (unique 200s) | \(r.delivered) |\n"
        s += String(
            format: "| delivered/s | %.0f (over %.1f s, first to last answer) |\n", r.deliveredPerSecond,
            r.deliverySeconds)
        s +=
            "| latency p50 / p99 / p99.9 / max | \(r.overall.p50) / \(r.overall.p99) / \(r.overall.p999) / \(r.overall.max) ms |\n"
        s += "| lost | \(r.lost) |\n"
        s += "| duplicated | \(r.duplicates.count) |\n"
        s += "| unexpected notifications | \(r.unexpected200) |\n"
        s += "| dead-lettered (herald_dlq_total) | \(r.dlq) |\n"
        s +=
            "| stand-in answers by status | "
            + r.answersByStatus.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
            + " |\n"
        if let f = r.redis {
            s += String(
                format:
                    "| Redis memory retained per notification (used_memory after - before, / recipients) | %.1f bytes (%+d bytes in all) |\n",
                f.perNotification(f.retainedBytes, r.recipients), f.retainedBytes)
            s += String(
                format:
                    "| Redis commands per notification (total_commands_processed after - before, / recipients) | %.2f (%d in all) |\n",
                f.perNotification(f.commands, r.recipients), f.commands)
            s += String(
                format:
                    "| Redis reads and writes per notification (total_reads_processed, total_writes_processed: its clients' round trips) | %.3f and %.3f (%d and %d in all) |\n",
                f.perNotification(f.reads, r.recipients), f.perNotification(f.writes, r.recipients), f.reads, f.writes)
        }
        s += "| explain entries dropped (herald_explain_dropped_total) | \(r.explainDropped) |\n"
        s += String(format: "| run time (drive + drain) | %.1f s |\n\n", r.driveSeconds)
        if let f = r.redis, !f.byCommand.isEmpty {
            // Redis's own accounting (INFO commandstats): where its command time goes. The time outside commands
            // (reading and writing the connections) is the rest of its CPU.
            s += "## Redis commands\n\n| command | calls per notification | µs per call | µs per notification |\n"
            s += "| --- | --- | --- | --- |\n"
            for c in f.byCommand {
                s += "| \(c.name) "
                s += String(
                    format: "| %.2f | %.2f | %.2f |\n", f.perNotification(c.calls, r.recipients),
                    Double(c.usec) / Double(c.calls), f.perNotification(c.usec, r.recipients))
            }
            s += "\n"
        }
        s +=
            "## Latency by kind\n\n| kind | notifications | p50 ms | p99 ms | p99.9 ms | max ms |\n| --- | --- | --- | --- | --- | --- |\n"
        for k in NotificationKind.allCases {
            if let p = r.perKind[k] { s += "| \(k.name) | \(p.count) | \(p.p50) | \(p.p99) | \(p.p999) | \(p.max) |\n" }
        }
        s +=
            "\n## Processes\n\n| process | CPU s | CPU s per 100k delivered | peak RSS (VmHWM) |\n| --- | --- | --- | --- |\n"
        for c in stageNames {
            s +=
                "| herald-\(c) | \(f2(r.cpu[c] ?? 0)) | \(f2(per100k(r.cpu[c] ?? 0))) | \(fmtMB(r.peakRSSKB[c] ?? 0)) |\n"
        }
        s +=
            "| **Herald (six stages)** | **\(f2(heraldCPU))** | **\(f2(per100k(heraldCPU)))** | **\(fmtMB(heraldPeakRSSKB))** (sum) |\n"
        for (c, name) in [("kafka", "broker"), ("redis", "Redis"), ("mock-apns", "APNs stand-in")] {
            s += "| \(name) | \(f2(r.cpu[c] ?? 0)) | \(f2(per100k(r.cpu[c] ?? 0))) | \(fmtMB(r.peakRSSKB[c] ?? 0)) |\n"
        }
        if !r.hops.isEmpty {
            s += "\n## Time per hop\n\n" + HopLatency.markdownTable(r.hops) + "\n" + HopLatency.method + "\n"
        }
        s +=
            "\n## Suppressions by reason\n\n| reason | observed (herald_suppressed_total) | predicted |\n| --- | --- | --- |\n"
        for reason in Set(r.observedSuppressed.keys).union(r.predictedSuppressed.keys).sorted() {
            s += "| \(reason) | \(r.observedSuppressed[reason] ?? 0) | \(r.predictedSuppressed[reason] ?? 0) |\n"
        }
        s += "\n## Consistency\n\n"
        let problems = r.consistencyProblems()
        s +=
            problems.isEmpty
            ? "consistent: delivered + suppressed = recipients decided; 0 lost, 0 duplicated, 0 unexpected\n"
            : problems.map { "- " + $0 }.joined(separator: "\n") + "\n"
        s += "\n## Over time\n\n![throughput and latency](REPORT.svg)\n\n"
        s += "| second | delivered | p50 ms | p99 ms |\n| --- | --- | --- | --- |\n"
        for e in r.series { s += "| \(e.second) | \(e.count) | \(e.p50) | \(e.p99) |\n" }
        return s
    }

    func json() -> String {
        let r = result
        func pct(_ p: Percentiles) -> JSONValue {
            .sorted([
                "count": .int(p.count), "p50_ms": .int(p.p50), "p99_ms": .int(p.p99), "p999_ms": .int(p.p999),
                "max_ms": .int(p.max),
            ])
        }
        func counts(_ d: [String: Int]) -> JSONValue { .sorted(d.mapValues { .int($0) }) }
        var processes: [String: JSONValue] = [:]
        for c in ProcessAccounting.components {
            processes[c] = .sorted([
                "cpu_seconds": .double(r.cpu[c] ?? 0), "cpu_seconds_per_100k": .double(per100k(r.cpu[c] ?? 0)),
                "peak_rss_kb": .int(r.peakRSSKB[c] ?? 0),
            ])
        }
        var kinds: [String: JSONValue] = [:]
        for (k, p) in r.perKind { kinds[k.name] = pct(p) }
        let root: JSONValue = .sorted([
            "scenario": .sorted([
                "mode": .string(r.mode), "mixed": .bool(r.mixed), "users": .int(r.options.users),
                "conversation_size": .int(r.options.conversationSize),
                "dnd": .double(r.options.dnd), "muted": .double(r.options.muted), "online": .double(r.options.online),
                "other_conversations": .int(r.options.otherConversations),
                "profile": .string(r.options.profile),
                "text_bytes": .int(r.options.textBytes),
            ]),
            "events_published": .int(r.eventsPublished),
            "events_republished": .int(r.republished),
            "recipients": .int(r.recipients),
            "redis": r.redis.map { f in
                .sorted([
                    "used_memory_before": .int(f.before.usedMemory), "used_memory_after": .int(f.after.usedMemory),
                    "retained_bytes": .int(f.retainedBytes),
                    "retained_bytes_per_notification": .double(f.perNotification(f.retainedBytes, r.recipients)),
                    "commands": .int(f.commands),
                    "commands_per_notification": .double(f.perNotification(f.commands, r.recipients)),
                    "reads": .int(f.reads), "writes": .int(f.writes),
                    "reads_per_notification": .double(f.perNotification(f.reads, r.recipients)),
                    "retained_bytes_per_delivered": .double(f.perNotification(f.retainedBytes, r.delivered)),
                    "commands_per_delivered": .double(f.perNotification(f.commands, r.delivered)),
                ])
            } ?? .null,
            "expected": .int(r.expected),
            "delivered": .int(r.delivered),
            "delivered_per_second": .double(r.deliveredPerSecond),
            "delivery_seconds": .double(r.deliverySeconds),
            "lost": .int(r.lost),
            "duplicated": .int(r.duplicates.count),
            "unexpected": .int(r.unexpected200),
            "dead_lettered": .int(r.dlq),
            "explain_dropped": .int(r.explainDropped),
            "render_errors": .int(r.renderErrors),
            "suppressed": counts(r.observedSuppressed),
            "suppressed_predicted": counts(r.predictedSuppressed),
            "latency_ms": pct(r.overall),
            "latency_by_kind_ms": .sorted(kinds),
            "hops": .sorted(HopLatency.json(r.hops)),
            "processes": .sorted(processes),
            "herald": .sorted([
                "cpu_seconds": .double(heraldCPU), "cpu_seconds_per_100k": .double(per100k(heraldCPU)),
                "peak_rss_kb_sum": .int(heraldPeakRSSKB),
            ]),
            "series": .array(
                r.series.map {
                    .sorted([
                        "second": .int($0.second), "delivered": .int($0.count), "p50_ms": .int($0.p50),
                        "p99_ms": .int($0.p99),
                    ])
                }),
            "host_recipients_per_cpu_second": .sorted([
                "before": .double(core.before ?? 0), "after": .double(core.after ?? 0),
            ]),
            "herald_cpu_multiple_of_core": .double(coreMultiple ?? 0),
            "consistent": .bool(r.consistencyProblems().isEmpty),
            "problems": .strings(r.consistencyProblems()),
        ])
        return root.prettyPrinted + "\n"
    }

    /// Two stacked panels sharing the time axis: delivered per second, and p50 / p99 latency.
    func svg() -> String {
        let series = result.series
        let width = 900.0, panelH = 220.0, left = 70.0, right = 20.0, top = 40.0, gap = 60.0
        let height = top + panelH * 2 + gap + 50
        let maxSec = Double(max(1, (series.map(\.second).max() ?? 0) + 1))
        let maxRate = Double(max(1, series.map(\.count).max() ?? 1))
        let maxLat = Double(max(1, series.map(\.p99).max() ?? 1))
        func x(_ sec: Double) -> Double { left + (width - left - right) * sec / maxSec }
        func niceMax(_ v: Double) -> Double {
            let e = pow(10, floor(log10(v)))
            for m in [1.0, 2.0, 2.5, 5.0, 10.0] where m * e >= v { return m * e }
            return 10 * e
        }
        let rateTop = niceMax(maxRate), latTop = niceMax(maxLat)
        var s =
            ##"<svg xmlns="http://www.w3.org/2000/svg" width="\##(Int(width))" height="\##(Int(height))" font-family="sans-serif" font-size="12">"##
        s += "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        s +=
            ##"<text x="\##(left)" y="20" font-size="14" font-weight="bold">herald-bench pipeline: \##(escape(result.mode))</text>"##
            + "\n"
        func panel(
            _ y0: Double, _ title: String, _ topValue: Double, _ unit: String,
            _ lines: [(String, String, [(Double, Double)])]
        ) {
            let plotW = width - left - right
            s +=
                ##"<rect x="\##(left)" y="\##(y0)" width="\##(plotW)" height="\##(panelH)" fill="none" stroke="#999"/>"##
                + "\n"
            s += ##"<text x="\##(left)" y="\##(y0 - 8)" font-weight="bold">\##(title)</text>"## + "\n"
            for i in 0...4 {
                let v = topValue * Double(i) / 4
                let yy = y0 + panelH - panelH * Double(i) / 4
                s += ##"<line x1="\##(left)" y1="\##(yy)" x2="\##(width - right)" y2="\##(yy)" stroke="#eee"/>"## + "\n"
                s += ##"<text x="\##(left - 6)" y="\##(yy + 4)" text-anchor="end">\##(Int(v))\##(unit)</text>"## + "\n"
            }
            let ticks = min(10, Int(maxSec))
            for i in 0...max(1, ticks) {
                let sec = maxSec * Double(i) / Double(max(1, ticks))
                s +=
                    ##"<text x="\##(x(sec))" y="\##(y0 + panelH + 16)" text-anchor="middle">\##(Int(sec))s</text>"##
                    + "\n"
            }
            var legendX = left + 220
            for (name, color, pts) in lines {
                let path = pts.map {
                    String(format: "%.1f,%.1f", x($0.0 + 0.5), y0 + panelH - panelH * min(1, $0.1 / topValue))
                }.joined(separator: " ")
                s += ##"<polyline fill="none" stroke="\##(color)" stroke-width="2" points="\##(path)"/>"## + "\n"
                s +=
                    ##"<rect x="\##(legendX)" y="\##(y0 - 18)" width="12" height="3" fill="\##(color)"/><text x="\##(legendX + 16)" y="\##(y0 - 13)">\##(name)</text>"##
                    + "\n"
                legendX += 110
            }
        }
        panel(
            top + 20, "delivered per second", rateTop, "",
            [("delivered/s", "#1f77b4", series.map { (Double($0.second), Double($0.count)) })])
        panel(
            top + 20 + panelH + gap, "latency (created_at to APNs answer)", latTop, " ms",
            [
                ("p50", "#2ca02c", series.map { (Double($0.second), Double($0.p50)) }),
                ("p99", "#d62728", series.map { (Double($0.second), Double($0.p99)) }),
            ])
        s +=
            ##"<text x="\##(width / 2)" y="\##(height - 8)" text-anchor="middle">seconds since the run started (by answer time)</text>"##
            + "\n"
        s += "</svg>\n"
        return s
    }

    func escape(_ t: String) -> String {
        t.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;").replacingOccurrences(
            of: ">", with: "&gt;")
    }
}
