// A local stack to measure: the options that start or attach to one, the started stack, and the load driver
// that loads users, publishes events and follows the stand-in's record (herald-bench pipeline, herald-chaos).
import ArgumentParser
import Foundation
import Glibc
import HeraldCore

/// Options shared by `pipeline` and `chaos` for starting or attaching to a stack.
package struct StackOptions: ParsableArguments {
    @Option(
        help:
            "Attach to a stack already running in this run directory (scripts/local-stack.sh --up --run-dir DIR) instead of starting one."
    )
    package var attach: String?
    @Option(
        name: .customLong("run-dir"), help: "Run directory of the stack the bench starts (default: run/bench-<pid>).")
    package var runDir: String?
    @Option(help: "Repository root (default: found from the working directory or the executable).")
    package var repo: String?
    @Flag(
        name: .customLong("build"),
        help: "Let scripts/local-stack.sh build the release products first (default: use the existing build).")
    package var build = false
    @Flag(help: "Use the debug build (.build/debug) for the stack.")
    package var debug = false
    @Flag(name: .customLong("keep"), help: "Leave the started stack running at the end.")
    package var keep = false
    @Option(
        name: .customLong("broker-nice"),
        help:
            "Nice value of the broker the bench starts (0-19; default 0). On a host the broker shares with the stages, 19 lets a stage have a core when it needs one, as it would with the broker elsewhere."
    )
    package var brokerNice = 0
    @Option(
        name: .customLong("redis-rtt-ms"),
        help:
            "Round trip in milliseconds between the stages and Redis (default 0): the stages reach Redis through a relay in the bench that delays each way by half of it, as a Redis on another machine would. Not with a Redis Cluster."
    )
    package var redisRttMs = 0.0
    @Flag(
        name: .customLong("realtime"),
        help:
            "Once the stack is up, give the six stages, Redis and the stand-ins real-time scheduling (SCHED_RR, priority 10; needs root or CAP_SYS_NICE), so each gets a core as soon as it can run, as on cores of its own; the broker and the bench stay as they are. The time per hop then measures Herald's own work rather than its waits for a core on a host it shares."
    )
    package var realtime = false
    package init() {}
}

