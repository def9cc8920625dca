// How herald-chaos runs one scenario: a fresh local stack per scenario, the load, the fault log the fault tasks
// write, and the common verdict (nothing lost, nothing duplicated unless excused). The scenarios are extensions of
// `ChaosRunner`, a file each (or a file per family).
import Foundation
import Glibc
import HeraldBenchSupport
import Synchronization

/// A process's resident memory while a scenario runs: its size at the last sample before the fault started, and the
/// largest seen. Written and read only by the load driver's tick and after the run.
final class MemoryWatch {
    var beforeKB = 0
    var peakKB = 0
    var growthMB: Double { Double(peakKB - beforeKB) / 1024 }
}

/// Thread-safe list of fault events (the fault tasks run beside the load loop).
final class FaultLog: Sendable {
    struct Entry { var stage: String; var action: String; var at: Int64; var status: Int? }
    private let entries = Mutex<[Entry]>([])
    private let notes = Mutex<[String]>([])
    func add(_ e: Entry) { entries.withLock { $0.append(e) } }
    func note(_ s: String) { notes.withLock { $0.append(s) } }
    var all: [Entry] { entries.withLock { $0 } }
    var allNotes: [String] { notes.withLock { $0 } }
}

struct ChaosRunner {
    let options: ChaosCommand
    let scenario: ChaosScenario
    /// Notes the first starts that failed while the scenario ran (each stack is tried once more; see
    /// `BenchSession.open`).
    let startFailures = FaultLog()
    var reduced: Bool { options.reduced }
    /// How long a drain waits for something new before it gives up (the rest counts as lost).
    var drainTimeout: Double { reduced ? 15 : 40 }

    func workload(conversationSize: Int = 5, mix: Bool = true) -> WorkloadOptions {
        var w = WorkloadOptions()
        w.users = 2000
        w.conversationSize = conversationSize
        if !mix { w.dnd = 0; w.muted = 0; w.online = 0 }
        return w
    }

    /// The run directory of this scenario's stack (its `logs/` stay after the stack is stopped).
    var runDir: String? { (try? baseRunDir()).map { $0 + "/" + scenario.rawValue } }

    /// Where every scenario's stack of this run goes: `--run-dir`, else `run/chaos-<pid>` in the repository.
    func baseRunDir() throws -> String {
        try options.stack.runDir ?? (try options.stack.repo ?? StackControl.findRepo()) + "/run/chaos-\(getpid())"
    }

    /// After a failure: each stage's last warnings and errors, so that a CI log says what the stages saw.
    func printLogTails(lines: Int = 6) {
        guard var dir = runDir else { return }
        if FileManager.default.fileExists(atPath: dir + "-again/logs") { dir += "-again" }
        for stage in stageNames {
            guard let text = try? String(contentsOfFile: "\(dir)/logs/\(stage).log", encoding: .utf8) else { continue }
            let notable = text.split(separator: "\n").filter {
                $0.contains("\"level\":\"warning\"") || $0.contains("\"level\":\"error\"")
                    || $0.contains("\"level\":\"critical\"")
            }
            guard !notable.isEmpty else { continue }
            log("\(stage): last \(min(lines, notable.count)) of \(notable.count) warnings and errors")
            for line in notable.suffix(lines) { log("  " + String(line.prefix(400))) }
        }
    }

    func open(
        mockArgs: String = "", redisAOF: Bool = false, kafkaS3: Bool = false, redisCluster: Bool = false
    ) throws
        -> BenchSession
    {
        var o = options.stack
        o.runDir = try baseRunDir()
        let session = try BenchSession.open(
            o, mockArgs: mockArgs, redisAOF: redisAOF, kafkaS3: kafkaS3, redisCluster: redisCluster,
            runSuffix: "/" + scenario.rawValue)
        if let failure = session.firstStartFailure { startFailures.note(failure) }
        return session
    }

    func run() async throws -> ChaosOutcome {
        switch scenario {
        case .malformed: return try await malformedFlood()
        case .sigkill: return try await sigkillRoundRobin()
        case .sigterm: return try await sigtermEach()
        case .redis: return try await restart(component: "redis")
        case .brokerDown: return try await brokerDown()
        case .leaderMove: return try await leaderMove()
        case .apnsFaults: return try await apnsFaultMix()
        case .apnsStall: return try await apnsStall()
        case .hostileAPI: return try await hostileAPI()
        case .redisMasterKill: return try await redisMasterKill()
        case .redisSlotMove: return try await redisSlotMove()
        case .scaleChurn: return try await scaleChurn()
        case .extremeRecords: return try await extremeRecords()
        case .collectorRefused: return try await traceCollector(fault: .refuse)
        case .collectorHung: return try await traceCollector(fault: .hold)
        }
    }

    /// Sets the driver's tick to start a fault once, `at` seconds into the load, and to sample the resident memory of
    /// `process` (a stage or component of the stack), if one is named, at every tick.
    @discardableResult
    func startFault(
        at: Double, watching process: String? = nil, driver: LoadDriver, session: BenchSession,
        _ start: @escaping () -> Void
    ) -> MemoryWatch {
        let memory = MemoryWatch()
        var started = false
        driver.onTick = { t in
            if let process, let pid = session.info.pid(process), let s = procSample(pid) {
                if !started { memory.beforeKB = s.rssKB }
                memory.peakKB = max(memory.peakKB, s.rssKB)
            }
            guard !started, t >= at else { return }
            started = true
            start()
        }
        return memory
    }

    func stagesAlive(_ s: BenchSession) -> [String] { stageNames.filter { !s.info.isAlive($0) } }

    /// What went wrong besides the counts: the fault log's notes, and the stages no longer running.
    func faultProblems(_ faults: FaultLog, _ session: BenchSession) -> [String] {
        let dead = stagesAlive(session)
        return faults.allNotes + (dead.isEmpty ? [] : ["not running at the end: \(dead.joined(separator: ", "))"])
    }

    /// The common verdict: nothing lost, nothing duplicated (unless excused), counts consistent.
    func outcome(
        _ r: LoadDriver.Result, excusedDuplicates: Int = 0, extraProblems: [String] = [], detail: String
    ) -> ChaosOutcome {
        var problems = extraProblems
        if r.lost > 0 { problems.append("\(r.lost) lost") }
        let unexcused = r.duplicates.count - excusedDuplicates
        if unexcused > 0 { problems.append("\(unexcused) duplicates not excused") }
        if r.unexpected200 > 0 { problems.append("\(r.unexpected200) unexpected notifications") }
        if r.publishFailed > 0 { problems.append("\(r.publishFailed) events not accepted by the broker") }
        let d = ([detail] + problems).filter { !$0.isEmpty }.joined(separator: "; ")
        return ChaosOutcome(
            scenario: scenario, passed: problems.isEmpty, lost: r.lost, duplicated: r.duplicates.count,
            deadLettered: r.dlq, detail: d)
    }
}
