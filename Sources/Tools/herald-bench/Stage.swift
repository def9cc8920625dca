// herald-bench stage NAME: one stage fed alone with a backlog of its own input.
import ArgumentParser
import Foundation
import HeraldBenchSupport
import HeraldCore
import HeraldToolSupport

struct StageBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stage",
        abstract: "Feed one stage alone with a backlog of its own input and measure its cost per notification.",
        discussion: """
            Starts Redis, the Kafka broker and the stand-ins without stages, loads the users, publishes --backlog group events \
            (the pipeline benchmark's workload), lets the stages upstream of NAME turn them into NAME's input and \
            stops them, then starts NAME alone and lets it drain the backlog. Reports its records and notifications \
            per CPU-second (from /proc), its multiple of the decision core's cost per notification (herald-bench \
            decide, taken before and after the run), its peak memory (VmHWM), its time per hop, and whether every \
            input became an output, a counted suppression or a dead letter.
            Writes REPORT.md and REPORT.json into --out (default run/bench-reports/stage-NAME-<time>-<pid>).
            """)

    @Argument(help: "The stage: ingest, resolve, suppress, render or send.") var name: String
    @OptionGroup var stack: StackOptions
    @Option(help: "Users to load (each with one APNs token).") var users = 20_000
    @Option(name: .customLong("conversation-size"), help: "Members per group conversation.") var conversationSize = 5
    @OptionGroup var workload: WorkloadArguments
    @Option(help: "Group events the backlog is made from.") var backlog = 20_000
    @Option(
        name: .customLong("drain-timeout"), help: "Stop waiting when nothing new happened for this many seconds.")
    var drainTimeout = 30.0
    @Option(help: "Directory for REPORT.md and REPORT.json.") var out: String?
    @Flag(help: "Exit 1 unless every input was accounted for (0 lost, nothing duplicated).") var check = false

    func validate() throws {
        if BenchStage(rawValue: name) == nil {
            throw ValidationError("NAME must be one of " + BenchStage.allCases.map(\.rawValue).joined(separator: ", "))
        }
        if stack.attach != nil {
            throw ValidationError("stage starts its own stack (the stages one at a time): --attach does not apply")
        }
        if stack.realtime {
            throw ValidationError(
                "--realtime applies to a stack started whole (pipeline, idle), not one stage at a time")
        }
        if backlog < 1 { throw ValidationError("--backlog must be at least 1") }
        if users < 2 || conversationSize < 2 {
            throw ValidationError("--users and --conversation-size must be at least 2")
        }
    }

    func run() async throws {
        let stage = BenchStage(rawValue: name)!
        let hostBefore = CoreMarker.measure()
        let session = try BenchSession.open(stack, mockArgs: "", stages: [])
        defer { session.close(keep: stack.keep) }
        let driver = try await LoadDriver(
            session: session, workload: workload.workload(users: users, conversationSize: conversationSize))
        let result = try await StageDriver(driver: driver, stage: stage, drainTimeout: drainTimeout).run(
            events: backlog)
        let report = StageReport(
            result: result, command: CommandLine.arguments.joined(separator: " "),
            core: CoreMarker(before: hostBefore, after: CoreMarker.measure()))
        let outDir = out ?? session.repo + "/run/bench-reports/stage-\(name)-" + PipelineBench.stamp()
        try FileManager.default.createDirectory(atPath: outDir, withIntermediateDirectories: true)
        try PipelineBench.finish(
            outDir: outDir, files: [("REPORT.md", report.markdown()), ("REPORT.json", report.json())],
            summary: report.summaryLines(), problems: check ? result.consistencyProblems() : nil,
            passed: "every input accounted for, 0 lost")
    }
}

/// The stage bench's report: Markdown for people, JSON for tools.
struct StageReport {
    let result: StageDriver.Result
    let command: String
    let core: CoreMarker

    var stageName: String { result.stage.rawValue }
    var cpu: Double { result.stageCPU }
    var recordsPerCPUSecond: Double { cpu > 0 ? Double(result.consumedMeasured) / cpu : 0 }
    var notificationsPerCPUSecond: Double { cpu > 0 ? result.notificationsMeasured / cpu : 0 }
    var microsecondsPerNotification: Double {
        result.notificationsMeasured > 0 ? cpu / result.notificationsMeasured * 1e6 : 0
    }
    var coreMultiple: Double? { core.multiple(cpuSeconds: cpu, notifications: result.notificationsMeasured) }

