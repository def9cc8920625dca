// A real Redis Cluster for tests: Debian's redis-server, 3 masters and 3 replicas on loopback.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Six `redis-server` processes with `--cluster-enabled yes` on free loopback ports (each with an explicit bus
/// port), joined by `redis-cli --cluster create --cluster-replicas 1`: 3 masters with the 16384 slots split
/// between them, each with one replica. `start()` returns once every node reports `cluster_state:ok` and every
/// replica's link to its master is up. Stopped by `stop()` or when the last reference goes.
public final class RedisTestCluster: Sendable {
    /// One node: its client port, its cluster bus port and its process.
    public struct Node: Sendable {
        public let port: Int
        public let busPort: Int
        public let process: ChildProcess
    }

    /// What `CLUSTER NODES` says about one node.
    public struct NodeInfo: Sendable, Hashable {
        public let id: String
        public let port: Int
        public let isMaster: Bool
        /// The master's id, for a replica.
        public let masterID: String?
        /// Flagged `fail` (or `fail?`) by the node asked.
        public let failing: Bool
        /// The slots it serves (masters), as ranges.
        public let slots: [ClosedRange<Int>]
    }

    public let nodes: [Node]
    public let directory: String
    /// The node timeout: how long a master must be unreachable before its replica takes over.
    public static let nodeTimeoutMilliseconds = 1500

    /// The seed URL Herald takes (`HERALD_REDIS_URL`): every node.
    public var url: String { "redis+cluster://" + nodes.map { "127.0.0.1:\($0.port)" }.joined(separator: ",") }

    public init(masters: Int = 3, replicasPerMaster: Int = 1) throws {
        TestProcess.prepare()
        let dir = try temporaryDirectory("herald-redis-cluster")
        var nodes: [Node] = []
        var ports = Set<Int>()
        func newPort() throws -> Int {
            while true {
                let port = try freePort()
                if ports.insert(port).inserted { return port }
            }
        }
        do {
            for index in 0..<(masters * (1 + replicasPerMaster)) {
                var attempt = 0
                while true {
                    let port = try newPort()
                    let busPort = try newPort()
                    let process = ChildProcess(
                        name: "redis-cluster-\(index)", executable: try Paths.tool("redis-server"),
                        arguments: [
                            "--port", "\(port)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                            "--dir", dir, "--daemonize", "no", "--loglevel", "notice",
                            "--cluster-enabled", "yes", "--cluster-config-file",
                            "\(dir)/nodes-\(index)-\(attempt).conf",
                            "--cluster-port", "\(busPort)",
                            "--cluster-node-timeout", "\(Self.nodeTimeoutMilliseconds)",
                        ], logPath: "\(dir)/redis-\(index)-\(attempt).log")
                    try process.start()
                    if eventuallyBlocking(
                        timeout: .seconds(60), { !process.isRunning || portAcceptsConnections(port) }),
                        process.isRunning
                    {
                        nodes.append(Node(port: port, busPort: busPort, process: process))
                        break
                    }
                    let log = process.logTail(20)
                    process.killNow()
                    attempt += 1
                    if attempt >= 3 || !log.contains("Address already in use") {
                        throw TestSupportError("redis-server (cluster node) did not start on \(port): \(log)")
                    }
                }
            }
            let create = try runTool(
                try Paths.tool("redis-cli"),
                ["--cluster", "create"] + nodes.map { "127.0.0.1:\($0.port)" }
                    + ["--cluster-replicas", "\(replicasPerMaster)", "--cluster-yes"])
            guard create.status == 0 else {
                throw TestSupportError("redis-cli --cluster create failed: \(create.output)")
            }
        } catch {
            for node in nodes { node.process.killNow() }
            throw error
        }
        self.nodes = nodes
        self.directory = dir
        do {
            try waitUntilHealthy()
        } catch {
            stop()
            throw error
        }
    }

    /// `init` on a thread of its own, so starting a cluster does not hold a cooperative thread.
    public static func start(masters: Int = 3, replicasPerMaster: Int = 1) async throws -> RedisTestCluster {
        try await offPool { try RedisTestCluster(masters: masters, replicasPerMaster: replicasPerMaster) }
    }

