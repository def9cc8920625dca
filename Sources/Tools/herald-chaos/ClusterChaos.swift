// The Redis Cluster fault scenarios: a master killed under load (its replica takes over), and slots moved to
// another master while traffic flows. Both run the stack on `scripts/local-stack.sh --redis-cluster` (3 masters,
// 3 replicas, cluster-node-timeout 3 s).
import Foundation
import Glibc
import HeraldBenchSupport
import HeraldRedis
import Synchronization

/// One line of `CLUSTER NODES`.
struct ClusterNode {
    var id: String
    var port: Int
    var isMaster: Bool
    var failed: Bool
    /// Slot ranges served (masters only).
    var slots: [ClosedRange<Int>]

    /// Flagged `fail` by the cluster (a majority of masters agreed), not only suspected (`fail?`).
    var failedForSure: Bool
    var slotCount: Int { slots.reduce(0) { $0 + $1.count } }

    /// `<id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <epoch> <link-state> <slot> <slot> ...`
    init?(line: Substring) {
        let f = line.split(separator: " ")
        guard f.count >= 8, let colon = f[1].lastIndex(of: ":") else { return nil }
        let address = f[1][f[1].index(after: colon)...]
        guard let port = Int(address.split(separator: "@")[0]) else { return nil }
        let flags = f[2].split(separator: ",")
        id = String(f[0])
        self.port = port
        isMaster = flags.contains("master")
        failedForSure = flags.contains("fail")
        failed = flags.contains("fail") || flags.contains("fail?") || f[7] != "connected" && !flags.contains("myself")
        slots = f.dropFirst(8).compactMap { item -> ClosedRange<Int>? in
            if item.hasPrefix("[") { return nil }  // a slot being migrated or imported
            let bounds = item.split(separator: "-").compactMap { Int($0) }
            guard let low = bounds.first else { return nil }
            return low...(bounds.count > 1 ? bounds[1] : low)
        }
    }
}

/// Asks one node (plain connection, no cluster routing) a question.
func askNode(port: Int, _ name: String, _ argument: String) async throws -> RedisValue {
    let conn = RedisConnection(configuration: try RedisConfiguration(url: "redis://127.0.0.1:\(port)"))
    defer { conn.close() }
    return try await conn.send(RedisCommand(name, argument)).orThrow("\(name) \(argument)")
}

/// The cluster as one reachable node of `ports` sees it.
func clusterNodes(ports: [Int]) async -> [ClusterNode] {
    for port in ports {
        if let text = try? await askNode(port: port, "CLUSTER", "NODES").text {
            return text.split(separator: "\n").compactMap(ClusterNode.init(line:))
        }
    }
    return []
}

/// Every reachable node of `ports` reports cluster_state:ok with all 16384 slots served.
func clusterHealthy(ports: [Int]) async -> Bool {
    var answered = 0
    for port in ports {
        guard let info = try? await askNode(port: port, "CLUSTER", "INFO").text else { continue }
        answered += 1
        if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") { return false }
    }
    return answered > 0
}

extension ChaosRunner {
    func clusterPorts(_ session: BenchSession) -> [Int] { (0..<6).map { session.info.redisPort + $0 } }

    /// A duplicate is excused when its first answer came from the last round trip before the fault or while the
    /// cluster had not recovered (a send whose confirmation went to a master that died, or to slots that were
    /// unavailable, sends again once the cluster answers).
    func excused(_ r: LoadDriver.Result, from: Int64, to: Int64) -> Int {
        r.duplicates.filter { $0.firstAt >= from - options.crashWindowMs && $0.firstAt <= to }.count
    }

    /// The cluster scenarios' load (100 events/s reduced, 500 full, for 20 or 45 s) on `session`, with `fault`
    /// started once on a task of its own `faultAt` seconds in.
    func clusterLoad(
        _ session: BenchSession, faultAt: Double, extraDrain: Double = 0,
        fault: @escaping @Sendable (FaultLog, TimeMarks) async -> Void
    ) async throws -> (LoadDriver.Result, FaultLog, TimeMarks) {
        let rate = reduced ? 100.0 : 500.0
        let seconds = reduced ? 20.0 : 45.0
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        let times = TimeMarks()
        var started = false
        driver.onTick = { t in
            guard !started, t >= faultAt else { return }
            started = true
            Task.detached { await fault(faults, times) }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: drainTimeout + extraDrain)
        return (r, faults, times)
    }

    // MARK: A master killed