    func fmtMB(_ kb: Int) -> String { String(format: "%.1f MB", Double(kb) / 1024) }

    var headline: String {
        let multiple = coreMultiple.map { String(format: "%.2f", $0) } ?? "-"
        let coreUS = core.secondsPerRecipient.map { String(format: "%.2f", $0 * 1e6) } ?? "-"
        return "herald-\(stageName) alone: "
            + String(
                format: "%.0f notifications per CPU-second (%.2f µs each) = ", notificationsPerCPUSecond,
                microsecondsPerNotification)
            + "\(multiple) × the decision core's \(coreUS) µs per recipient; "
            + String(format: "%.0f input records per CPU-second", recordsPerCPUSecond)
    }

    func summaryLines() -> [String] {
        let r = result
        var lines = [headline]
        lines.append(
            "backlog: \(r.inputs) records from \(r.events) group events (\(r.notifications) notifications, \(r.recipients) recipients)"
                + String(format: "; drained in %.1f s using %.2f CPU-s, ", r.drainSeconds, cpu)
                + "peak RSS \(fmtMB(r.peakRSSKB))")
        lines.append(
            String(
                format: "while it drained: broker %.2f CPU-s, Redis %.2f, stand-in %.2f", r.cpu["kafka"] ?? 0,
                r.cpu["redis"] ?? 0, r.cpu["mock-apns"] ?? 0))
        lines.append(
            "accounted \(r.accounted) of \(r.expectedUnits): outputs \(r.produced), suppressed \(r.suppressed.values.reduce(0, +)), dead-lettered \(r.deadLettered.values.reduce(0, +)); lost \(r.lost)"
        )
        if let hop = r.hop { lines += HopLatency.summaryLines([hop]) }
        lines.append(core.line)
        return lines
    }

    func markdown() -> String {
        let r = result
        var s = "# herald-bench stage \(stageName)\n\n"
        s += "Command: `\(command)`\n\n**\(headline)**\n\n\(core.line)\n\n"
        s += "## Scenario\n\n| setting | value |\n| --- | --- |\n"
        s += "| backlog | \(r.events) group events, made into \(r.inputs) input records by the stages upstream |\n"
        s += r.options.scenarioRows
        s += String(
            format: "| backlog made in | %.1f s (users loaded in %.2f s before) |\n\n", r.backlogSeconds, r.loadSeconds)
        s += "## Results\n\n| measure | value |\n| --- | --- |\n"
        s +=
            "| input records consumed | \(r.consumed) (\(r.consumedMeasured) while measured"
            + (r.measuredFromStart ? ", from the process's start: most were consumed before its first sample" : "")
            + ") |\n"
        s += String(format: "| drain time | %.1f s (from the stage ready to the backlog drained) |\n", r.drainSeconds)
        s += String(format: "| herald-\(stageName) CPU | %.2f s |\n", cpu)
        s += String(format: "| input records per CPU-second | %.0f |\n", recordsPerCPUSecond)
        s += String(
            format: "| notifications per CPU-second | %.0f (%.1f notifications carried while measured) |\n",
            notificationsPerCPUSecond, r.notificationsMeasured)
        s += String(format: "| CPU per notification | %.2f µs |\n", microsecondsPerNotification)
        s += "| multiple of the decision core | \(coreMultiple.map { String(format: "%.2f", $0) } ?? "-") |\n"
        s += "| peak RSS (VmHWM) | \(fmtMB(r.peakRSSKB)) |\n"
        for (c, label) in [("kafka", "broker"), ("redis", "Redis"), ("mock-apns", "APNs stand-in")] {
            s += String(format: "| \(label) CPU while it drained | %.2f s |\n", r.cpu[c] ?? 0)
        }
        s += "\n## Accounting\n\n| measure | value |\n| --- | --- |\n"
        s +=
            "| expected | \(r.expectedUnits) (\(r.stage == .resolve ? "recipients of the backlog's events" : "input records")) |\n"
        let outputs =
            r.stage == .send
            ? "\(r.produced) notifications answered 200 by the stand-in"
            : "\(r.produced) ("
                + r.producedByTopic.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
                .joined(separator: ", ") + ")"
        s += "| outputs | \(outputs) |\n"
        s += "| suppressed | " + Self.list(r.suppressed) + " |\n"
        s += "| dead-lettered | " + Self.list(r.deadLettered) + " |\n"
        s += "| lost | \(r.lost) |\n"
        if r.stage == .send {
            s += "| duplicated / unexpected | \(r.duplicates) / \(r.unexpected) |\n"
        }
        let problems = r.consistencyProblems()
        s +=
            "\n"
            + (problems.isEmpty
                ? "consistent: every input became an output, a counted suppression or a dead letter; 0 lost\n"
                : problems.map { "- " + $0 }.joined(separator: "\n") + "\n")
        if let hop = r.hop {
            s +=
                "\n## Time per hop (under the backlog)\n\n" + HopLatency.markdownTable([hop]) + "\n" + HopLatency.method
                + "\n"
        }
        s += "\n## Method\n\nThe stage's CPU is utime + stime of its process (/proc/PID/stat), from its first sample "
        s += "after it answered /readyz to the sample at which the backlog was drained (every input consumed, nothing "
        s += "in flight, every input accounted for); when it had consumed more than half of the backlog before that "
        s += "first sample (a small backlog), from its process's start instead, start-up included. Notifications per "
        s += "CPU-second count the delivered notifications the measured inputs carry (the backlog's notifications in "
        s += "proportion), so the five stages' multiples add up to the pipeline's.\n"
        return s
    }

