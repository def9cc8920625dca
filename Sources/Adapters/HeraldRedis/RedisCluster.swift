import Foundation
import HeraldCore
import Logging
import Synchronization

/// One Redis node's address.
public struct RedisNodeAddress: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `host[:port]` or `[IPv6]:port` with `ServiceEndpoint(parsing:defaultPort:)`, taking also the two forms
    /// Redis itself writes: an IPv6 host without brackets before its port (`MOVED 3999 ::1:7002`), and an empty host
    /// (a node that does not know its own address answers `MOVED 3999 :7002`), for which `defaultHost` stands in.
    init(parsing text: Substring, defaultPort: Int = 6379, defaultHost: String? = nil) throws {
        var form = String(text)
        if !text.hasPrefix("["), let colon = text.lastIndex(of: ":") {
            let host = text[..<colon]
            if host.isEmpty, let defaultHost {
                form = (defaultHost.contains(":") ? "[\(defaultHost)]" : defaultHost) + text[colon...]
            } else if host.contains(":") {
                form = "[\(host)]\(text[colon...])"
            }
        }
        guard let endpoint = ServiceEndpoint(parsing: form, defaultPort: defaultPort) else {
            throw RedisError(
                .invalidConfiguration, "bad Redis node address \"\(text)\" (host, host:port or [IPv6]:port)")
        }
        self.init(host: endpoint.host, port: endpoint.port)
    }

    /// The address as `ServiceEndpoint` writes it: `host:port`, with an IPv6 host in brackets.
    public var description: String { ServiceEndpoint(host: host, port: port).description }
}

// MARK: - Configuration of a cluster

extension RedisConfiguration {
    /// True when this configuration names a Redis Cluster (by its seed nodes).
    public var isCluster: Bool { !clusterSeeds.isEmpty }

    /// This configuration for one cluster node: the same credentials, timeouts and transport, only the host and
    /// port replaced.
    func node(_ address: RedisNodeAddress) -> RedisConfiguration {
        var configuration = self
        configuration.host = address.host
        configuration.port = address.port
        configuration.clusterSeeds = []
        return configuration
    }

    /// Makes this a cluster configuration with these seed nodes (Redis Cluster has database 0 only).
    mutating func useCluster(seeds: [RedisNodeAddress]) throws {
        guard database == 0 else {
            throw RedisError(.invalidConfiguration, "Redis Cluster has only database 0, the URL names \(database)")
        }
        clusterSeeds = seeds
    }

    /// Splits `<scheme>+cluster://[userinfo@]host[:port][,host[:port]...][/path][?query]` into the URL of its
    /// first seed node (`<scheme>://[userinfo@]host[:port][/path][?query]`, parsed like any node URL, so a
    /// transport or option the node form knows applies to the cluster too) and the seed list. Nil for any other
    /// scheme.
    static func clusterForm(of url: String) throws -> (nodeURL: String, seeds: [RedisNodeAddress])? {
        guard let parts = ClusterURLParts(url) else { return nil }
        let hosts = parts.hosts.split(separator: ",", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        guard !hosts.contains(where: \.isEmpty) else {
            throw RedisError(.invalidConfiguration, "an empty seed node in Redis URL: \(redacted(url))")
        }
        let seeds = try hosts.map { try RedisNodeAddress(parsing: Substring($0)) }
        return ("\(parts.nodeScheme)://\(parts.userinfo)\(hosts[0])\(parts.tail)", seeds)
    }

    /// A cluster URL with its password replaced; nil when `url` is not a cluster URL.
    static func clusterRedacted(_ url: String) -> String? {
        guard let parts = ClusterURLParts(url) else { return nil }
        guard let colon = parts.userinfo.firstIndex(of: ":") else { return url }
        return "\(parts.scheme)://\(parts.userinfo[..<colon]):***@\(parts.hosts)\(parts.tail)"
    }

    /// `redis+cluster://` with the seed nodes; the password is never printed.
    var clusterDescription: String {
        let seeds = clusterSeeds.map(\.description).joined(separator: ",")
        return "redis+cluster://\(password == nil ? "" : "\(username ?? ""):***@")\(seeds)"
    }
}

/// The pieces of a `<scheme>+cluster://` URL.
private struct ClusterURLParts {
    /// The scheme as written (`redis+cluster`) and without `+cluster` (`redis`).
    var scheme: Substring
    var nodeScheme: Substring
    /// `user:password@` as written, or empty.
    var userinfo: Substring
    /// The comma-separated seed list.
    var hosts: Substring
    /// Path and query, as written.
    var tail: Substring

