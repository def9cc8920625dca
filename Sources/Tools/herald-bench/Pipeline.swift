// herald-bench pipeline: the whole local stack under a chosen load.
import ArgumentParser
import Foundation
import Glibc
import HeraldBenchSupport
import HeraldCore

struct PipelineBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pipeline",
        abstract:
            "Drive the local stack (Redis, the Kafka broker, APNs stand-in, six stages) and measure it end to end.",
        discussion: """
            Either --backlog N (publish N events, then drain) or --rate R --seconds S (steady input).
            Latency runs from each event's created_at (set when it is published) to the stand-in's answer.
            Writes REPORT.md, REPORT.svg and REPORT.json into --out (default run/bench-reports/<time>-<pid>).
            """)

    @OptionGroup var stack: StackOptions
    @Option(help: "Users to load (each with one APNs token).") var users = 10_000
    @Option(name: .customLong("conversation-size"), help: "Members per group conversation.") var conversationSize = 50
    @OptionGroup var workload: WorkloadArguments
    @Option(help: "Publish this many group events at once, then drain.") var backlog: Int?
    @Option(help: "Group events per second (with --seconds).") var rate: Double?
    @Option(help: "Seconds of steady input (with --rate).") var seconds: Double = 10
    @Flag(
        help:
            "Mixed priorities: while the input flows, also send call events (VoIP) and direct messages at a low rate; their latency is reported separately."
    )
    var mixed = false
    @Option(name: .customLong("mixed-rate"), help: "Calls per second and direct messages per second with --mixed.")
    var mixedRate = 2.0
    @Option(
        name: .customLong("mixed-warmup"),
        help:
            "With --mixed: the first N calls and N direct messages are delivered and checked but left out of the latency figures (first connections of the priority lane and of the VoIP credential)."
    )
    var mixedWarmup = 0
    @Option(
        name: .customLong("warmup"),
        help:
            "With --rate: events created in the first this many seconds are delivered and checked but left out of the latency figures (the stack's start-up)."
    )
    var warmup = 5.0
    @Option(
        name: .customLong("drain-timeout"),
        help:
            "Stop waiting when nothing moved (no delivery, no record consumed or produced by a stage) for this many seconds."
    )
    var drainTimeout = 20.0
    @Option(name: .customLong("mock-args"), help: "Extra herald-mock-apns options for a stack the bench starts.")
    var mockArgs = ""
    @Option(help: "Directory for REPORT.md, REPORT.svg and REPORT.json.") var out: String?
    @Flag(
        help:
            "Exit 1 unless the counts are consistent (delivered + suppressed = expected, nothing lost, duplicated or unexpected)."
    )
    var check = false

    func validate() throws {
        if backlog == nil && rate == nil { throw ValidationError("give --backlog N or --rate R --seconds S") }
        if backlog != nil && rate != nil { throw ValidationError("--backlog and --rate exclude each other") }
        if let r = rate, r <= 0 { throw ValidationError("--rate must be positive") }
        if users < 2 || conversationSize < 2 {
            throw ValidationError("--users and --conversation-size must be at least 2")
        }
    }

    func run() async throws {
        // A second of the decide benchmark before the stack starts and after the run: the host's speed, printed
        // with the figures (a slow host doubles every process's CPU per notification).
        let hostBefore = CoreMarker.measure()
        let session = try BenchSession.open(stack, mockArgs: mockArgs)
        defer { session.close(keep: stack.keep) }
        let driver = try await LoadDriver(
            session: session, workload: workload.workload(users: users, conversationSize: conversationSize))
        let mode: LoadDriver.Mode = backlog.map { .backlog($0) } ?? .rate(rate!, seconds)
        if rate != nil, warmup > 0 { driver.ledger.latencyFrom = nowMillis() + Int64(warmup * 1000) }
        driver.mixedWarmup = mixedWarmup
        let result = try await driver.run(mode: mode, mixed: mixed ? mixedRate : nil, drainTimeout: drainTimeout)
        if mixed {
            // The slowest calls and DMs, with when they were created (seconds into the run): where a p99 comes from.
            for kind in [NotificationKind.call, .direct] {
                let slow = driver.ledger.expected.values.filter { $0.kind == kind && $0.firstAt > 0 }
                    .map {
                        (latency: $0.firstAt - $0.createdAt, at: Double($0.createdAt - driver.ledger.origin) / 1000)
                    }
                    .sorted { $0.latency > $1.latency }.prefix(5)
                print(
                    "slowest \(kind): "
                        + slow.map { String(format: "%d ms (created at %.1f s)", $0.latency, $0.at) }
                        .joined(separator: ", "))
            }
        }
        if driver.ledger.warmupDelivered > 0 {
            print(
                "(latency leaves out \(driver.ledger.warmupDelivered) notifications: events created in the first "
                    + "\(warmup) s with --rate, and the first \(mixedWarmup) calls and DMs)")
        }
        let outDir = out ?? session.repo + "/run/bench-reports/" + Self.stamp()
        try FileManager.default.createDirectory(atPath: outDir, withIntermediateDirectories: true)
        var report = BenchReport(result: result, command: CommandLine.arguments.joined(separator: " "))
        report.core = CoreMarker(before: hostBefore, after: CoreMarker.measure())
        try Self.finish(
            outDir: outDir,
            files: [("REPORT.md", report.markdown()), ("REPORT.svg", report.svg()), ("REPORT.json", report.json())],
            summary: report.summaryLines(), problems: check ? result.consistencyProblems() : nil,
            passed: "delivered + suppressed = expected, 0 lost, 0 duplicated, 0 unexpected")
    }

    /// Writes a bench's report files into `outDir`, prints its summary, and with `--check` (`problems` given)
    /// exits 1 when there are problems.
    static func finish(
        outDir: String, files: [(name: String, text: String)], summary: [String], problems: [String]?,
        passed: String
    ) throws {
        for f in files { try f.text.write(toFile: outDir + "/" + f.name, atomically: true, encoding: .utf8) }
        print(summary.joined(separator: "\n"))
        print("report: \(outDir)/\(files[0].name) (" + files.dropFirst().map(\.name).joined(separator: ", ") + ")")
        guard let problems else { return }
        if !problems.isEmpty {
            print("check FAILED: " + problems.joined(separator: "; "))
            throw ExitCode(1)
        }
        print("check passed: " + passed)
    }

    /// The time (UTC, to the second) and this process's id: two benches started in the same second (two builds run
    /// side by side) write to directories of their own.
    static func stamp() -> String {
        let f = DateFormatter()
        f.dateFormat = "yyyyMMdd-HHmmss"
        f.timeZone = TimeZone(identifier: "UTC")
        return f.string(from: Date()) + "-\(ProcessInfo.processInfo.processIdentifier)"
    }
}
