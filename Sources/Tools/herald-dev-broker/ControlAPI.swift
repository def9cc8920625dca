// The control API's routes: what each request does to the cluster and what it answers (JSON). The HTTP side is
// ControlServer.swift.
import Foundation

/// One answer: a status and a JSON (or plain text) body.
struct ControlAnswer: Sendable {
    var status: Int
    var body: String
    var contentType = "application/json"

    static func json<T: Encodable>(_ value: T, status: Int = 200) -> ControlAnswer {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.keyEncodingStrategy = .convertToSnakeCase
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return ControlAnswer(status: status, body: String(decoding: data, as: UTF8.self) + "\n")
    }

    static func error(_ status: Int, _ message: String) -> ControlAnswer {
        json(["error": message], status: status)
    }
}

struct ControlAPI: Sendable {
    let cluster: DevCluster

    /// The routes, for the 404 answer and the usage text.
    static let routes = [
        "GET /healthz", "GET /brokers", "GET /topics", "POST /topics?name=T&partitions=N[&replication=R]",
        "POST /brokers/ID/down[?groups=G1,G2]", "POST /brokers/ID/up",
        "POST /partitions/leader?topic=T&partition=N&broker=ID", "GET /groups/G",
        "POST /groups/G/coordinator?broker=ID",
    ]

    func handle(method: String, path: String, query: [String: String]) -> ControlAnswer {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        switch (method, parts.count, parts.first) {
        case ("GET", 1, "healthz"):
            return ControlAnswer(status: 200, body: "ok\n", contentType: "text/plain")
        case ("GET", 1, "brokers"):
            return .json(cluster.brokers())
        case ("GET", 1, "topics"):
            guard let topics = cluster.topics() else { return .error(503, "no broker answered the metadata request") }
            return .json(topics)
        case ("POST", 1, "topics"):
            return createTopic(query)
        case ("POST", 3, "brokers") where parts[2] == "down" || parts[2] == "up":
            guard let id = Int32(parts[1]), cluster.isKnown(id) else {
                return .error(404, "no broker \(parts[1]); brokers are 1...\(cluster.ports.count)")
            }
            return parts[2] == "down" ? down(id, query) : up(id)
        case ("POST", 2, "partitions") where parts[1] == "leader":
            return moveLeader(query)
        case ("GET", 2, "groups"):
            guard let node = cluster.coordinator(ofGroup: parts[1]) else {
                return .error(503, "no broker answered FindCoordinator")
            }
            return .json(GroupCoordinator(group: parts[1], coordinator: node))
        case ("POST", 3, "groups") where parts[2] == "coordinator":
            return pinCoordinator(group: parts[1], query)
        default:
            let known = Self.routes.contains { $0.hasPrefix(method + " /" + (parts.first ?? "")) }
            return .error(
                known ? 400 : 404, "no route \(method) \(path); routes: \(Self.routes.joined(separator: ", "))")
        }
    }

    private struct GroupCoordinator: Codable {
        var group: String
        var coordinator: Int32
    }

    private func createTopic(_ query: [String: String]) -> ControlAnswer {
        guard let name = query["name"], !name.isEmpty else { return .error(400, "name= is required") }
        guard let partitions = query["partitions"].flatMap(Int32.init), partitions > 0 else {
            return .error(400, "partitions= must be a positive number")
        }
        let replication = query["replication"].flatMap(Int32.init) ?? cluster.defaultReplication
        guard replication >= 1, Int(replication) <= cluster.ports.count else {
            return .error(400, "replication= must be 1...\(cluster.ports.count)")
        }
        do {
            let created = try cluster.createTopic(name, partitions: partitions, replication: replication)
            struct Created: Codable {
                var topic: String
                var partitions: Int32
                var created: Bool
            }
            return .json(Created(topic: name, partitions: partitions, created: created))
        } catch {
            return .error(500, "\(error)")
        }
    }

    private func down(_ id: Int32, _ query: [String: String]) -> ControlAnswer {
        guard cluster.isUp(id) else { return .error(409, "broker \(id) is down already") }
        let groups = (query["groups"] ?? "").split(separator: ",").map(String.init)
        do {
            return .json(try cluster.down(id, groups: groups))
        } catch {
            return .error(500, "\(error)")
        }
    }

    private func up(_ id: Int32) -> ControlAnswer {
        do {
            try cluster.up(id)
            struct Up: Codable {
                var broker: Int32
                var up: Bool
            }
            return .json(Up(broker: id, up: true))
        } catch {
            return .error(500, "\(error)")
        }
    }

    private func moveLeader(_ query: [String: String]) -> ControlAnswer {
        guard let topic = query["topic"], !topic.isEmpty, let partition = query["partition"].flatMap(Int32.init),
            let broker = query["broker"].flatMap(Int32.init)
        else { return .error(400, "topic=, partition= and broker= are required") }
        guard cluster.isKnown(broker) else { return .error(404, "no broker \(broker)") }
        guard cluster.isUp(broker) else { return .error(409, "broker \(broker) is down") }
        // Looked up first: the mock creates a topic it is asked to set a leader of (with 4 partitions).
        guard let leaders = cluster.partitionLeaders() else {
            return .error(503, "no broker answered the metadata request")
        }
        guard let from = leaders.first(where: { $0.topic == topic && $0.partition == partition })?.leader else {
            return .error(404, "no partition \(topic)/\(partition)")
        }
        do {
            try cluster.setLeader(topic: topic, partition: partition, broker: broker)
            return .json(LeaderMove(topic: topic, partition: partition, from: from, to: broker))
        } catch {
            return .error(500, "\(error)")
        }
    }

    private func pinCoordinator(group: String, _ query: [String: String]) -> ControlAnswer {
        guard let broker = query["broker"].flatMap(Int32.init) else { return .error(400, "broker= is required") }
        guard cluster.isKnown(broker) else { return .error(404, "no broker \(broker)") }
        do {
            try cluster.pinCoordinator(group: group, broker: broker)
            return .json(GroupCoordinator(group: group, coordinator: broker))
        } catch {
            return .error(500, "\(error)")
        }
    }
}
