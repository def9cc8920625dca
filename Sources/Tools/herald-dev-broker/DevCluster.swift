// The mock cluster herald-dev-broker serves: librdkafka's rd_kafka_mock_cluster_t on fixed loopback ports, plus what
// a controller would do when a broker goes down (move the leadership of its partitions, and of the group
// coordinators it was told about, to a broker that is up).
import CHeraldPortPlan
import CRdKafka
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A failure to start or drive the cluster, with what to do about it.
struct DevBrokerError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One mock broker as `GET /brokers` shows it.
struct BrokerState: Codable, Sendable {
    var id: Int32
    var port: Int
    var up: Bool
    /// The partitions it leads, as `topic/partition` (nil when no broker answered the metadata request).
    var leads: [String]?
}

/// A partition whose leadership moved.
struct LeaderMove: Codable, Sendable {
    var topic: String
    var partition: Int32
    var from: Int32
    var to: Int32
}

/// A partition and its leader, from a metadata request.
struct PartitionLeader: Sendable {
    var topic: String
    var partition: Int32
    var leader: Int32
}

/// Owns the `rd_kafka_t` the mock cluster lives in, the cluster, and a second client that reads the cluster's
/// metadata (which broker leads which partition: the mock API has no getter for it).
final class DevCluster: @unchecked Sendable {
    // Safe: the handles are set once in `init` and destroyed once in `destroy()`, after the control server stopped;
    // librdkafka's mock API hands every call to the cluster's own thread through an op queue (thread-safe), and
    // `rd_kafka_metadata` may be called from any thread. The mutable bookkeeping is behind `state`.
    private let rk: OpaquePointer
    private let cluster: OpaquePointer
    private let observer: OpaquePointer
    let ports: [Int]
    let bootstrap: String
    private let state: Mutex<State>

    private struct State {
        var up: [Int32: Bool]
        var destroyed = false
        /// Group ids whose coordinator moves off a broker that goes down (`--group`, `?groups=`, pinned ones).
        var groups: Set<String>
    }

    var brokerIDs: [Int32] { (1...Int32(ports.count)).map { $0 } }