    init?(_ url: String) {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        scheme = url[..<schemeEnd.lowerBound]
        guard scheme.lowercased().hasSuffix("+cluster") else { return nil }
        nodeScheme = scheme.dropLast("+cluster".count)
        let rest = url[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        tail = rest[authorityEnd...]
        if let at = authority.lastIndex(of: "@") {
            userinfo = authority[...at]
            hosts = authority[authority.index(after: at)...]
        } else {
            userinfo = ""
            hosts = authority
        }
    }
}

// MARK: - The slot map

/// Which master serves each of the 16384 slots, as a node last told (`CLUSTER SLOTS`), corrected by redirections.
struct RedisSlotMap: Sendable {
    /// Per slot, an index into `nodes`, or -1 when no node serves it.
    private var owners = [Int16](repeating: -1, count: RedisSlot.count)
    /// The masters, in the order the map names them.
    private(set) var nodes: [RedisNodeAddress] = []

    /// No node known (before the first `CLUSTER SLOTS`).
    init() {}

    var isEmpty: Bool { nodes.isEmpty }

    func node(forSlot slot: Int) -> RedisNodeAddress? {
        let owner = owners[slot]
        return owner < 0 ? nil : nodes[Int(owner)]
    }

    /// A node for commands that name no key.
    var anyNode: RedisNodeAddress? { nodes.first }

    mutating func assign(_ slots: ClosedRange<Int>, to node: RedisNodeAddress) {
        let index: Int
        if let known = nodes.firstIndex(of: node) {
            index = known
        } else {
            index = nodes.count
            nodes.append(node)
        }
        for slot in slots { owners[slot] = Int16(index) }
    }

    /// Reads a `CLUSTER SLOTS` answer: `[[first, last, [host, port, id, ...], replica...], ...]`. A master with an
    /// empty host is `answeredBy`'s host (a node that does not know its own address).
    init(slotsReply reply: RedisValue, answeredBy: RedisNodeAddress) throws {
        guard let ranges = reply.array else {
            throw RedisError(.unexpectedReply, "CLUSTER SLOTS answered \(reply)")
        }
        for range in ranges {
            guard let fields = range.array, fields.count >= 3, let first = fields[0].int, let last = fields[1].int,
                let master = fields[2].array, master.count >= 2, let port = master[1].int,
                0 <= first, first <= last, last < RedisSlot.count
            else {
                throw RedisError(.unexpectedReply, "CLUSTER SLOTS answered an entry \(range)")
            }
            let host = master[0].text ?? ""
            let node = RedisNodeAddress(host: host.isEmpty || host == "?" ? answeredBy.host : host, port: Int(port))
            assign(Int(first)...Int(last), to: node)
        }
    }
}

// MARK: - The router

/// The Redis Cluster client behind a cluster `RedisConnection`.
///
/// It learns the slot map from the seed nodes (`CLUSTER SLOTS`), keeps one `RedisConnection` per master (each on
/// its own thread), cuts every batch into units (`RedisClusterBatch`: one command, or one whole `MULTI ... EXEC`),
/// sends each node its units in one pipelined round trip, all nodes at once, and puts the replies back in request
/// order.
///
/// Redirections are followed per unit, and only the redirected units are sent again:
/// - `MOVED <slot> <node>`: the slot has a new owner for good; the map is corrected at once and learnt again in the
///   background;
/// - `ASK <slot> <node>`: the slot is being migrated and this key is already on the target: the unit goes there once,
///   after `ASKING`;
/// - `TRYAGAIN` (a multi-key command during a migration) and `CLUSTERDOWN` (a failover under way): the unit is sent
///   again after a short pause, from a freshly learnt map.
/// A unit still redirected after `maximumRedirections` rounds fails the batch with the retryable
/// `cluster_unavailable`. A node whose connection breaks fails the batch with the node connection's retryable
/// error and makes the router learn the map again (a failover promotes a replica to the dead master's slots).
final class RedisClusterRouter: Sendable {
    /// Rounds of redirections a batch follows before it fails.
    static let maximumRedirections = 16

