// herald-bench idle: what the local stack costs while nothing happens.
import ArgumentParser
import Foundation
import Glibc
import HeraldBenchSupport
import HeraldCore
import HeraldToolSupport

struct IdleBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "idle",
        abstract:
            "CPU of every process of the idle local stack, from /proc: each one's share of one core and the fleet's.",
        discussion: """
            Attaches to a running stack (--attach RUN) or starts one (scripts/local-stack.sh, as `pipeline` does),
            lets it settle, then reads each process's CPU time (utime + stime in /proc/PID/stat) at the start and the
            end of --seconds with no traffic. Prints each process's share of one core and the fleet's total against
            the targets (a stage at most 0.3 %, the fleet, broker included, at most 3 %), and writes IDLE.md and
            IDLE.json into --out (default run/bench-reports/idle-<time>-<pid>). A benchmark: it prints figures; --check
            makes a miss of a target the exit status.
            """)

    @OptionGroup var stack: StackOptions
    @Option(help: "Seconds to measure.") var seconds: Double = 60
    @Option(help: "Seconds to wait before measuring (a started stack's stages join their groups, then go idle).")
    var settle: Double = 20
    @Option(help: "Most a stage may use, percent of one core.") var stageTarget = 0.3
    @Option(help: "Most the whole fleet may use, broker included, percent of one core.") var fleetTarget = 3.0
    @Option(help: "Directory for IDLE.md and IDLE.json.") var out: String?
    @Flag(help: "Exit 1 when a process or the fleet is over its target.") var check = false

    func run() async throws {
        let session = try BenchSession.open(stack, mockArgs: "")
        defer { session.close(keep: stack.keep) }
        let info = session.info
        log("settling for \(Int(settle)) s")
        try await Task.sleep(for: .milliseconds(Int(settle * 1000)))
        let components = ProcessAccounting.components
        var before: [String: (pid: Int32, cpu: Double)] = [:]
        for c in components {
            if let pid = info.pid(c), let s = procSample(pid) { before[c] = (pid, s.cpuSeconds) }
        }
        let start = monotonicSeconds()
        log("measuring for \(Int(seconds)) s")
        try await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
        let elapsed = monotonicSeconds() - start
        var rows: [Row] = []
        for c in components {
            guard let b = before[c] else { continue }
            guard info.pid(c) == b.pid, let s = procSample(b.pid) else {
                throw BenchError("\(c) (pid \(b.pid)) exited or restarted during the measurement")
            }
            let used = s.cpuSeconds - b.cpu
            let isStage = stageNames.contains(c)
            rows.append(
                Row(
                    process: c, pid: b.pid, cpuSeconds: used, percentOfCore: used / elapsed * 100,
                    target: isStage ? stageTarget : nil))
        }
        let fleet = rows.reduce(0) { $0 + $1.cpuSeconds }
        let fleetPercent = fleet / elapsed * 100
        var lines = [
            String(
                format: "idle stack %@, %.1f s measured after %.0f s settling (clock ticks: %.0f/s)", info.run, elapsed,
                settle, clockTicks),
            "| process | pid | CPU-s | % of one core | target |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rows {
            let target =
                r.target.map { String(format: "<= %.1f %% %@", $0, r.percentOfCore <= $0 ? "ok" : "OVER") } ?? ""
            lines.append(
                String(
                    format: "| %@ | %d | %.2f | %.2f %% | %@ |", r.process, r.pid, r.cpuSeconds, r.percentOfCore, target
                ))
        }
        let fleetOK = fleetPercent <= fleetTarget
        lines.append(
            String(
                format: "| **fleet** | | %.2f | **%.2f %%** | <= %.1f %% %@ |", fleet, fleetPercent, fleetTarget,
                fleetOK ? "ok" : "OVER"))
        let text = lines.joined(separator: "\n")
        print(text)
        let outDir = out ?? session.repo + "/run/bench-reports/idle-" + PipelineBench.stamp()
        try FileManager.default.createDirectory(atPath: outDir, withIntermediateDirectories: true)
        let command = CommandLine.arguments.joined(separator: " ")
        try ("# herald-bench idle\n\n`\(command)`\n\n" + text + "\n").write(
            toFile: outDir + "/IDLE.md", atomically: true, encoding: .utf8)
        let json: JSONValue = .sorted([
            "command": .string(command), "seconds": .double(elapsed), "fleet_cpu_seconds": .double(fleet),
            "fleet_percent_of_core": .double(fleetPercent),
            "processes": .array(
                rows.map {
                    .sorted([
                        "process": .string($0.process), "cpu_seconds": .double($0.cpuSeconds),
                        "percent_of_core": .double($0.percentOfCore),
                    ])
                }),
        ])
        try json.prettyPrinted.write(toFile: outDir + "/IDLE.json", atomically: true, encoding: .utf8)
        print("report: \(outDir)/IDLE.md")
        if check && (!fleetOK || rows.contains { r in r.target.map { r.percentOfCore > $0 } ?? false }) {
            print("check FAILED: over a target")
            throw ExitCode(1)
        }
    }

    struct Row {
        var process: String
        var pid: Int32
        var cpuSeconds: Double
        var percentOfCore: Double
        var target: Double?
    }
}