/// A started (or attached) stack plus how to control it.
package final class BenchSession: @unchecked Sendable {
    package let control: StackControl
    package var info: StackInfo
    package let started: Bool
    package let repo: String
    /// Between the stages and Redis with `--redis-rtt-ms`.
    package let redisRelay: DelayRelay?
    /// Why the first start failed, when the stack came up only at the second.
    package private(set) var firstStartFailure: String?

    package init(control: StackControl, info: StackInfo, started: Bool, repo: String, redisRelay: DelayRelay? = nil) {
        self.control = control; self.info = info; self.started = started; self.repo = repo
        self.redisRelay = redisRelay
    }

    package static func open(
        _ o: StackOptions, mockArgs: String, redisAOF: Bool = false, kafkaS3: Bool = false, redisCluster: Bool = false,
        runSuffix: String = "", stages: [String]? = nil
    ) throws -> BenchSession {
        let repo = try o.repo ?? StackControl.findRepo()
        if let attach = o.attach {
            let info = try StackInfo.load(run: attach)
            if o.realtime { try makeRealtime(info) }
            return BenchSession(
                control: StackControl(repo: repo, run: attach, environment: [:]), info: info, started: false, repo: repo
            )
        }
        let run = (o.runDir ?? repo + "/run/bench-\(getpid())") + runSuffix
        // A start that fails is tried once more on fresh ports in a fresh run directory: a port that was free when
        // it was picked can be bound by another program of a shared host before the stack binds it. What went wrong
        // the first time is printed (the logs' last lines), so a start-up fault of Herald itself still shows, and a
        // second failure fails the run.
        func start(in run: String) throws -> BenchSession {
            try openOnce(
                o, repo: repo, run: run, mockArgs: mockArgs, redisAOF: redisAOF, kafkaS3: kafkaS3,
                redisCluster: redisCluster, stages: stages)
        }
        do {
            return try start(in: run)
        } catch let first {
            log("the stack did not start: \(first)")
            printLogTails(run: run)
            log("starting it once more on fresh ports in \(run)-again")
            do {
                let session = try start(in: run + "-again")
                session.firstStartFailure = "\(first)"
                return session
            } catch let second {
                printLogTails(run: run + "-again")
                throw BenchError("\(second) (and the first start before it: \(first))")
            }
        }
    }

    private static func openOnce(
        _ o: StackOptions, repo: String, run: String, mockArgs: String, redisAOF: Bool, kafkaS3: Bool,
        redisCluster: Bool, stages: [String]?
    ) throws -> BenchSession {
        var environment = StackControl.portEnvironment(redisCluster: redisCluster)
        if o.brokerNice != 0 { environment["HERALD_TANSU_NICE"] = String(min(max(o.brokerNice, 0), 19)) }
        var relay: DelayRelay?
        if o.redisRttMs > 0 {
            if redisCluster { throw BenchError("--redis-rtt-ms works with one Redis node, not a cluster") }
            guard let redisPort = environment["HERALD_LOCAL_REDIS_PORT"].flatMap({ Int($0) }) else {
                throw BenchError("no Redis port for the relay")
            }
            // The relay connects to Redis when a stage connects to it, after the script has started Redis.
            let made = try DelayRelay(to: redisPort, oneWay: .microseconds(Int64(o.redisRttMs * 500)))
            environment["HERALD_LOCAL_STAGE_REDIS_URL"] = "redis://127.0.0.1:\(made.port)"
            relay = made
        }
        let control = StackControl(repo: repo, run: run, environment: environment)
        log(
            "starting the stack in \(run) (ports: \(control.environment.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")))"
        )
        do {
            try control.up(
                redisAOF: redisAOF, kafkaS3: kafkaS3, redisCluster: redisCluster, mockArgs: mockArgs, build: o.build,
                debug: o.debug, stages: stages)
            if o.realtime { try makeRealtime(try StackInfo.load(run: run)) }
        } catch {
            control.down()
            relay?.stop()
            throw error
        }
        return BenchSession(
            control: control, info: try StackInfo.load(run: run), started: true, repo: repo, redisRelay: relay)
    }

    /// `--realtime`: every thread of the stages, Redis (each node of a cluster), the stand-ins and herald-dev-broker
    /// (the local broker, when the stack runs it; Tansu is left as it is) to SCHED_RR at priority 10. Threads they start later inherit it (a new thread takes its creator's policy). Returns the
    /// components it reached (and logs them); throws when the kernel refuses (not root, no CAP_SYS_NICE).
    @discardableResult
    static func makeRealtime(_ info: StackInfo) throws -> [String] {
        let components =
            stageNames + ["redis"] + (0..<6).map { "redis-\($0)" } + ["mock-apns", "mock-fcm"]
            + (info.broker == "dev" ? ["kafka"] : [])
        var param = sched_param(sched_priority: 10)
        var given: [String] = []
        for component in components {
            guard let pid = info.pid(component), pid > 0, kill(pid, 0) == 0 else { continue }
            for tid in threadIDs(of: pid) {
                if sched_setscheduler(tid, SCHED_RR, &param) != 0 {
                    let code = errno
                    if code == ESRCH { continue }  // the thread ended meanwhile
                    throw BenchError(
                        "--realtime: the kernel refused SCHED_RR for \(component) (thread \(tid)): "
                            + String(cString: strerror(code)) + " (it needs root or CAP_SYS_NICE)")
                }
            }
            given.append(component)
        }
        log("real-time scheduling (SCHED_RR, priority 10) for " + given.joined(separator: ", "))
        return given
    }

    /// The last lines of each log of a stack that did not start (the script's own messages are above them).
    private static func printLogTails(run: String, lines: Int = 8) {
        let logs =
            ((try? FileManager.default.contentsOfDirectory(atPath: run + "/logs")) ?? []).sorted()
            .map { run + "/logs/" + $0 } + [run + "/tansu/tansu.log", run + "/kafka/dev-broker.log"]
        for path in logs {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8), !text.isEmpty else { continue }
            let tail = text.split(separator: "\n", omittingEmptySubsequences: true).suffix(lines)
            log("\(path), last \(tail.count) lines:\n" + tail.map { "    " + $0 }.joined(separator: "\n"))
        }
    }

    package func close(keep: Bool) {
        if started && !keep {
            log("stopping the stack")
            control.down()
        }
    }
}

