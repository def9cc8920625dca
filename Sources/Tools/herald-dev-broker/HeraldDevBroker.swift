// herald-dev-broker: librdkafka's mock cluster as the local and test Kafka broker, on fixed loopback ports, with a
// control port to create topics, take brokers down and up and move partition leaders. Reads options, builds the
// cluster and the control server, prints the ready line, serves until SIGTERM/SIGINT, then tears the cluster down.
import ArgumentParser
import Foundation

#if canImport(Glibc)
import Glibc
#endif

@main
struct HeraldDevBroker: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-dev-broker",
        abstract: "A Kafka-compatible broker for local stacks and tests: librdkafka's mock cluster on fixed ports.",
        discussion: """
            Broker i (1-based) listens on 127.0.0.1:PORT+i-1. Everything is in memory and one thread serves every \
            broker; each partition keeps about 5 MB or 100,000 message sets (older ones are dropped). Control API \
            (HTTP/1.1 on 127.0.0.1:CONTROL-PORT): \(ControlAPI.routes.joined(separator: "; ")).
            """)

    @Option(help: "Number of brokers.") var brokers = 3
    @Option(help: "Port of broker 1; broker i listens on PORT+i-1.") var port = 19192
    @Option(name: .customLong("control-port"), help: "Port of the control API (default: PORT+100).")
    var controlPort: Int?
    @Option(
        name: .customLong("topic"),
        help: "NAME:PARTITIONS to create at start-up (repeatable; a topic produced to unknown gets 4).")
    var topics: [String] = []
    @Option(help: "Replication factor of the topics created (default: the number of brokers, at most 3).")
    var replication: Int?
    @Option(
        name: .customLong("initial-rebalance-delay-ms"),
        help: "How long a new group waits for more members before its first assignment (the mock's default: 3000).")
    var initialRebalanceDelayMs: Int32 = 100
    @Option(
        name: .customLong("group"),
        help:
            "A consumer group whose coordinator moves off a broker taken down (repeatable; see POST /brokers/ID/down).")
    var groups: [String] = []
    @Option(name: .customLong("bootstrap-file"), help: "Write the bootstrap list to this file once ready.")
    var bootstrapFile: String?

    func validate() throws {
        guard (1...16).contains(brokers) else { throw ValidationError("--brokers: 1 to 16") }
        guard port > 0, port + brokers - 1 <= 65535 else { throw ValidationError("--port: 1 to \(65536 - brokers)") }
        if let controlPort, !(1...65535).contains(controlPort) { throw ValidationError("--control-port: 1 to 65535") }
        if let replication, !(1...brokers).contains(replication) {
            throw ValidationError("--replication: 1 to \(brokers)")
        }
        for spec in topics where Self.topicSpec(spec) == nil {
            throw ValidationError("--topic: expected NAME:PARTITIONS, got \(spec)")
        }
    }

    static func topicSpec(_ spec: String) -> (name: String, partitions: Int32)? {
        guard let colon = spec.lastIndex(of: ":"), let partitions = Int32(spec[spec.index(after: colon)...]),
            partitions > 0, colon > spec.startIndex
        else { return nil }
        return (String(spec[..<colon]), partitions)
    }

    func run() throws {
        let log = JSONLog()
        // SIGTERM and SIGINT are blocked in every thread (librdkafka's and the control server's inherit the mask)
        // and taken by sigwait below.
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGTERM)
        sigaddset(&signals, SIGINT)
        pthread_sigmask(SIG_BLOCK, &signals, nil)
        signal(SIGPIPE, SIG_IGN)

        let cluster: DevCluster
        let server: ControlServer
        do {
            cluster = try DevCluster(
                brokers: brokers, basePort: port, initialRebalanceDelayMs: initialRebalanceDelayMs, groups: groups)
            for spec in topics {
                guard let (name, partitions) = Self.topicSpec(spec) else { continue }
                let created = try cluster.createTopic(
                    name, partitions: partitions, replication: replication.map(Int32.init) ?? cluster.defaultReplication
                )
                log.write(
                    "info", created ? "topic created" : "topic exists", ["topic": name, "partitions": "\(partitions)"])
            }
            server = try ControlServer(
                port: controlPort ?? port + 100, api: ControlAPI(cluster: cluster), log: log)
        } catch {
            log.write("error", "could not start", ["error": "\(error)"])
            throw ExitCode(1)
        }
        server.start()
        if let bootstrapFile {
            try (cluster.bootstrap + "\n").write(toFile: bootstrapFile, atomically: true, encoding: .utf8)
        }
        FileHandle.standardOutput.write(
            Data("herald-dev-broker ready bootstrap=\(cluster.bootstrap) control=127.0.0.1:\(server.port)\n".utf8))

        var signalNumber: Int32 = 0
        while sigwait(&signals, &signalNumber) != 0 {}
        log.write("info", "stopping", ["signal": "\(signalNumber)"])
        server.stop()
        cluster.destroy()
        log.write("info", "stopped")
    }
}