    /// Creates `brokers` mock brokers listening on 127.0.0.1:`basePort` + i - 1 (broker i, 1-based).
    init(brokers: Int, basePort: Int, initialRebalanceDelayMs: Int32, groups: [String]) throws {
        let planned = (0..<brokers).map { basePort + $0 }
        for port in planned where !Self.portIsFree(port) {
            throw DevBrokerError("port \(port) is in use: stop what holds it or choose another --port")
        }
        var errbuf = [CChar](repeating: 0, count: 512)
        guard let conf = rd_kafka_conf_new() else { throw DevBrokerError("rd_kafka_conf_new failed") }
        // Warnings and worse only: a client without bootstrap.servers logs a notice about it.
        rd_kafka_conf_set(conf, "log_level", "4", &errbuf, errbuf.count)
        rd_kafka_conf_set(conf, "client.id", "herald-dev-broker", &errbuf, errbuf.count)
        guard let rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, &errbuf, errbuf.count) else {
            throw DevBrokerError("rd_kafka_new failed: \(text(errbuf))")
        }
        // The plan is armed only while the cluster opens its listeners (one bind per broker, in broker order).
        let ports16 = planned.map { UInt16($0) }
        _ = ports16.withUnsafeBufferPointer { herald_port_plan_arm($0.baseAddress, Int32($0.count)) }
        let created = rd_kafka_mock_cluster_new(rk, Int32(brokers))
        let used = Int(herald_port_plan_disarm())
        guard let cluster = created else {
            rd_kafka_destroy(rk)
            throw DevBrokerError("rd_kafka_mock_cluster_new failed (a port of \(planned) taken meanwhile?)")
        }
        let bootstrap = String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
        let actual = bootstrap.split(separator: ",").compactMap { $0.split(separator: ":").last.flatMap { Int($0) } }
        guard used == brokers, actual == planned else {
            rd_kafka_mock_cluster_destroy(cluster)
            rd_kafka_destroy(rk)
            throw DevBrokerError(
                "the mock cluster did not take the planned ports \(planned) (got \(bootstrap); \(used) planned binds, "
                    + "\(herald_port_plan_binds_seen()) binds seen): bind(2) is not interposed in this build")
        }
        rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, initialRebalanceDelayMs)

        guard let observerConf = rd_kafka_conf_new() else { throw DevBrokerError("rd_kafka_conf_new failed") }
        for (key, value) in [
            ("bootstrap.servers", bootstrap), ("client.id", "herald-dev-broker-control"),
            // A broker set down refuses connections; the observer's reconnect errors are expected, not news.
            ("log_level", "2"), ("log.connection.close", "false"),
        ] {
            guard rd_kafka_conf_set(observerConf, key, value, &errbuf, errbuf.count) == RD_KAFKA_CONF_OK else {
                throw DevBrokerError("\(key): \(text(errbuf))")
            }
        }
        guard let observer = rd_kafka_new(RD_KAFKA_PRODUCER, observerConf, &errbuf, errbuf.count) else {
            rd_kafka_mock_cluster_destroy(cluster)
            rd_kafka_destroy(rk)
            throw DevBrokerError("rd_kafka_new (metadata client) failed: \(text(errbuf))")
        }
        self.rk = rk
        self.cluster = cluster
        self.observer = observer
        self.ports = planned
        self.bootstrap = bootstrap
        self.state = Mutex(
            State(up: Dictionary(uniqueKeysWithValues: (1...Int32(brokers)).map { ($0, true) }), groups: Set(groups)))
    }

    /// Whether nothing listens on 127.0.0.1:`port` now (bound with SO_REUSEADDR, as the mock binds: a port in
    /// TIME_WAIT from the previous run is free).
    private static func portIsFree(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var on: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = loopbackAddress(port: port)
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    // MARK: Topics

    /// Creates a topic; false when it exists already.
    func createTopic(_ name: String, partitions: Int32, replication: Int32) throws -> Bool {
        let err = rd_kafka_mock_topic_create(cluster, name, partitions, replication)
        if err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS { return false }
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw DevBrokerError("creating topic \(name): \(String(cString: rd_kafka_err2str(err)))")
        }
        return true
    }

    /// The default replication factor of a new topic: every broker, at most 3 (the mock's own default).
    var defaultReplication: Int32 { Int32(min(3, ports.count)) }

    // MARK: Metadata

    /// Every partition of every topic with its leader, from a metadata request to a broker that is up; nil when
    /// none answered within `timeoutMs`.
    func partitionLeaders(timeoutMs: Int32 = 3000) -> [PartitionLeader]? {
        var metadata: UnsafePointer<rd_kafka_metadata>?
        let err = rd_kafka_metadata(observer, 1, nil, &metadata, timeoutMs)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else { return nil }
        defer { rd_kafka_metadata_destroy(metadata) }
        var leaders: [PartitionLeader] = []
        let md = metadata.pointee
        for t in 0..<Int(md.topic_cnt) {
            let topic = md.topics[t]
            guard topic.err == RD_KAFKA_RESP_ERR_NO_ERROR else { continue }
            let name = String(cString: topic.topic)
            for p in 0..<Int(topic.partition_cnt) {
                let partition = topic.partitions[p]
                leaders.append(PartitionLeader(topic: name, partition: partition.id, leader: partition.leader))
            }
        }
        return leaders.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) }
    }

    /// Partition counts per topic; nil when no broker answered.
    func topics() -> [String: Int]? {
        partitionLeaders().map { leaders in leaders.reduce(into: [:]) { $0[$1.topic, default: 0] += 1 } }
    }

    // MARK: Brokers

    func isKnown(_ broker: Int32) -> Bool { broker >= 1 && Int(broker) <= ports.count }
    func isUp(_ broker: Int32) -> Bool { state.withLock { $0.up[broker] ?? false } }

    func brokers() -> [BrokerState] {
        let leaders = partitionLeaders()
        let up = state.withLock { $0.up }
        return brokerIDs.map { id in
            BrokerState(
                id: id, port: ports[Int(id) - 1], up: up[id] ?? false,
                leads: leaders.map { $0.filter { $0.leader == id }.map { "\($0.topic)/\($0.partition)" } })
        }
    }

    /// Moves the leadership of `topic`/`partition` to `broker`.
    func setLeader(topic: String, partition: Int32, broker: Int32) throws {
        let err = rd_kafka_mock_partition_set_leader(cluster, topic, partition, broker)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw DevBrokerError("\(topic)/\(partition) -> \(broker): \(String(cString: rd_kafka_err2str(err)))")
        }
    }

    /// What `down` did: the partitions and groups it moved, and why something stayed.
    struct DownResult: Codable, Sendable {
        var broker: Int32
        var up: Bool
        var moved: [LeaderMove]
        var groupsMoved: [String: Int32]
        var note: String?
    }

    /// Takes `broker` down as a failed broker with a controller behind it: first the leadership of each partition it
    /// leads goes to the brokers still up (in turn), and each known group it coordinates to one of them; then its
    /// listener stops accepting and its connections are closed (`rd_kafka_mock_broker_set_down`). The records stay:
    /// the mock keeps one log per partition whatever broker leads it.
    func down(_ broker: Int32, groups extraGroups: [String]) throws -> DownResult {
        let (others, known) = state.withLock { state -> ([Int32], Set<String>) in
            state.groups.formUnion(extraGroups)
            return (brokerIDs.filter { $0 != broker && state.up[$0] == true }, state.groups)
        }
        var result = DownResult(broker: broker, up: false, moved: [], groupsMoved: [:])
        if others.isEmpty {
            result.note = "no other broker is up: leadership stays on broker \(broker)"
        } else if let leaders = partitionLeaders() {
            for (i, led) in leaders.filter({ $0.leader == broker }).enumerated() {
                let target = others[i % others.count]
                try setLeader(topic: led.topic, partition: led.partition, broker: target)
                result.moved.append(LeaderMove(topic: led.topic, partition: led.partition, from: broker, to: target))
            }
            for (i, group) in known.sorted().enumerated() where coordinator(ofGroup: group) == broker {
                let target = others[i % others.count]
                try pinCoordinator(group: group, broker: target)
                result.groupsMoved[group] = target
            }
        } else {
            result.note = "no broker answered the metadata request: leadership not moved"
        }
        let err = rd_kafka_mock_broker_set_down(cluster, broker)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw DevBrokerError("broker \(broker) down: \(String(cString: rd_kafka_err2str(err)))")
        }
        state.withLock { $0.up[broker] = false }
        return result
    }

    /// Lets `broker` accept connections again. Leadership stays where `down` moved it (move it back with
    /// `setLeader`, as a preferred-leader election would).
    func up(_ broker: Int32) throws {
        let err = rd_kafka_mock_broker_set_up(cluster, broker)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw DevBrokerError("broker \(broker) up: \(String(cString: rd_kafka_err2str(err)))")
        }
        state.withLock { $0.up[broker] = true }
    }

    // MARK: Group coordinators

    /// The broker that coordinates `group`, as the cluster answers a FindCoordinator request (asked of a broker
    /// that is up); nil when none answered.
    func coordinator(ofGroup group: String) -> Int32? {
        let up = state.withLock { $0.up }
        for id in brokerIDs where up[id] == true {
            if let node = FindCoordinator.ask(port: ports[Int(id) - 1], group: group) { return node }
        }
        return nil
    }

    /// Makes `broker` the coordinator of `group` (`rd_kafka_mock_coordinator_set`); the group's state and committed
    /// offsets are the cluster's, so members carry on after NOT_COORDINATOR and a new FindCoordinator.
    func pinCoordinator(group: String, broker: Int32) throws {
        let err = rd_kafka_mock_coordinator_set(cluster, "group", group, broker)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw DevBrokerError("coordinator of \(group) -> \(broker): \(String(cString: rd_kafka_err2str(err)))")
        }
        state.withLock { _ = $0.groups.insert(group) }
    }

    // MARK: Shutdown

    /// Destroys the metadata client, the cluster (closing every listener and connection) and its handle, once.
    func destroy() {
        let first = state.withLock { state -> Bool in
            defer { state.destroyed = true }
            return !state.destroyed
        }
        guard first else { return }
        rd_kafka_destroy(observer)
        rd_kafka_mock_cluster_destroy(cluster)
        rd_kafka_destroy(rk)
    }

    deinit { destroy() }
}

/// The text in a C error buffer, up to its first NUL.
private func text(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

func loopbackAddress(port: Int) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(truncatingIfNeeded: port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return address
}
