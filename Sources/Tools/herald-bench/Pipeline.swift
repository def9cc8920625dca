// herald-bench pipeline: the whole local stack under a chosen load.
import ArgumentParser
import Foundation
import Glibc
import HeraldCore

/// Options shared by `pipeline` and `chaos` for starting or attaching to a stack.
struct StackOptions: ParsableArguments {
    @Option(
        help:
            "Attach to a stack already running in this run directory (scripts/local-stack.sh --up --run-dir DIR) instead of starting one."
    )
    var attach: String?
    @Option(
        name: .customLong("run-dir"), help: "Run directory of the stack the bench starts (default: run/bench-<pid>).")
    var runDir: String?
    @Option(help: "Repository root (default: found from the working directory or the executable).")
    var repo: String?
    @Flag(
        name: .customLong("build"),
        help: "Let scripts/local-stack.sh build the release products first (default: use the existing build).")
    var build = false
    @Flag(help: "Use the debug build (.build/debug) for the stack.")
    var debug = false
    @Flag(name: .customLong("keep"), help: "Leave the started stack running at the end.")
    var keep = false
}

struct PipelineBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pipeline",
        abstract: "Drive the local stack (Redis, Tansu, APNs stand-in, six stages) and measure it end to end.",
        discussion: """
            Either --backlog N (publish N events, then drain) or --rate R --seconds S (steady input).
            Latency runs from each event's created_at (set when it is published) to the stand-in's answer.
            Writes REPORT.md, REPORT.svg and REPORT.json into --out (default run/bench-reports/<time>).
            """)

    @OptionGroup var stack: StackOptions
    @Option(help: "Users to load (each with one APNs token).") var users = 10_000
    @Option(name: .customLong("conversation-size"), help: "Members per group conversation.") var conversationSize = 50
    @Option(help: "Fraction of users in Do Not Disturb.") var dnd = 0.1
    @Option(help: "Fraction of users who muted their group.") var muted = 0.1
    @Option(help: "Fraction of users online (their only device is online).") var online = 0.1
    @Option(help: "Payload profile: compact (app1), sendbird (app2), cometchat (app3).") var profile = "compact"
    @Option(name: .customLong("text-bytes"), help: "Message text length.") var textBytes = 60
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
        name: .customLong("drain-timeout"), help: "Stop waiting when nothing new was delivered for this many seconds.")
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
        if dnd + muted + online > 1 { throw ValidationError("--dnd + --muted + --online must not exceed 1") }
        if users < 2 || conversationSize < 2 {
            throw ValidationError("--users and --conversation-size must be at least 2")
        }
    }

    func run() async throws {
        // A second of the decide benchmark before the stack starts and after the run: the host's speed, printed
        // with the figures (a slow host doubles every process's CPU per notification).
        let hostBefore = DecideWorkload.hostRecipientsPerCPUSecond()
        let session = try BenchSession.open(stack, mockArgs: mockArgs)
        defer { session.close(keep: stack.keep) }
        var w = WorkloadOptions()
        w.users = users; w.conversationSize = conversationSize; w.dnd = dnd; w.muted = muted; w.online = online
        w.profile = profile; w.textBytes = textBytes
        let driver = try await LoadDriver(session: session, workload: w)
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
        report.hostSpeed = (hostBefore, DecideWorkload.hostRecipientsPerCPUSecond())
        try report.markdown().write(toFile: outDir + "/REPORT.md", atomically: true, encoding: .utf8)
        try report.svg().write(toFile: outDir + "/REPORT.svg", atomically: true, encoding: .utf8)
        try report.json().write(toFile: outDir + "/REPORT.json", atomically: true, encoding: .utf8)
        print(report.summaryLines().joined(separator: "\n"))
        print("report: \(outDir)/REPORT.md (plot REPORT.svg, data REPORT.json)")
        if check {
            let problems = result.consistencyProblems()
            if !problems.isEmpty {
                print("check FAILED: " + problems.joined(separator: "; "))
                throw ExitCode(1)
            }
            print("check passed: delivered + suppressed = expected, 0 lost, 0 duplicated, 0 unexpected")
        }
    }

    static func stamp() -> String {
        let f = DateFormatter()
        f.dateFormat = "yyyyMMdd-HHmmss"
        f.timeZone = TimeZone(identifier: "UTC")
        return f.string(from: Date())
    }
}

/// A started (or attached) stack plus how to control it.
final class BenchSession: @unchecked Sendable {
    let control: StackControl
    var info: StackInfo
    let started: Bool
    let repo: String

    init(control: StackControl, info: StackInfo, started: Bool, repo: String) {
        self.control = control; self.info = info; self.started = started; self.repo = repo
    }