    let configuration: RedisConfiguration
    private let logger: Logger
    private let state = Mutex(State())

    private struct State {
        var map = RedisSlotMap()
        var connections: [RedisNodeAddress: RedisConnection] = [:]
        /// The running map refresh, which every caller needing the map waits for.
        var refresh: Task<Result<Void, RedisError>, Never>?
        var refreshes = 0
        var closed = false
    }

    init(configuration: RedisConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    deinit {
        close()
    }

    // MARK: The calls behind RedisConnection

    /// Learns the slot map and opens a connection to every master.
    func connect() async throws {
        try await refreshMap()
        for node in state.withLock({ $0.map.nodes }) {
            try await connection(to: node).connect()
        }
    }

    /// One command; `SCRIPT ...` (loading or flushing scripts for `EVALSHA`) goes to every master, since each keeps
    /// its own script cache, and the first master's answer is returned (an error answer of any master first).
    func send(_ command: RedisCommand) async throws -> RedisValue {
        if command.name.uppercased() == "SCRIPT" {
            var first: RedisValue?
            for node in try await currentMap().nodes {
                let reply = try await connection(to: node).send(command)
                if case .error = reply { return reply }
                if first == nil { first = reply }
            }
            return first ?? .null
        }
        let replies = try await execute(RedisBatch(encoded: command.encoded, count: 1))
        return replies.value(replies[0])
    }

    func pipeline(_ commands: [RedisCommand]) async throws -> [RedisValue] {
        try await execute(RedisBatch(commands: commands)).values
    }

    func pipeline(_ batch: RedisBatch) async throws -> [RedisValue] {
        try await execute(batch).values
    }

    func pipelineFlat(_ batch: RedisBatch) async throws -> RedisReplies {
        try await execute(batch)
    }

    /// Every reply is read; the first error reply is thrown, naming `what`.
    func write(_ batch: RedisBatch, what: String) async throws {
        let replies = try await execute(batch)
        for index in 0..<replies.count {
            if let message = replies.errorMessage(replies[index]) {
                throw RedisError(.serverError, "\(what): \(message)")
            }
        }
    }

    /// Every master answers `PING` with `PONG`.
    func ping() async -> Bool {
        guard let map = try? await currentMap(), !map.isEmpty else { return false }
        for node in map.nodes {
            guard let connection = try? connection(to: node), await connection.ping() else { return false }
        }
        return true
    }

    /// A slot map is known and every master's connection is open.
    var isConnected: Bool {
        state.withLock { state in
            !state.map.isEmpty && state.map.nodes.allSatisfy { state.connections[$0]?.isConnected ?? false }
        }
    }

    /// Closes every node connection; later calls fail with `closed`.
    func close() {
        let connections = state.withLock { state in
            state.closed = true
            defer { state.connections = [:] }
            return Array(state.connections.values)
        }
        for connection in connections { connection.close() }
    }

    /// How many times the slot map was learnt (tests, logs).
    var mapRefreshes: Int { state.withLock { $0.refreshes } }

    /// The master serving `slot` in the current map (tests, tools).
    func node(forSlot slot: Int) async throws -> RedisNodeAddress? {
        try await currentMap().node(forSlot: slot)
    }

    /// The connection to each master of the slot map, learnt afresh (`RedisConnection.masterConnections`).
    func masterConnections() async throws -> [RedisConnection] {
        try await refreshMap()
        return try state.withLock { $0.map.nodes }.map { try connection(to: $0) }
    }

    // MARK: Routing a batch

    /// Where a unit goes in the next round.
    private enum Route: Sendable {
        /// To the owner of its slot in the map.
        case map
        /// To a node a MOVED named.
        case moved(RedisNodeAddress)
        /// To a node an ASK named, after ASKING.
        case ask(RedisNodeAddress)
    }

    private enum Redirection {
        case moved(slot: Int, node: RedisNodeAddress)
        case ask(node: RedisNodeAddress)
        case retryLater(String)
    }

    /// Sends the batch's commands to the nodes that serve their slots, follows redirections, and returns every
    /// reply in the batch's order.
    private func execute(_ batch: RedisBatch) async throws -> RedisReplies {
        if batch.isEmpty { return RedisReplies() }
        let units = try RedisClusterBatch.units(of: batch.bytes, count: batch.count)
        // Where each unit's replies are: a node's answer (`answered`) and the unit's first reply in it.
        var answered: [RedisReplies] = []
        var placed = [(answer: Int, first: Int)](repeating: (-1, 0), count: units.count)
        var pending: [(unit: Int, route: Route)] = units.indices.map { ($0, .map) }
        var lastRedirection = ""
        for round in 0...Self.maximumRedirections {
            let map = try await currentMap()
            var groups: [RedisNodeAddress: [(unit: Int, asking: Bool)]] = [:]
            for (unit, route) in pending {
                switch route {
                case .map:
                    guard let node = units[unit].slot.flatMap(map.node(forSlot:)) ?? map.anyNode else {
                        throw RedisError(.clusterUnavailable, "the Redis Cluster slot map names no node")
                    }
                    groups[node, default: []].append((unit, false))
                case .moved(let node): groups[node, default: []].append((unit, false))
                case .ask(let node): groups[node, default: []].append((unit, true))
                }
            }
            let answers = try await send(groups, units: units, batch: batch)
            // Each unit's answer read once: where its replies are, and the redirection among them if any.
            var outcomes: [(unit: Int, answer: Int, first: Int, redirection: Redirection?)] = []
            var targets: Set<RedisNodeAddress> = []
            for (node, items) in groups {
                guard let nodeAnswer = answers[node] else { continue }
                answered.append(nodeAnswer.replies)
                for (position, item) in items.enumerated() {
                    let first = nodeAnswer.firstReply[position]
                    let count = units[item.unit].commands
                    let redirection = Self.redirection(in: nodeAnswer.replies, first..<(first + count), from: node)
                    switch redirection {
                    case .moved(_, let target), .ask(let target): targets.insert(target)
                    default: break
                    }
                    outcomes.append((item.unit, answered.count - 1, first, redirection))
                }
            }
            try await checkRedirectionTargets(targets)
            var next: [(unit: Int, route: Route)] = []
            var pause = false
            for (unit, answer, first, redirection) in outcomes {
                switch redirection {
                case nil:
                    placed[unit] = (answer, first)
                case .moved(let slot, let target):
                    lastRedirection = "MOVED \(slot) \(target)"
                    state.withLock { $0.map.assign(slot...slot, to: target) }
                    next.append((unit, .moved(target)))
                case .ask(let target):
                    lastRedirection = "ASK \(target)"
                    next.append((unit, .ask(target)))
                case .retryLater(let message):
                    lastRedirection = message
                    next.append((unit, .map))
                    pause = true
                }
            }
            if next.isEmpty { return Self.inOrder(units, placed, answered, commands: batch.count) }
            logger.debug(
                "redis cluster redirection", metadata: ["units": "\(next.count)", "last": "\(lastRedirection)"])
            if round == Self.maximumRedirections { break }
            pending = next.sorted { $0.unit < $1.unit }
            if pause {
                try? await Task.sleep(for: .milliseconds(min(500, 20 * (round + 1))))
                try await refreshMap()
            } else if next.contains(where: { if case .moved = $0.route { true } else { false } }) {
                requestRefresh()
            }
        }
        throw RedisError(
            .clusterUnavailable,
            "still redirected after \(Self.maximumRedirections) rounds (last: \(lastRedirection))")
    }

    /// A redirection is followed only to a node of this cluster: one of its slot map's masters or seeds. A target
    /// outside them (a node added since the map was learnt) is checked against a map learnt again now; one still
    /// outside is an error, never a connection to wherever a reply points.
    private func checkRedirectionTargets(_ targets: Set<RedisNodeAddress>) async throws {
        guard !targets.isEmpty else { return }
        let seeds = Set(configuration.clusterSeeds)
        func unknown() -> [RedisNodeAddress] {
            let nodes = Set(state.withLock { $0.map.nodes })
            return targets.filter { !nodes.contains($0) && !seeds.contains($0) }
        }
        guard !unknown().isEmpty else { return }
        try await refreshMap()
        if let stranger = unknown().first {
            throw RedisError(
                .protocolError, "redirected to \(stranger), which is not a node of the cluster's slot map")
        }
    }

    /// The replies of every unit, in the batch's order.
    private static func inOrder(
        _ units: [RedisClusterUnit], _ placed: [(answer: Int, first: Int)], _ answered: [RedisReplies], commands: Int
    ) -> RedisReplies {
        if answered.count == 1, answered[0].count == commands { return answered[0] }  // one node, no ASKING
        var replies = RedisReplies(replies: commands)
        for (unit, place) in zip(units, placed) {
            let answer = answered[place.answer]
            for offset in 0..<unit.commands { replies.append(answer[place.first + offset], of: answer) }
        }
        return replies
    }

    /// One node's answer: its replies, and where each of its units' replies start.
    private struct NodeAnswer: Sendable {
        let replies: RedisReplies
        let firstReply: [Int]
    }

    /// Sends each node its units (after `ASKING` where asked) in one pipelined batch, all nodes at once, and returns
    /// each node's replies and where each of its units' replies start, in the order of the node's units.
    private func send(
        _ groups: [RedisNodeAddress: [(unit: Int, asking: Bool)]], units: [RedisClusterUnit], batch: RedisBatch
    ) async throws -> [RedisNodeAddress: NodeAnswer] {
        var work: [(RedisNodeAddress, RedisConnection, RedisBatch, [(commands: Int, asking: Bool)])] = []
        for (node, items) in groups {
            let shape = items.map { (commands: units[$0.unit].commands, asking: $0.asking) }
            let sub: RedisBatch
            if items.count == units.count && !items.contains(where: \.asking) {
                sub = batch  // the whole batch goes to one node, in order
            } else {
                var bytes: [UInt8] = []
                var count = 0
                for item in items {
                    if item.asking {
                        bytes.append(contentsOf: Self.asking)
                        count += 1
                    }
                    bytes.append(contentsOf: batch.bytes[units[item.unit].bytes])
                    count += units[item.unit].commands
                }
                sub = RedisBatch(encoded: bytes, count: count)
            }
            work.append((node, try connection(to: node), sub, shape))
        }
        if work.count == 1 {
            let (node, connection, sub, shape) = work[0]
            return [node: try await sendOne(connection, sub, shape)]
        }
        return try await withThrowingTaskGroup(of: (RedisNodeAddress, NodeAnswer).self) { group in
            for (node, connection, sub, shape) in work {
                group.addTask { (node, try await self.sendOne(connection, sub, shape)) }
            }
            var answers: [RedisNodeAddress: NodeAnswer] = [:]
            for try await (node, replies) in group { answers[node] = replies }
            return answers
        }
    }

    private func sendOne(
        _ connection: RedisConnection, _ batch: RedisBatch, _ shape: [(commands: Int, asking: Bool)]
    ) async throws -> NodeAnswer {
        let replies: RedisReplies
        do {
            replies = try await connection.pipelineFlat(batch)
        } catch let error as RedisError {
            if error.isRetryable { requestRefresh() }
            throw error
        }
        var firstReply: [Int] = []
        firstReply.reserveCapacity(shape.count)
        var index = 0
        for unit in shape {
            if unit.asking { index += 1 }
            firstReply.append(index)
            index += unit.commands
        }
        guard index == replies.count else {
            throw RedisError(.unexpectedReply, "a node answered \(replies.count) replies for \(index) commands")
        }
        return NodeAnswer(replies: replies, firstReply: firstReply)
    }

    private static let asking: [UInt8] = RedisCommand("ASKING").encoded

    /// The redirection among a unit's replies, if any: a queued command of a transaction can be the one redirected.
    private static func redirection(
        in replies: RedisReplies, _ unit: Range<Int>, from node: RedisNodeAddress
    ) -> Redirection? {
        for index in unit {
            guard let message = replies.errorMessage(replies[index]) else { continue }
            if message.hasPrefix("MOVED ") || message.hasPrefix("ASK ") {
                let fields = message.split(separator: " ")
                guard fields.count >= 3, let slot = Int(fields[1]), (0..<RedisSlot.count).contains(slot),
                    let target = try? RedisNodeAddress(parsing: fields[2], defaultHost: node.host)
                else { continue }
                return fields[0] == "MOVED" ? .moved(slot: slot, node: target) : .ask(node: target)
            }
            if message.hasPrefix("TRYAGAIN") || message.hasPrefix("CLUSTERDOWN") { return .retryLater(message) }
        }
        return nil
    }

    // MARK: Nodes and the map

    private func connection(to node: RedisNodeAddress) throws -> RedisConnection {
        let connection = state.withLock { state -> RedisConnection? in
            if state.closed { return nil }
            if let known = state.connections[node] { return known }
            let connection = RedisConnection(configuration: configuration.node(node), logger: logger)
            state.connections[node] = connection
            return connection
        }
        guard let connection else { throw RedisError(.closed, "the Redis connection was closed") }
        return connection
    }

    /// The current map; learnt first when there is none yet.
    private func currentMap() async throws -> RedisSlotMap {
        let map = state.withLock { $0.map }
        if !map.isEmpty { return map }
        try await refreshMap()
        return state.withLock { $0.map }
    }

    /// Learns the map now (joining a refresh already running).
    func refreshMap() async throws {
        try await startRefresh().value.get()
    }

    /// Learns the map in the background (joining a refresh already running).
    private func requestRefresh() {
        _ = startRefresh()
    }

    private func startRefresh() -> Task<Result<Void, RedisError>, Never> {
        state.withLock { state in
            if let running = state.refresh { return running }
            let task = Task { await self.loadMap() }
            state.refresh = task
            return task
        }
    }

    /// Asks the known masters (those with an open connection first), then the seeds, for `CLUSTER SLOTS`, and keeps
    /// the first answer.
    private func loadMap() async -> Result<Void, RedisError> {
        let (known, closed) = state.withLock { state in
            (
                state.map.nodes.sorted {
                    (state.connections[$0]?.isConnected ?? false) && !(state.connections[$1]?.isConnected ?? false)
                },
                state.closed
            )
        }
        var candidates: [RedisNodeAddress] = []
        for node in known + configuration.clusterSeeds where !candidates.contains(node) { candidates.append(node) }
        var failures: [String] = []
        if !closed {
            for node in candidates {
                do {
                    let reply = try await connection(to: node).send(RedisCommand("CLUSTER", "SLOTS"))
                    if case .error(let message) = reply {
                        failures.append("\(node): \(message)")
                        continue
                    }
                    let map = try RedisSlotMap(slotsReply: reply, answeredBy: node)
                    if map.isEmpty {
                        failures.append("\(node): no slot is assigned")
                        continue
                    }
                    let seeds = Set(configuration.clusterSeeds)
                    let (changed, gone) = state.withLock { state in
                        let changed = state.map.nodes != map.nodes
                        state.map = map
                        state.refreshes += 1
                        state.refresh = nil
                        // Connections to nodes that left the cluster (or that a redirection once named) go.
                        let keep = Set(map.nodes).union(seeds)
                        let gone = state.connections.filter { !keep.contains($0.key) }
                        for node in gone.keys { state.connections[node] = nil }
                        return (changed, Array(gone.values))
                    }
                    for connection in gone { connection.close() }
                    if changed {
                        logger.info(
                            "redis cluster slot map learnt",
                            metadata: ["masters": "\(map.nodes.map(\.description).joined(separator: ","))"])
                    }
                    return .success(())
                } catch let error as RedisError {
                    failures.append("\(node): \(error.message)")
                } catch {
                    failures.append("\(node): \(error)")
                }
            }
        }
        state.withLock { $0.refresh = nil }
        let reason = closed ? "closed" : failures.joined(separator: "; ")
        logger.warning("redis cluster slot map unavailable", metadata: ["error": "\(reason)"])
        return .failure(
            closed
                ? RedisError(.closed, "the Redis connection was closed")
                : RedisError(.clusterUnavailable, "no Redis Cluster node answered CLUSTER SLOTS: \(reason)"))
    }
}
