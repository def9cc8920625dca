// The local stack as the bench sees it: started (or attached to) through scripts/local-stack.sh,
// its ports and pids from RUN/stack.env and the pid files, /metrics over plain HTTP, and each
// process's CPU time and memory from /proc.
import Foundation
import Glibc
import HeraldCore
import HeraldToolSupport

package struct BenchError: Error, CustomStringConvertible {
    package var description: String
    package init(_ d: String) { description = d }
}

package func nowMillis() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

package func monotonicSeconds() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

package func log(_ s: String) {
    FileHandle.standardError.write(Data(("[bench] " + s + "\n").utf8))
}

package let stageNames = ["ingest", "resolve", "suppress", "render", "send", "registry"]

/// What RUN/stack.env says about a running stack.
package struct StackInfo {
    package var run: String
    package var bin: String
    package var redisPort: Int
    package var kafkaPort: Int
    package var apnsPort: Int
    package var metricsBase: Int
    package var mockMetricsPort: Int
    /// The registry API's port and bearer token (nil when the stack does not run it).
    package var apiPort: Int?
    package var apiToken: String?
    package var redisAOF: Bool
    package var kafkaS3: Bool
    /// The broker the stack runs: `dev` (herald-dev-broker, three brokers on `kafkaPort` and the two ports above it,
    /// its control API on `kafkaPort + 100`) or `tansu`.
    package var broker: String
    /// A Redis Cluster (nodes `redis-0` .. `redis-5` on `redisPort` and the five ports above it) instead of one Redis.
    package var redisCluster: Bool
    /// What the stages were given as HERALD_REDIS_URL.
    package var redisURL: String

    package static func load(run: String) throws -> StackInfo {
        guard let text = try? String(contentsOfFile: run + "/stack.env", encoding: .utf8) else {
            throw BenchError("no stack.env in \(run): is a stack running there (scripts/local-stack.sh --up)?")
        }
        var kv: [String: String] = [:]
        for line in text.split(separator: "\n") {
            guard let eq = line.firstIndex(of: "=") else { continue }
            kv[String(line[..<eq])] = String(line[line.index(after: eq)...])
        }
        func int(_ k: String) throws -> Int {
            guard let v = kv[k].flatMap({ Int($0) }) else { throw BenchError("stack.env lacks \(k)") }
            return v
        }
        return StackInfo(
            run: kv["RUN"] ?? run, bin: kv["BIN"] ?? "", redisPort: try int("REDIS_PORT"),
            kafkaPort: try int("KAFKA_PORT"), apnsPort: try int("APNS_PORT"),
            metricsBase: try int("METRICS_BASE"), mockMetricsPort: try int("MOCK_METRICS_PORT"),
            apiPort: kv["API_PORT"].flatMap { Int($0) }, apiToken: kv["API_TOKEN"], redisAOF: kv["REDIS_AOF"] == "1",
            kafkaS3: kv["KAFKA_S3"] == "1", broker: kv["BROKER"] ?? "dev", redisCluster: kv["REDIS_CLUSTER"] == "1",
            redisURL: try kv["REDIS_URL"] ?? "redis://127.0.0.1:\(int("REDIS_PORT"))")
    }

    package var brokers: String {
        broker == "dev"
            ? (0..<3).map { "127.0.0.1:\(kafkaPort + $0)" }.joined(separator: ",") : "127.0.0.1:\(kafkaPort)"
    }
    /// herald-dev-broker's control API (brokers down and up, partition leaders; scripts/dev-broker.sh).
    package var brokerControlPort: Int { kafkaPort + 100 }
    package var pipelineFile: String { run + "/pipeline.yaml" }

    package func metricsPort(stage: String) -> Int { metricsBase + 1 + (stageNames.firstIndex(of: stage) ?? 0) }

    /// The pid of a component now (a restarted one has a new pid).
    package func pid(_ component: String) -> Int32? {
        let file: String
        switch component {
        case "redis": file = run + "/redis.pid"
        case "kafka": file = run + (broker == "dev" ? "/kafka/dev-broker.pid" : "/tansu/tansu.pid")
        case "mock-apns": file = run + "/mock-apns.pid"
        default: file = run + "/\(component).pid"
        }
        guard let s = try? String(contentsOfFile: file, encoding: .utf8) else { return nil }
        return Int32(s.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The exit status a stage's watcher recorded, if it exited.
    package func exitStatus(stage: String) -> Int? {
        guard let s = try? String(contentsOfFile: run + "/\(stage).exit", encoding: .utf8) else { return nil }
        return Int(s.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The last `count` lines of a stage's log that are not librdkafka's chatter (what a stage printed last before
    /// an unexpected exit), each cut to 300 characters.
    package func logTail(stage: String, count: Int = 3) -> [String] {
        guard let text = try? String(contentsOfFile: run + "/logs/\(stage).log", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").filter { !$0.contains("librdkafka") }.suffix(count).map {
            String($0.prefix(300))
        }
    }

    package func isAlive(_ component: String) -> Bool {
        guard let pid = pid(component) else { return false }
        if component != "redis" && component != "kafka" && component != "mock-apns"
            && exitStatus(stage: component) != nil
        {
            return false
        }
        return kill(pid, 0) == 0
    }
}

/// Runs scripts/local-stack.sh with the bench's ports and run directory.
package struct StackControl {
    package var repo: String
    package var run: String
    package var environment: [String: String]

    package static func findRepo() throws -> String {
        var candidates = [FileManager.default.currentDirectoryPath]
        var exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
        for _ in 0..<6 { candidates.append(exe.path); exe = exe.deletingLastPathComponent() }
        for c in candidates where FileManager.default.fileExists(atPath: c + "/scripts/local-stack.sh") { return c }
        throw BenchError(
            "scripts/local-stack.sh not found (run herald-bench or herald-chaos from the repository, or pass --repo)")
    }

    /// Free ports from the kernel, unless the HERALD_LOCAL_* variables name them.
    ///
    /// Every port the stack will bind is chosen apart from all the others: Redis's (with a cluster, its six nodes and
    /// their bus ports), the broker's, the two stand-ins', and the block above the metrics base (the six stages, the
    /// registry API, the stand-in's metrics). Each probe only says that nothing is bound to a port now, and none of
    /// them is bound until the script starts, so a port of one could otherwise be handed to another as well (once
    /// Redis and Kafka both got 36205; a stage's metrics port inside a cluster's range would fail its bind).
    package static func portEnvironment(
        redisCluster: Bool = false, given: [String: String] = ProcessInfo.processInfo.environment
    ) -> [String: String] {
        var env: [String: String] = [:]
        var taken = Set<Int>()
        for name in [
            "HERALD_LOCAL_REDIS_PORT", "HERALD_LOCAL_KAFKA_PORT", "HERALD_LOCAL_APNS_PORT", "HERALD_LOCAL_FCM_PORT",
        ] {
            let cluster = name == "HERALD_LOCAL_REDIS_PORT" && redisCluster
            let kafka = name == "HERALD_LOCAL_KAFKA_PORT"
            func ports(_ port: Int) -> [Int] { kafka ? devBrokerPorts(port) : stackPorts(port, cluster: cluster) }
            if let port = given[name] {
                env[name] = port
                taken.formUnion(ports(Int(port) ?? 0))
                continue
            }
            var port = cluster ? freeClusterPorts() : freePort()
            for _ in 0..<50
            where !taken.isDisjoint(with: ports(port)) || !ports(port).allSatisfy({ $0 == port || portIsFree($0) }) {
                port = cluster ? freeClusterPorts() : freePort()
            }
            taken.formUnion(ports(port))
            env[name] = String(port)
        }
        env["HERALD_LOCAL_METRICS_BASE"] =
            given["HERALD_LOCAL_METRICS_BASE"] ?? String(freePortBlock(metricsBlockSize, avoiding: taken))
        return env
    }

    /// The ports above the metrics base the script binds: base+1 ... base+9, and base+41 ... base+66 for the extra
    /// processes of a stage (`STAGE@N`).
    package static let metricsBlockSize = 70

    /// The ports herald-dev-broker binds for a Kafka port: its three brokers and its control API.
    package static func devBrokerPorts(_ port: Int) -> [Int] { [port, port + 1, port + 2, port + 100] }

    /// The ports one of the script's port variables stands for: one, or a cluster's six nodes and their bus ports.
    package static func stackPorts(_ port: Int, cluster: Bool) -> [Int] {
        cluster ? (0..<6).flatMap { [port + $0, port + $0 + 10_000] } : [port]
    }

    /// Runs the script and waits for it (posix_spawn + waitpid: Foundation's Process.waitUntilExit
    /// can wait forever when called from async code on Linux).
    @discardableResult
    package func script(_ args: [String], extraEnvironment: [String: String] = [:], quiet: Bool = false) throws -> Int32
    {
        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        for (k, v) in extraEnvironment { env[k] = v }
        return try spawnAndWait(
            ["/bin/bash", repo + "/scripts/local-stack.sh", "--run-dir", run] + args,
            environment: env, quiet: quiet)
    }

    /// Starts the stack; `stages` names the stages to start (nil: all six; empty: none, for `start` later).
    package func up(
        redisAOF: Bool, kafkaS3: Bool, redisCluster: Bool = false, mockArgs: String, build: Bool, debug: Bool,
        stages: [String]? = nil
    ) throws {
        var args = ["--up", "--no-setup"]
        if redisCluster { args.append("--redis-cluster") }
        if !build { args.append("--no-build") }
        if redisAOF { args.append("--redis-aof") }
        if kafkaS3 { args.append("--kafka-s3") }
        if debug { args.append("--debug") }
        var extra = ["HERALD_LOCAL_MOCK_ARGS": mockArgs]
        // The measured workload leaves the unread counts to the chat service, whatever the example pipeline
        // does (docs/performance.md); HERALD_LOCAL_COUNTS=on in the environment keeps the apps' own setting.
        extra["HERALD_LOCAL_COUNTS"] = ProcessInfo.processInfo.environment["HERALD_LOCAL_COUNTS"] ?? "off"
        // Nor does it trace, as a production stage does not by default: HERALD_TRACING=on in the environment traces
        // into the stack's OTLP stand-in at HERALD_TRACE_RATIO (docs/performance.md, "Tracing").
        extra["HERALD_TRACING"] = ProcessInfo.processInfo.environment["HERALD_TRACING"] ?? "off"
        if let stages { extra["HERALD_LOCAL_STAGES"] = stages.isEmpty ? "none" : stages.joined(separator: " ") }
        let rc = try script(args, extraEnvironment: extra)
        if rc != 0 { throw BenchError("scripts/local-stack.sh --up failed (exit \(rc)); logs in \(run)/logs") }
    }

    package func down() { _ = try? script(["--stop"], quiet: true) }

    package func restart(_ component: String, mockArgs: String? = nil) throws {
        var extra: [String: String] = [:]
        if let mockArgs { extra["HERALD_LOCAL_MOCK_ARGS"] = mockArgs }
        let rc = try script(["--restart", component], extraEnvironment: extra, quiet: true)
        if rc != 0 { throw BenchError("restarting \(component) failed (exit \(rc))") }
    }

    /// Stops a stage gracefully (SIGTERM) and waits up to `timeout` seconds for it to exit; true when it did.
    @discardableResult
    package func stopStage(_ stage: String, timeout: Double = 30) throws -> Bool {
        let rc = try script(["--signal", "TERM", stage], quiet: true)
        if rc != 0 { throw BenchError("signalling \(stage) failed (exit \(rc))") }
        let deadline = monotonicSeconds() + timeout
        while monotonicSeconds() < deadline {
            if FileManager.default.fileExists(atPath: run + "/\(stage).exit") { return true }
            usleep(50_000)
        }
        return false
    }

    package func start(_ component: String) throws {
        let rc = try script(["--start", component], quiet: true)
        if rc != 0 { throw BenchError("starting \(component) failed (exit \(rc))") }
    }
}

/// A port nothing is bound to now, below Linux's ephemeral range (32768-60999) so that no outgoing connection or
/// port-0 server takes it before the stack binds it.
package func freePort() -> Int {
    for _ in 0..<500 {
        let port = Int.random(in: 15_000..<32_000)
        if portIsFree(port) { return port }
    }
    return 31_999
}

/// The first of six consecutive free ports whose cluster bus ports (each + 10000) are free too, all below Linux's
/// ephemeral range (scripts/local-stack.sh --redis-cluster).
package func freeClusterPorts() -> Int {
    for _ in 0..<500 {
        let port = Int.random(in: 15_000..<22_000)
        if (0..<6).allSatisfy({ portIsFree(port + $0) && portIsFree(port + $0 + 10_000) }) { return port }
    }
    return 21_990
}

package func portIsFree(_ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = UInt16(port).bigEndian
    let len = socklen_t(MemoryLayout<sockaddr_in>.size)
    return withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
        == 0
}

/// A base port such that base+1 ... base+count-1 are free now and none of them is in `avoiding`.
package func freePortBlock(_ count: Int, avoiding: Set<Int> = []) -> Int {
    for _ in 0..<200 {
        // Below Linux's ephemeral range (32768-60999), so an outgoing connection cannot take a port of the block
        // between this check and the stages binding it.
        let base = Int.random(in: 20_000...32_000)
        if (1..<count).allSatisfy({ !avoiding.contains(base + $0) && portIsFree(base + $0) }) { return base }
    }
    return 39_200
}

/// One HTTP/1.1 request to 127.0.0.1 (metrics, stand-in controls): the body of a 2xx answer; nil when nothing
/// answers or the answer is not 2xx.
package func httpRequest(port: Int, method: String = "GET", path: String, timeoutSeconds: Int = 3) -> String? {
    guard
        let answer = HTTPProbe.request(
            ServiceEndpoint(host: "127.0.0.1", port: port), method: method, path: path, timeout: timeoutSeconds),
        (200..<300).contains(answer.status)
    else { return nil }
    return answer.body
}

/// The six stages' /metrics, scraped together.
package struct StageMetrics {
    package var samples: [String: [MetricSample]] = [:]  // stage -> samples

    package static func scrape(_ stack: StackInfo) -> StageMetrics {
        var m = StageMetrics()
        for s in stageNames {
            if let text = httpRequest(port: stack.metricsPort(stage: s), path: "/metrics", timeoutSeconds: 2) {
                m.samples[s] = MetricSamples(text).samples
            }
        }
        return m
    }

    package func sum(_ name: String, stage: String? = nil, where filter: (([String: String]) -> Bool)? = nil) -> Double
    {
        var total = 0.0
        for (s, list) in samples where stage == nil || stage == s {
            for x in list where x.name == name && (filter?(x.labels) ?? true) { total += x.value }
        }
        return total
    }

    /// Sum of a counter by one label's value.
    package func byLabel(_ name: String, label: String) -> [String: Double] {
        var out: [String: Double] = [:]
        for (_, list) in samples {
            for x in list where x.name == name { out[x.labels[label] ?? "", default: 0] += x.value }
        }
        return out
    }
}

/// CPU time and memory of one process from /proc.
package struct ProcSample {
    package var cpuSeconds: Double
    package var rssKB: Int
    package var hwmKB: Int
}

package let clockTicks = Double(sysconf(Int32(_SC_CLK_TCK)))

package func procSample(_ pid: Int32) -> ProcSample? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let cpuTicks = ProcStat(stat)?.cpuTicks
    else { return nil }
    var rss = 0, hwm = 0
    if let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) {
        for line in status.split(separator: "\n") {
            if line.hasPrefix("VmRSS:") { rss = Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0 }
            if line.hasPrefix("VmHWM:") { hwm = Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0 }
        }
    }
    return ProcSample(cpuSeconds: cpuTicks / clockTicks, rssKB: rss, hwmKB: hwm)
}

/// The ids of a process's threads now (`/proc/<pid>/task`); none when it is gone.
package func threadIDs(of pid: Int32) -> [Int32] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []).compactMap { Int32($0) }
}

/// A process's time on a core and its time runnable but waiting for one, per thread
/// (`/proc/<pid>/task/*/schedstat`: nanoseconds running, nanoseconds waiting on a run queue). Threads that exited
/// between two samples are left out of both sides.
package struct RunQueueSample {
    package let pid: Int32
    package var threads: [Int32: (running: Double, waiting: Double)] = [:]

    package init(pid: Int32) {
        self.pid = pid
        for tid in threadIDs(of: pid) {
            guard let line = try? String(contentsOfFile: "/proc/\(pid)/task/\(tid)/schedstat", encoding: .utf8)
            else { continue }
            let fields = line.split(separator: " ")
            guard fields.count >= 2, let run = Double(fields[0]), let wait = Double(fields[1]) else { continue }
            threads[tid] = (run / 1e9, wait / 1e9)
        }
    }

    /// Seconds running and seconds waiting for a core since `earlier` (threads started since count from zero).
    package func since(_ earlier: RunQueueSample) -> (running: Double, waiting: Double) {
        var run = 0.0, wait = 0.0
        for (tid, now) in threads {
            let before = earlier.threads[tid] ?? (0, 0)
            run += now.running - before.running
            wait += now.waiting - before.waiting
        }
        return (max(0, run), max(0, wait))
    }
}

/// CPU seconds used between two samples of every component, plus their peak RSS; restarts of a
/// component are handled by accumulating per pid.
package final class ProcessAccounting {
    package let stack: StackInfo
    package static let components = stageNames + ["kafka", "redis", "mock-apns"]
    private var first: [String: [Int32: Double]] = [:]
    private var last: [String: [Int32: ProcSample]] = [:]

    package init(stack: StackInfo) { self.stack = stack }

    package func sample() {
        for c in Self.components {
            guard let pid = stack.pid(c), let s = procSample(pid) else { continue }
            if first[c]?[pid] == nil { first[c, default: [:]][pid] = s.cpuSeconds }
            last[c, default: [:]][pid] = s
        }
    }

    package func cpuSeconds(_ c: String) -> Double {
        var total = 0.0
        for (pid, s) in last[c] ?? [:] { total += s.cpuSeconds - (first[c]?[pid] ?? s.cpuSeconds) }
        return total
    }

    /// CPU seconds of the component's processes from their start to the last sample (the count `cpuSeconds`
    /// takes from the first sample on, plus what they used before it).
    package func cpuSecondsSinceStart(_ c: String) -> Double {
        (last[c] ?? [:]).values.reduce(0) { $0 + $1.cpuSeconds }
    }

    package func peakRSSKB(_ c: String) -> Int { (last[c] ?? [:]).values.map(\.hwmKB).max() ?? 0 }
    package func rssKB(_ c: String) -> Int { (last[c] ?? [:]).values.map(\.rssKB).max() ?? 0 }
}

/// posix_spawn + waitpid; the exit status (128 + signal when killed).
package func spawnAndWait(_ argv: [String], environment: [String: String], quiet: Bool) throws -> Int32 {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if quiet {
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    } else {
        // The script's output goes to the bench's stderr (stdout carries the results).
        posix_spawn_file_actions_adddup2(&actions, 2, 1)
    }
    var attr = posix_spawnattr_t()
    posix_spawnattr_init(&attr)
    defer { posix_spawnattr_destroy(&attr) }
    var empty = sigset_t()
    sigemptyset(&empty)
    posix_spawnattr_setsigmask(&attr, &empty)
    posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK))
    let cArgs = argv.map { strdup($0) } + [nil]
    let cEnv = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { for p in cArgs { free(p) }; for p in cEnv { free(p) } }
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, argv[0], &actions, &attr, cArgs, cEnv)
    guard rc == 0 else { throw BenchError("cannot start \(argv[0]): \(String(cString: strerror(rc)))") }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let low = status & 0x7F
    return low == 0 ? (status >> 8) & 0xFF : 128 + low
}