/// Loads the users, drives events, follows the stand-in's record and the stages' metrics.
package final class LoadDriver: @unchecked Sendable {
    package enum Mode {
        case backlog(Int)
        case rate(Double, Double)
    }

    package struct Progress {
        package var t: Double
        package var published: Int
        package var delivered: Int
        package var rate: Double
        package var lag: Double
    }

    package let session: BenchSession
    package let workload: Workload
    package let publisher: EventPublisher
    package let ledger: Ledger
    package let tail: RecordTail
    package let procs: ProcessAccounting
    package var metricsBefore: StageMetrics
    /// The stages' metrics once the warm-up is over (`ledger.latencyFrom`): where the time per hop is measured from
    /// (`metricsBefore` without a warm-up).
    package var hopBaseline: StageMetrics?
    /// Each stage's threads' run-queue figures when `hopBaseline` was taken (or at the start), by stage.
    package var runQueueBaseline: [String: RunQueueSample] = [:]
    /// Redis once the users' state is loaded (nil when it could not be read).
    package var redisBefore: RedisSnapshot?
    package var predictedSuppressed: [String: Int] = [:]
    package var renderErrors = 0
    package var eventsPublished = 0
    package var eventsByKind: [NotificationKind: Int] = [:]
    package var recipientsDecided = 0
    package var progress: [Progress] = []
    package var workloadOptions: WorkloadOptions
    package var loadSeconds = 0.0
    /// Called once a second while driving (chaos uses it for its faults).
    package var onTick: ((Double) async -> Void)?
    /// Whether the drain also waits for the stages' suppression counters to reach the predicted suppressions. Off
    /// when processes come and go during the run (their counters are not all scraped, and a restarted process
    /// counts from zero): the drain then ends with the last expected delivery.
    package var drainWaitsForSuppressions = true
    /// The first this many calls and DMs are left out of the latency figures.
    package var mixedWarmup = 0
    package var quiet = false

    package init(session: BenchSession, workload options: WorkloadOptions) async throws {
        self.session = session
        workloadOptions = options
        let now = nowMillis()
        workload = try Workload(options: options, pipelineFile: session.info.pipelineFile, now: now)
        let t0 = monotonicSeconds()
        try await workload.load(redisURL: session.info.redisURL, now: now)
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

    package func publish(_ p: PlannedEvent) async {
        for id in p.notifications { ledger.expect(apnsID: id, createdAt: p.createdAt, kind: p.kind) }
        for (r, n) in p.suppressed { predictedSuppressed[r, default: 0] += n }
        renderErrors += p.renderErrors
        recipientsDecided += p.notifications.count + p.suppressed.values.reduce(0, +) + p.renderErrors
        eventsPublished += 1
        eventsByKind[p.kind, default: 0] += 1
        await publisher.publish(key: p.key, value: p.bytes)
    }

    package struct Result {
        package var options: WorkloadOptions
        package var mode: String
        package var mixed: Bool
        package var eventsPublished: Int
        package var eventsByKind: [NotificationKind: Int]
        package var publishFailed: Int
        package var republished: Int
        package var recipients: Int
        package var expected: Int
        package var delivered: Int
        package var lost: Int
        package var duplicates: [Duplicate]
        package var unexpected200: Int
        package var answersByStatus: [Int: Int]
        package var predictedSuppressed: [String: Int]
        package var observedSuppressed: [String: Int]
        package var dlq: Int
        package var renderErrors: Int
        /// Explain entries the stages dropped (herald_explain_dropped_total over the run).
        package var explainDropped: Int = 0
        package var overall: Percentiles
        package var perKind: [NotificationKind: Percentiles]
        package var driveSeconds: Double
        package var deliverySeconds: Double
        package var deliveredPerSecond: Double
        package var cpu: [String: Double]
        package var peakRSSKB: [String: Int]
        package var series: [(second: Int, count: Int, p50: UInt64, p99: UInt64)]
        package var progress: [Progress]
        package var loadSeconds: Double
        /// Redis's memory and commands before and after (nil when INFO could not be read).
        package var redis: RedisFootprint?
        /// Herald's own time per hop, per stage, over the measured window (after the warm-up).
        package var hops: [HopLatency] = []

        package func consistencyProblems() -> [String] {
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

    package func step() {
        ledger.ingest(tail.poll())
    }

    /// The stages' threads' run-queue figures now, by stage.
    func stageRunQueues() -> [String: RunQueueSample] {
        var out: [String: RunQueueSample] = [:]
        for stage in stageNames {
            if let pid = session.info.pid(stage) { out[stage] = RunQueueSample(pid: pid) }
        }
        return out
    }

    /// Each stage's seconds running and waiting for a core since `baseline` (stages restarted since are left out).
    func runQueueSince(_ baseline: [String: RunQueueSample]) -> [String: (running: Double, waiting: Double)] {
        var out: [String: (running: Double, waiting: Double)] = [:]
        for (stage, now) in stageRunQueues() {
            guard let before = baseline[stage], before.pid == now.pid else { continue }
            out[stage] = now.since(before)
        }
        return out
    }

    package func printProgress(start: Double, lastDelivered: inout Int, lastT: inout Double) {
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

    package func run(mode: Mode, mixed: Double?, drainTimeout: Double) async throws -> Result {
        procs.sample()
        runQueueBaseline = stageRunQueues()
        let start = monotonicSeconds()
        var lastDelivered = 0, lastT = 0.0
        var nextProgress = 1.0
        var n = 0, mixedN = 0
        var modeText = ""
        let tickEvery = 0.01
        func housekeeping() async {
            let t = monotonicSeconds() - start
            if hopBaseline == nil, ledger.latencyFrom > 0, nowMillis() >= ledger.latencyFrom {
                hopBaseline = StageMetrics.scrape(session.info)
                runQueueBaseline = stageRunQueues()
            }
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
        // Drain: until every expected notification arrived and the suppression counters caught up, or nothing
        // moved anywhere in the pipeline for drainTimeout seconds. Records consumed or produced by any stage count
        // as movement as well as deliveries: a slow broker (Tansu on S3 on a busy host) can take longer than
        // drainTimeout between two deliveries while every hop still advances, and a stuck pipeline moves nothing.
        var lastChange = monotonicSeconds()
        var lastSeen = (-1, -1.0, -1.0)
        while true {
            step()
            await housekeeping()
            let m = StageMetrics.scrape(session.info)
            let suppressed = m.sum("herald_suppressed_total") - metricsBefore.sum("herald_suppressed_total")
            let predicted = Double(predictedSuppressed.values.reduce(0, +))
            if ledger.delivered >= ledger.expectedCount && (suppressed >= predicted || !drainWaitsForSuppressions) {
                // One more look for duplicates still in flight.
                try await Task.sleep(for: .milliseconds(1500))
                step()
                // The stages' explain entries still gathering (explain.write_interval_ms) are part of the run:
                // Redis's commands, memory and CPU are read once they are written.
                let deadline = monotonicSeconds() + 30
                while StageMetrics.scrape(session.info).sum("herald_explain_pending") > 0,
                    monotonicSeconds() < deadline
                {
                    try await Task.sleep(for: .milliseconds(100))
                }
                break
            }
            let moved = m.sum("herald_consumed_total") + m.sum("herald_produced_total")
            if ledger.delivered != lastSeen.0 || suppressed != lastSeen.1 || moved != lastSeen.2 {
                lastSeen = (ledger.delivered, suppressed, moved)
                lastChange = monotonicSeconds()
            } else if monotonicSeconds() - lastChange > drainTimeout {
                log(
                    "nothing moved for \(Int(drainTimeout)) s: stopping with \(ledger.lost) notifications missing ("
                        + stageNames.map { s in
                            "\(s) consumed \(Int(m.sum("herald_consumed_total", stage: s))) produced "
                                + "\(Int(m.sum("herald_produced_total", stage: s))) lag "
                                + "\(Int(m.sum("herald_consumer_lag", stage: s)))"
                        }.joined(separator: ", ") + ")")
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

    package func makeResult(modeText: String, mixed: Bool, driveSeconds: Double) -> Result {
        let after = StageMetrics.scrape(session.info)
        var observed: [String: Int] = [:]
        let before = metricsBefore.byLabel("herald_suppressed_total", label: "reason")
        for (r, v) in after.byLabel("herald_suppressed_total", label: "reason") {
            let d = Int(v - (before[r] ?? 0))
            if d != 0 { observed[r] = d }
        }
        let dlq = Int(after.sum("herald_dlq_total") - metricsBefore.sum("herald_dlq_total"))
        let explainDropped = Int(
            after.sum("herald_explain_dropped_total") - metricsBefore.sum("herald_explain_dropped_total"))
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
        var result = Result(
            options: workloadOptions, mode: modeText, mixed: mixed, eventsPublished: eventsPublished,
            eventsByKind: eventsByKind, publishFailed: publisher.unrecovered, republished: publisher.republished,
            recipients: recipientsDecided, expected: ledger.expectedCount, delivered: ledger.delivered,
            lost: ledger.lost, duplicates: ledger.duplicates, unexpected200: ledger.unexpected200,
            answersByStatus: ledger.answersByStatus, predictedSuppressed: predictedSuppressed,
            observedSuppressed: observed, dlq: dlq, renderErrors: renderErrors,
            overall: Percentiles(ledger.overall), perKind: perKind, driveSeconds: driveSeconds,
            deliverySeconds: deliverySeconds, deliveredPerSecond: Double(ledger.delivered) / deliverySeconds,
            cpu: cpu, peakRSSKB: rss, series: series, progress: progress, loadSeconds: loadSeconds, redis: nil,
            hops: HopLatency.measureAll(
                before: hopBaseline ?? metricsBefore, after: after, runQueue: runQueueSince(runQueueBaseline)))
        result.explainDropped = explainDropped
        return result
    }
}