    static func open(
        _ o: StackOptions, mockArgs: String, redisAOF: Bool = false, kafkaS3: Bool = false,
        runSuffix: String = ""
    ) throws -> BenchSession {
        let repo = try o.repo ?? StackControl.findRepo()
        if let attach = o.attach {
            let info = try StackInfo.load(run: attach)
            return BenchSession(
                control: StackControl(repo: repo, run: attach, environment: [:]), info: info, started: false, repo: repo
            )
        }
        let run = (o.runDir ?? repo + "/run/bench-\(getpid())") + runSuffix
        let control = StackControl(repo: repo, run: run, environment: StackControl.portEnvironment())
        log(
            "starting the stack in \(run) (ports: \(control.environment.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")))"
        )
        do {
            try control.up(redisAOF: redisAOF, kafkaS3: kafkaS3, mockArgs: mockArgs, build: o.build, debug: o.debug)
        } catch {
            control.down()
            throw error
        }
        return BenchSession(control: control, info: try StackInfo.load(run: run), started: true, repo: repo)
    }

    func close(keep: Bool) {
        if started && !keep {
            log("stopping the stack")
            control.down()
        }
    }
}

/// Loads the users, drives events, follows the stand-in's record and the stages' metrics.
final class LoadDriver: @unchecked Sendable {
    enum Mode {
        case backlog(Int)
        case rate(Double, Double)
    }

    struct Progress {
        var t: Double
        var published: Int
        var delivered: Int
        var rate: Double
        var lag: Double
    }

    let session: BenchSession
    let workload: Workload
    let publisher: EventPublisher
    let ledger: Ledger
    let tail: RecordTail
    let procs: ProcessAccounting
    var metricsBefore: StageMetrics
    /// Redis once the users' state is loaded (nil when it could not be read).
    var redisBefore: RedisSnapshot?
    var predictedSuppressed: [String: Int] = [:]
    var renderErrors = 0
    var eventsPublished = 0
    var eventsByKind: [NotificationKind: Int] = [:]
    var recipientsDecided = 0
    var progress: [Progress] = []
    var workloadOptions: WorkloadOptions
    var loadSeconds = 0.0
    /// Called once a second while driving (chaos uses it for its faults).
    var onTick: ((Double) async -> Void)?
    /// The first this many calls and DMs are left out of the latency figures.
    var mixedWarmup = 0
    var quiet = false

    init(session: BenchSession, workload options: WorkloadOptions) async throws {
        self.session = session
        workloadOptions = options
        let now = nowMillis()
        workload = try Workload(options: options, pipelineFile: session.info.pipelineFile, now: now)
        let t0 = monotonicSeconds()
        try await workload.load(redisPort: session.info.redisPort, now: now)
        loadSeconds = monotonicSeconds() - t0
        log(
            String(
                format: "loaded %d users in %d conversations of %d into Redis in %.2f s", options.users,
                workload.conversations.count, options.conversationSize, loadSeconds))
        publisher = try EventPublisher(brokers: session.info.brokers, extraProperties: workload.kafkaProperties)
        ledger = Ledger(origin: nowMillis())
        tail = RecordTail(run: session.info.run)
        _ = tail.poll()  // answers from before this run are not ours
        procs = ProcessAccounting(stack: session.info)
        metricsBefore = StageMetrics.scrape(session.info)
        redisBefore = try? await RedisSnapshot.read(port: session.info.redisPort)
    }

    func publish(_ p: PlannedEvent) async {
        for id in p.notifications { ledger.expect(apnsID: id, createdAt: p.createdAt, kind: p.kind) }
        for (r, n) in p.suppressed { predictedSuppressed[r, default: 0] += n }
        renderErrors += p.renderErrors
        recipientsDecided += p.notifications.count + p.suppressed.values.reduce(0, +) + p.renderErrors
        eventsPublished += 1
        eventsByKind[p.kind, default: 0] += 1
        await publisher.publish(key: p.key, value: p.bytes)
    }

    struct Result {
        var options: WorkloadOptions
        var mode: String
        var mixed: Bool
        var eventsPublished: Int
        var eventsByKind: [NotificationKind: Int]
        var publishFailed: Int
        var republished: Int
        var recipients: Int
        var expected: Int
        var delivered: Int
        var lost: Int
        var duplicates: [Duplicate]
        var unexpected200: Int
        var answersByStatus: [Int: Int]
        var predictedSuppressed: [String: Int]
        var observedSuppressed: [String: Int]
        var dlq: Int
        var renderErrors: Int
        var overall: Percentiles
        var perKind: [NotificationKind: Percentiles]
        var driveSeconds: Double
        var deliverySeconds: Double
        var deliveredPerSecond: Double
        var cpu: [String: Double]
        var peakRSSKB: [String: Int]
        var series: [(second: Int, count: Int, p50: UInt64, p99: UInt64)]
        var progress: [Progress]
        var loadSeconds: Double
        /// Redis's memory and commands before and after (nil when INFO could not be read).
        var redis: RedisFootprint?

