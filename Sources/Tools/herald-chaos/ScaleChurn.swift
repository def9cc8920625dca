// The scale-churn scenario: what an autoscaler and a rolling release do to a fleet, under load.
import Foundation
import Glibc
import HeraldBenchSupport
import Synchronization

extension ChaosRunner {
    /// Every `spacing` seconds one stage (round robin over all six) gets an extra process, with the same command line
    /// and environment and a metrics port of its own (`STAGE@1`, scripts/local-stack.sh), and that process gets
    /// SIGTERM `lifetime` seconds later: a scale-out and a scale-in. Halfway through, every stage is rolled as a
    /// Deployment with `maxSurge: 1` rolls it: a new process (`STAGE@2`) starts and becomes ready, then the old
    /// one gets SIGTERM; the stage's own process is then started again and the surge process stopped, so the
    /// stack ends as it began. Passes with nothing lost, nothing woken twice, every notification delivered within
    /// 30 s of the last event, and every stopped process gone with status 0 before its shutdown deadline.
    func scaleChurn() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        // Events of five-member groups, every member awake: 4 notifications an event. The reduced run (CI's) is
        // 250 events/s, 1,000 notifications/s; the full one 500 events/s (2,000 notifications/s) for 60 s, a scale
        // event every 6 s, each extra process living 8 s: 120,000 notifications.
        let rate = reduced ? 250.0 : 500.0
        let seconds = reduced ? 40.0 : 60.0
        let spacing = reduced ? 4.0 : 6.0
        let lifetime = reduced ? 6.0 : 8.0
        let rollAt = seconds / 2
        let driver = try await LoadDriver(session: session, workload: workload(mix: false))
        driver.drainWaitsForSuppressions = false
        let faults = FaultLog()
        let membership = MembershipLog()
        var nextScale = 3.0
        var scaleIndex = 0
        var rolled = false
        let control = session.control

        // The script calls below block until a process is ready or gone (seconds): they run on threads of their own,
        // never on Swift's cooperative pool (two blocked calls would stall the load driver on a 2-core host).
        /// SIGTERM to one process and the wait for its exit; the exit status and the seconds it took are noted.
        @Sendable func stop(_ name: String) {
            let at = nowMillis()
            do {
                let exited = try control.stopStage(name, timeout: 30)
                let status = session.info.exitStatus(stage: name)
                faults.add(.init(stage: name, action: "SIGTERM", at: at, status: status))
                membership.stopped(name, seconds: Double(nowMillis() - at) / 1000)
                if !exited { faults.note("\(name) did not exit within 30 s of SIGTERM") }
            } catch {
                faults.note("stopping \(name) failed: \(error)")
            }
        }
        @Sendable func start(_ name: String) -> Bool {
            do {
                try control.start(name)  // returns once /readyz answers (the group joined)
                membership.started(name)
                return true
            } catch {
                faults.note("starting \(name) failed: \(error)")
                return false
            }
        }

        driver.onTick = { t in
            if t >= nextScale, t < seconds - lifetime {
                nextScale += spacing
                let stage = stageNames[scaleIndex % stageNames.count]
                scaleIndex += 1
                let extra = stage + "@1"
                Thread.detachNewThread {
                    guard start(extra) else { return }
                    usleep(UInt32(lifetime * 1_000_000))
                    stop(extra)
                }
            }
            if !rolled, t >= rollAt {
                rolled = true
                Thread.detachNewThread {
                    for stage in stageNames {
                        let surge = stage + "@2"
                        guard start(surge) else { continue }
                        stop(stage)
                        _ = start(stage)
                        stop(surge)
                    }
                    membership.rollDone()
                }
            }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: 30)
        // The roll may still be under way when the load ends (a debug build's start takes seconds): wait for it.
        let rollDeadline = monotonicSeconds() + 180
        while !membership.isRollDone, monotonicSeconds() < rollDeadline { try await Task.sleep(for: .seconds(1)) }
        var problems = faultProblems(faults, session)
        if !membership.isRollDone { problems.append("the rolling restart did not finish") }
        let bad = faults.all.filter { $0.status != 0 }
        if !bad.isEmpty {
            problems.append(
                "exit status ≠ 0: "
                    + bad.map { "\($0.stage)=\($0.status.map(String.init) ?? "none")" }.joined(separator: ", "))
        }
        let changes = membership.changes
        let slowest = membership.slowestStop
        return outcome(
            r, extraProblems: problems,
            detail: String(
                format:
                    "%d membership changes (%d scale events, every stage rolled); %d notifications at %.0f events/s; latency p50 %d ms, p99 %d ms, max %d ms; slowest exit after SIGTERM %.1f s",
                changes, scaleIndex, r.expected, rate, r.overall.p50, r.overall.p99, r.overall.max, slowest))
    }
}

/// What the churn did, for the verdict line.
final class MembershipLog: Sendable {
    private struct Counts {
        var joins = 0
        var leaves = 0
        var slowest = 0.0
        var rollFinished = false
    }

    private let counts = Mutex(Counts())

    func started(_ name: String) { counts.withLock { $0.joins += 1 } }
    func stopped(_ name: String, seconds: Double) {
        counts.withLock {
            $0.leaves += 1
            $0.slowest = max($0.slowest, seconds)
        }
    }
    func rollDone() { counts.withLock { $0.rollFinished = true } }
    var changes: Int { counts.withLock { $0.joins + $0.leaves } }
    var slowestStop: Double { counts.withLock { $0.slowest } }
    var isRollDone: Bool { counts.withLock { $0.rollFinished } }
}