    func redisMasterKill() async throws -> ChaosOutcome {
        let session = try open(redisCluster: true)
        defer { session.close(keep: options.stack.keep) }
        let ports = clusterPorts(session)
        let (r, faults, times) = try await clusterLoad(session, faultAt: 5, extraDrain: 10) { faults, times in
            // The master of the most slots, so the fault hits as much traffic as it can.
            let nodes = await clusterNodes(ports: ports)
            guard let victim = nodes.filter({ $0.isMaster && !$0.failed }).max(by: { $0.slotCount < $1.slotCount }),
                let pid = session.info.pid("redis-\(victim.port - session.info.redisPort)")
            else {
                faults.note("no master to kill (CLUSTER NODES: \(nodes.count) nodes)")
                return
            }
            kill(pid, SIGKILL)
            let at = nowMillis()
            times.set("kill", at)
            faults.add(
                .init(
                    stage: "redis-\(victim.port - session.info.redisPort)", action: "SIGKILL", at: at, status: nil))
            // The replica is promoted after cluster-node-timeout (3 s) and an election.
            let others = ports.filter { $0 != victim.port }
            var recovered = false
            for _ in 0..<600 {
                // Whole again: the others marked it failed (not only suspected) and serve every slot.
                let seen = await clusterNodes(ports: others)
                let marked = seen.first { $0.id == victim.id }.map { !$0.isMaster || $0.failedForSure } ?? false
                if marked, await clusterHealthy(ports: others) {
                    recovered = true
                    break
                }
                try? await Task.sleep(for: .milliseconds(100))
            }
            times.set("recovered", nowMillis())
            if !recovered { faults.note("the cluster did not recover within 60 s of the kill") }
            // The old master comes back and rejoins as a replica of the promoted one.
            do { try session.control.start("redis-\(victim.port - session.info.redisPort)") } catch {
                faults.note("restart of the killed master failed: \(error)")
            }
            let after = await clusterNodes(ports: others)
            if let back = after.first(where: { $0.id == victim.id }), back.isMaster, back.slotCount > 0 {
                faults.note("the killed master came back still serving slots: no failover happened")
            }
        }
        var problems = faults.allNotes
        let killedAt = times.get("kill")
        let recovered = times.get("recovered")
        if killedAt == nil { problems.append("no master was killed") }
        let excusedCount = killedAt.map { excused(r, from: $0, to: recovered ?? nowMillis()) } ?? 0
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        if !(await clusterHealthy(ports: ports)) { problems.append("the cluster is not healthy at the end") }
        let victim = faults.all.first?.stage ?? "?"
        let failover = (killedAt != nil && recovered != nil) ? "\(recovered! - killedAt!) ms" : "?"
        return outcome(
            r, excusedDuplicates: excusedCount, extraProblems: problems,
            detail:
                "\(victim) (master of the most slots) SIGKILLed at 5 s; cluster whole again after \(failover); \(excusedCount) duplicates from the last round trip or the failover; \(r.expected) notifications"
        )
    }

    // MARK: Slots moved under traffic

    func redisSlotMove() async throws -> ChaosOutcome {
        let session = try open(redisCluster: true)
        defer { session.close(keep: options.stack.keep) }
        let slots = reduced ? 1500 : 4000
        let ports = clusterPorts(session)
        let (r, faults, times) = try await clusterLoad(session, faultAt: 4) { faults, times in
            let masters = await clusterNodes(ports: ports).filter { $0.isMaster && !$0.failed }
                .sorted { $0.slotCount > $1.slotCount }
            guard masters.count >= 2, let from = masters.first, let to = masters.last else {
                faults.note("fewer than two masters")
                return
            }
            times.set("start", nowMillis())
            // redis-cli moves each slot the way an operator does: IMPORTING / MIGRATING, MIGRATE of its keys
            // (clients get ASK meanwhile), then SETSLOT NODE on every master (MOVED from then on).
            let status =
                (try? spawnAndWait(
                    [
                        "/usr/bin/redis-cli", "--cluster", "reshard", "127.0.0.1:\(from.port)",
                        "--cluster-from", from.id, "--cluster-to", to.id, "--cluster-slots", String(slots),
                        "--cluster-yes", "--cluster-pipeline", "20",
                    ], environment: ProcessInfo.processInfo.environment, quiet: true)) ?? -1
            times.set("end", nowMillis())
            if status != 0 { faults.note("redis-cli --cluster reshard exited \(status)") }
            faults.add(
                .init(
                    stage: "\(slots) slots 127.0.0.1:\(from.port) -> 127.0.0.1:\(to.port)", action: "reshard",
                    at: times.get("start") ?? 0, status: Int(status)))
        }
        // The reshard may outlast the load on a slow host: wait for it before judging the slot map.
        for _ in 0..<1200 where times.get("end") == nil && times.get("start") != nil {
            try await Task.sleep(for: .milliseconds(100))
        }
        var problems = faults.allNotes
        let start = times.get("start")
        let end = times.get("end")
        if start == nil { problems.append("the reshard did not start") }
        let masters = await clusterNodes(ports: ports).filter(\.isMaster)
        let counts = masters.map(\.slotCount).sorted()
        if !(await clusterHealthy(ports: ports)) { problems.append("the cluster is not healthy at the end") }
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("not running at the end: \(dead.joined(separator: ", "))") }
        let took = (start != nil && end != nil) ? String(format: "%.1f s", Double(end! - start!) / 1000) : "?"
        return outcome(
            r, extraProblems: problems,
            detail:
                "\(faults.all.first?.stage ?? "no reshard") moved from 4 s under load in \(took); slots per master now \(counts.map(String.init).joined(separator: "/")); \(r.expected) notifications"
        )
    }
}

/// Named instants set by the fault tasks (epoch ms).
final class TimeMarks: Sendable {
    private let marks = Mutex<[String: Int64]>([:])
    func set(_ name: String, _ at: Int64) { marks.withLock { $0[name] = at } }
    func get(_ name: String) -> Int64? { marks.withLock { $0[name] } }
}