    /// Runs `redis-cli -p <port> <arguments>` and returns its output (`--raw`, trimmed).
    @discardableResult
    public func cli(_ port: Int, _ arguments: [String]) throws -> String {
        let result = try runTool(try Paths.tool("redis-cli"), ["-p", "\(port)", "--raw"] + arguments)
        guard result.status == 0 else {
            throw TestSupportError(
                "redis-cli -p \(port) \(arguments.first ?? "") exited \(result.status): \(result.output)")
        }
        return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `cli` on a thread of its own.
    @discardableResult
    public func cliAsync(_ port: Int, _ arguments: [String]) async throws -> String {
        try await offPool { try self.cli(port, arguments) }
    }

    /// The nodes still running.
    public var runningNodes: [Node] { nodes.filter { $0.process.isRunning } }

    /// The cluster as node `port` sees it (`CLUSTER NODES`).
    public func topology(askingPort port: Int) throws -> [NodeInfo] {
        try cli(port, ["CLUSTER", "NODES"]).split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ")
            guard fields.count >= 8 else { return nil }
            let address = fields[1].split(separator: "@")[0]
            guard let portText = address.split(separator: ":").last, let nodePort = Int(portText) else { return nil }
            let flags = fields[2].split(separator: ",")
            var slots: [ClosedRange<Int>] = []
            for field in fields.dropFirst(8) where !field.hasPrefix("[") {
                let bounds = field.split(separator: "-").compactMap { Int($0) }
                if bounds.count == 1 { slots.append(bounds[0]...bounds[0]) }
                if bounds.count == 2 { slots.append(bounds[0]...bounds[1]) }
            }
            return NodeInfo(
                id: String(fields[0]), port: nodePort, isMaster: flags.contains("master"),
                masterID: fields[3] == "-" ? nil : String(fields[3]),
                failing: flags.contains("fail") || flags.contains("fail?"), slots: slots)
        }
    }

    /// The master serving `slot`, as node `port` sees it.
    public func owner(ofSlot slot: Int, askingPort port: Int) throws -> NodeInfo? {
        try topology(askingPort: port).first { node in node.isMaster && node.slots.contains { $0.contains(slot) } }
    }

    /// Waits until every running node reports `cluster_state:ok` with all 16384 slots served, every running node
    /// sees the same masters serving slots, and every running replica's link to its master is up.
    public func waitUntilHealthy(timeout: Duration = .seconds(60)) throws {
        var last = "never checked"
        let healthy = eventuallyBlocking(timeout: timeout, interval: .milliseconds(100)) {
            do {
                var views = Set<[Int]>()
                for node in runningNodes {
                    let info = try cli(node.port, ["CLUSTER", "INFO"])
                    guard info.contains("cluster_state:ok"), info.contains("cluster_slots_ok:16384") else {
                        last = "node \(node.port): \(info.split(separator: "\n").prefix(3).joined(separator: " "))"
                        return false
                    }
                    let topology = try topology(askingPort: node.port)
                    let masters = topology.filter { $0.isMaster && !$0.slots.isEmpty && !$0.failing }.map(\.port)
                    views.insert(masters.sorted())
                    let replication = try cli(node.port, ["INFO", "replication"])
                    if replication.contains("role:slave"), !replication.contains("master_link_status:up") {
                        last = "replica \(node.port): link to its master not up"
                        return false
                    }
                }
                guard views.count == 1 else {
                    last = "nodes disagree on the masters: \(views)"
                    return false
                }
                return true
            } catch {
                last = "\(error)"
                return false
            }
        }
        guard healthy else { throw TestSupportError("the Redis cluster did not become healthy: \(last)") }
    }

    /// `waitUntilHealthy` on a thread of its own.
    public func waitUntilHealthyAsync(timeout: Duration = .seconds(60)) async throws {
        try await offPool { try self.waitUntilHealthy(timeout: timeout) }
    }

    /// SIGKILL every node.
    public func stop() {
        for node in nodes { node.process.killNow() }
    }

    deinit { stop() }
}