    static func list(_ counts: [String: Int]) -> String {
        counts.isEmpty ? "0" : counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
    }

    func json() -> String {
        let r = result
        func counts(_ d: [String: Int]) -> JSONValue { .sorted(d.mapValues { .int($0) }) }
        let root: JSONValue = .sorted([
            "stage": .string(stageName),
            "scenario": .sorted([
                "events": .int(r.events), "users": .int(r.options.users),
                "conversation_size": .int(r.options.conversationSize),
                "dnd": .double(r.options.dnd), "muted": .double(r.options.muted), "online": .double(r.options.online),
                "other_conversations": .int(r.options.otherConversations),
                "profile": .string(r.options.profile), "text_bytes": .int(r.options.textBytes),
            ]),
            "recipients": .int(r.recipients), "notifications": .int(r.notifications), "inputs": .int(r.inputs),
            "backlog_seconds": .double(r.backlogSeconds), "expected": .int(r.expectedUnits),
            "consumed": .int(r.consumed), "consumed_measured": .int(r.consumedMeasured),
            "measured_from_start": .bool(r.measuredFromStart), "outputs": .int(r.produced),
            "outputs_by_topic": counts(r.producedByTopic),
            "suppressed": counts(r.suppressed), "suppressed_through_stage": counts(r.suppressedThroughStage),
            "suppressed_predicted": counts(r.predictedSuppressed.filter { $0.value > 0 }),
            "dead_lettered": counts(r.deadLettered),
            "lost": .int(r.lost), "duplicated": .int(r.duplicates), "unexpected": .int(r.unexpected),
            "drain_seconds": .double(r.drainSeconds),
            "cpu_seconds": .double(cpu), "input_records_per_cpu_second": .double(recordsPerCPUSecond),
            "notifications_measured": .double(r.notificationsMeasured),
            "notifications_per_cpu_second": .double(notificationsPerCPUSecond),
            "cpu_us_per_notification": .double(microsecondsPerNotification),
            "multiple_of_core": .double(coreMultiple ?? 0),
            "peak_rss_kb": .int(r.peakRSSKB),
            "others_cpu_seconds": .sorted([
                "kafka": .double(r.cpu["kafka"] ?? 0), "redis": .double(r.cpu["redis"] ?? 0),
                "mock-apns": .double(r.cpu["mock-apns"] ?? 0),
            ]),
            "host_recipients_per_cpu_second": .sorted([
                "before": .double(core.before ?? 0), "after": .double(core.after ?? 0),
            ]),
            "consistent": .bool(r.consistencyProblems().isEmpty),
            "problems": .strings(r.consistencyProblems()),
            "hop": r.hop.flatMap { HopLatency.json([$0])[stageName] } ?? .null,
        ])
        return root.prettyPrinted + "\n"
    }
}