        func consistencyProblems() -> [String] {
            var p: [String] = []
            let suppressed = observedSuppressed.values.reduce(0, +)
            if delivered + suppressed + renderErrors != recipients {
                p.append(
                    "delivered \(delivered) + suppressed \(suppressed) + render errors \(renderErrors) != recipients \(recipients)"
                )
            }
            if lost > 0 { p.append("\(lost) lost") }
            if !duplicates.isEmpty { p.append("\(duplicates.count) duplicated") }
            if unexpected200 > 0 { p.append("\(unexpected200) unexpected notifications") }
            if publishFailed > 0 { p.append("\(publishFailed) events not accepted by the broker") }
            if predictedSuppressed.filter({ $0.value > 0 }) != observedSuppressed.filter({ $0.value > 0 }) {
                p.append("suppressions by reason differ from the prediction")
            }
            return p
        }
    }

    func step() {
        ledger.ingest(tail.poll())
    }

    func printProgress(start: Double, lastDelivered: inout Int, lastT: inout Double) {
        let t = monotonicSeconds() - start
        let m = StageMetrics.scrape(session.info)
        let lag = m.sum("herald_consumer_lag")
        let rate = Double(ledger.delivered - lastDelivered) / max(0.001, t - lastT)
        progress.append(Progress(t: t, published: eventsPublished, delivered: ledger.delivered, rate: rate, lag: lag))
        if !quiet {
            log(
                String(
                    format:
                        "t=%5.1fs published %d events, delivered %d of %d notifications (%.0f/s), consumer lag %.0f records, duplicates %d, resolve RSS %d MB",
                    t, eventsPublished, ledger.delivered, ledger.expectedCount, rate, lag, ledger.duplicates.count,
                    procs.rssKB("resolve") / 1024))
        }
        lastDelivered = ledger.delivered
        lastT = t
    }

