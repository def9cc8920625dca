// The signal scenarios: every stage killed in turn with SIGKILL under load (duplicates excused only within the crash
// window of send), and every stage stopped in turn with SIGTERM (each must exit 0 and lose nothing).
import Foundation
import Glibc
import HeraldBenchSupport

extension ChaosRunner {
    /// Every 4 s under load the next stage (round robin) is killed with SIGKILL and started again a second later.
    /// Nothing may be lost; a duplicate is excused only when send was the stage killed and the notification's first
    /// answer came within `--crash-window-ms` before the kill.
    func sigkillRoundRobin() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        let rate = reduced ? 100.0 : 1000.0
        let seconds = reduced ? 30.0 : 120.0
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        let killEvery = 4.0
        var nextKill = killEvery
        var index = 0
        driver.onTick = { t in
            guard t >= nextKill, t < seconds - 1 else { return }
            nextKill += killEvery
            let stage = stageNames[index % stageNames.count]
            index += 1
            guard let pid = session.info.pid(stage) else { faults.note("no pid for \(stage)"); return }
            kill(pid, SIGKILL)
            faults.add(.init(stage: stage, action: "SIGKILL", at: nowMillis(), status: nil))
            Task.detached {
                try? await Task.sleep(for: .seconds(1))
                do { try session.control.start(stage) } catch { faults.note("restart of \(stage) failed: \(error)") }
            }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: drainTimeout)
        // Attribute each duplicate to the last kill before its second answer.
        let kills = faults.all.sorted { $0.at < $1.at }
        var perKill = [Int](repeating: 0, count: kills.count)
        var excusedPerKill = [Int](repeating: 0, count: kills.count)
        var unattributed = 0
        for d in r.duplicates {
            guard let k = kills.lastIndex(where: { $0.at <= d.againAt }) else { unattributed += 1; continue }
            perKill[k] += 1
            if kills[k].stage == "send", d.firstAt <= kills[k].at, kills[k].at - d.firstAt <= options.crashWindowMs {
                excusedPerKill[k] += 1
            }
        }
        let excused = excusedPerKill.reduce(0, +)
        let perKillText = kills.enumerated().map { i, k in
            "\(k.stage)@\(String(format: "%.0f", Double(k.at - driver.ledger.origin) / 1000))s:\(perKill[i])"
                + (excusedPerKill[i] > 0 ? "(\(excusedPerKill[i]) excused)" : "")
        }.joined(separator: " ")
        var problems = faults.allNotes
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        return outcome(
            r, excusedDuplicates: excused, extraProblems: problems,
            detail: "\(kills.count) kills; duplicates per kill: \(perKillText)"
                + (unattributed > 0 ? "; \(unattributed) before any kill" : ""))
    }

    // MARK: SIGTERM of every stage

    /// Under load each stage in turn gets SIGTERM and is started again once it has exited: every stage must exit with
    /// status 0 within 15 s, and nothing may be lost or duplicated.
    func sigtermEach() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        let rate = reduced ? 100.0 : 300.0
        let spacing = reduced ? 4.0 : 6.0
        let seconds = 3 + spacing * Double(stageNames.count) + 2
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        var index = 0
        driver.onTick = { t in
            guard index < stageNames.count, t >= 3 + spacing * Double(index) else { return }
            let stage = stageNames[index]
            index += 1
            guard let pid = session.info.pid(stage) else { faults.note("no pid for \(stage)"); return }
            kill(pid, SIGTERM)
            let at = nowMillis()
            Task.detached {
                var status: Int?
                for _ in 0..<300 {
                    if let s = session.info.exitStatus(stage: stage) { status = s; break }
                    try? await Task.sleep(for: .milliseconds(50))
                }
                faults.add(.init(stage: stage, action: "SIGTERM", at: at, status: status))
                if status == nil {
                    faults.note("\(stage) did not exit within 15 s of SIGTERM")
                    kill(pid, SIGKILL)
                }
                do { try session.control.start(stage) } catch { faults.note("restart of \(stage) failed: \(error)") }
            }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: drainTimeout)
        try await Task.sleep(for: .seconds(1))
        let entries = faults.all
        var problems = faults.allNotes
        let bad = entries.filter { $0.status != 0 }
        if !bad.isEmpty {
            problems.append(
                "exit status ≠ 0: "
                    + bad.map { "\($0.stage)=\($0.status.map(String.init) ?? "none")" }.joined(separator: ", "))
            // What the stage printed last (a crash's message, a failed shutdown step), for a report that only shows
            // the end of the output.
            for entry in bad {
                problems.append(
                    "\(entry.stage)'s log ends: " + session.info.logTail(stage: entry.stage).joined(separator: " / "))
            }
        }
        if entries.count < stageNames.count {
            problems.append("only \(entries.count) of \(stageNames.count) stages were stopped")
        }
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        let statuses = entries.map { "\($0.stage)=\($0.status.map(String.init) ?? "?")" }.joined(separator: " ")
        return outcome(r, extraProblems: problems, detail: "exit statuses: \(statuses)")
    }
}