    func run(mode: Mode, mixed: Double?, drainTimeout: Double) async throws -> Result {
        procs.sample()
        let start = monotonicSeconds()
        var lastDelivered = 0, lastT = 0.0
        var nextProgress = 1.0
        var n = 0, mixedN = 0
        var modeText = ""
        let tickEvery = 0.01
        func housekeeping() async {
            let t = monotonicSeconds() - start
            if t >= nextProgress {
                await publisher.retryFailures()
                step()
                procs.sample()
                printProgress(start: start, lastDelivered: &lastDelivered, lastT: &lastT)
                if let onTick { await onTick(t) }
                nextProgress += 1
            }
        }
        func mixedDue(_ t: Double) async {
            guard let mr = mixed, mr > 0 else { return }
            while Double(mixedN) <= t * mr {
                let call = workload.callEvent(mixedN, createdAt: nowMillis())
                let direct = workload.directEvent(mixedN, createdAt: nowMillis())
                if mixedN < mixedWarmup { ledger.unmeasured.formUnion(call.notifications + direct.notifications) }
                await publish(call)
                await publish(direct)
                mixedN += 1
            }
        }
        var inputEnd = 0.0
        switch mode {
        case .backlog(let count):
            modeText = "backlog of \(count) group events"
            if mixed == nil {
                while n < count {
                    await publish(workload.groupEvent(n, createdAt: nowMillis()))
                    n += 1
                    if n % 1000 == 0 { await housekeeping() }
                }
                inputEnd = monotonicSeconds() - start
            } else {
                // Publish the backlog, then keep the mixed traffic going while it drains.
                while n < count {
                    await publish(workload.groupEvent(n, createdAt: nowMillis()))
                    n += 1
                    if n % 1000 == 0 { await housekeeping() }
                }
                let mixedStart = monotonicSeconds()
                while ledger.delivered(.group) < (ledger.expectedByKind[.group] ?? 0)
                    && monotonicSeconds() - mixedStart < 600
                {
                    await mixedDue(monotonicSeconds() - mixedStart)
                    step()
                    await housekeeping()
                    try await Task.sleep(for: .milliseconds(20))
                    let quietFor = Double(nowMillis() - max(ledger.lastDeliveryAt, ledger.origin)) / 1000
                    if quietFor > drainTimeout { break }
                }
                inputEnd = monotonicSeconds() - start
            }
        case .rate(let r, let secs):
            modeText = String(format: "%.0f group events/s for %.0f s", r, secs)
            while true {
                let t = monotonicSeconds() - start
                if t >= secs { break }
                let due = Int(t * r)
                while n < due {
                    await publish(workload.groupEvent(n, createdAt: nowMillis()))
                    n += 1
                }
                await mixedDue(t)
                await housekeeping()
                try await Task.sleep(for: .milliseconds(Int(tickEvery * 1000)))
            }
            inputEnd = monotonicSeconds() - start
        }
        await publisher.flush()
        // Drain: until every expected notification arrived and the suppression counters caught up,
        // or nothing new happened for drainTimeout seconds.
        var lastChange = monotonicSeconds()
        var lastSeen = (-1, -1.0)
        while true {
            step()
            await housekeeping()
            let m = StageMetrics.scrape(session.info)
            let suppressed = m.sum("herald_suppressed_total") - metricsBefore.sum("herald_suppressed_total")
            let predicted = Double(predictedSuppressed.values.reduce(0, +))
            if ledger.delivered >= ledger.expectedCount && suppressed >= predicted {
                // One more look for duplicates still in flight.
                try await Task.sleep(for: .milliseconds(1500))
                step()
                break
            }
            if ledger.delivered != lastSeen.0 || suppressed != lastSeen.1 {
                lastSeen = (ledger.delivered, suppressed)
                lastChange = monotonicSeconds()
            } else if monotonicSeconds() - lastChange > drainTimeout {
                log("nothing new for \(Int(drainTimeout)) s: stopping with \(ledger.lost) notifications missing")
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        procs.sample()
        let driveSeconds = monotonicSeconds() - start
        _ = inputEnd
        await publisher.close()
        var result = makeResult(modeText: modeText, mixed: mixed != nil, driveSeconds: driveSeconds)
        if let redisBefore, let after = try? await RedisSnapshot.read(port: session.info.redisPort) {
            result.redis = RedisFootprint(before: redisBefore, after: after)
        }
        return result
    }

    func makeResult(modeText: String, mixed: Bool, driveSeconds: Double) -> Result {
        let after = StageMetrics.scrape(session.info)
        var observed: [String: Int] = [:]
        let before = metricsBefore.byLabel("herald_suppressed_total", label: "reason")
        for (r, v) in after.byLabel("herald_suppressed_total", label: "reason") {
            let d = Int(v - (before[r] ?? 0))
            if d != 0 { observed[r] = d }
        }
        let dlq = Int(after.sum("herald_dlq_total") - metricsBefore.sum("herald_dlq_total"))
        var cpu: [String: Double] = [:]
        var rss: [String: Int] = [:]
        for c in ProcessAccounting.components {
            cpu[c] = procs.cpuSeconds(c)
            rss[c] = procs.peakRSSKB(c)
        }
        let secs = ledger.perSecond.keys.sorted()
        let series = secs.map { s -> (Int, Int, UInt64, UInt64) in
            let e = ledger.perSecond[s]!
            return (s, e.count, e.hist.valueAtPercentile(50), e.hist.valueAtPercentile(99))
        }
        // Delivery window: first to last answer second (what delivered/s is computed over).
        let deliverySeconds: Double
        if let first = secs.first, ledger.delivered > 0 {
            let firstMs = ledger.origin + Int64(first) * 1000
            deliverySeconds = max(1, Double(ledger.lastDeliveryAt - max(firstMs, ledger.origin)) / 1000)
        } else {
            deliverySeconds = driveSeconds
        }
        var perKind: [NotificationKind: Percentiles] = [:]
        for (k, h) in ledger.perKind { perKind[k] = Percentiles(h) }
        return Result(
            options: workloadOptions, mode: modeText, mixed: mixed, eventsPublished: eventsPublished,
            eventsByKind: eventsByKind, publishFailed: publisher.unrecovered, republished: publisher.republished,
            recipients: recipientsDecided, expected: ledger.expectedCount, delivered: ledger.delivered,
            lost: ledger.lost, duplicates: ledger.duplicates, unexpected200: ledger.unexpected200,
            answersByStatus: ledger.answersByStatus, predictedSuppressed: predictedSuppressed,
            observedSuppressed: observed, dlq: dlq, renderErrors: renderErrors,
            overall: Percentiles(ledger.overall), perKind: perKind, driveSeconds: driveSeconds,
            deliverySeconds: deliverySeconds, deliveredPerSecond: Double(ledger.delivered) / deliverySeconds,
            cpu: cpu, peakRSSKB: rss, series: series, progress: progress, loadSeconds: loadSeconds, redis: nil)
    }
}
