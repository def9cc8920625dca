import ArgumentParser
import HeraldConfig
import HeraldKafka

/// `heraldctl topics`: create Kafka topics that are missing (works against Apache Kafka, herald-dev-broker and Tansu).
struct Topics: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create Kafka topics that do not exist yet (NAME or NAME:PARTITIONS).")

    @OptionGroup var kafka: KafkaOptions

    @Option(name: .long, help: "Partitions for topics given without a count.")
    var partitions: Int32 = 4

    @Option(name: .long, help: "Replication factor.")
    var replication: Int32 = 1

    @Option(
        name: .long,
        help:
            "Also create every topic this pipeline file names (both lanes, DLQ, registry), with --partitions each (the DLQ: 1)."
    )
    var pipeline: String?

    @Argument(help: "Topics as NAME or NAME:PARTITIONS.")
    var topics: [String] = []

    func run() async throws {
        let specs = try topicSpecs()
        let configuration = KafkaAdminConfiguration(client: kafka.client)
        let created = Set(try await KafkaAdmin.createTopics(specs, configuration: configuration))
        for spec in specs {
            print(
                created.contains(spec.name)
                    ? "created \(spec.name) (\(spec.partitions) partitions)" : "exists  \(spec.name)")
        }
    }

    /// The topics to create. Kept out of `run()`: the release compiler (Swift 6.3.1) crashed splitting `run()`'s
    /// coroutine when the typed-throwing pipeline loader was called inside it.
    private func topicSpecs() throws -> [TopicSpec] {
        var specs: [TopicSpec] = []
        var topics = self.topics
        if let pipeline {
            let names = try PipelineLoader.load(path: pipeline).config.kafka.topics
            let given = Set(topics.map { String($0.split(separator: ":").first ?? "") })
            for name in names.all where !given.contains(name) {
                topics.append(name == names.dlq ? "\(name):1" : name)
            }
        }
        guard !topics.isEmpty else { throw ValidationError("no topics: name some, or give --pipeline") }
        for topic in topics {
            let parts = topic.split(separator: ":", maxSplits: 1).map(String.init)
            guard let name = parts.first, !name.isEmpty else { throw ValidationError("empty topic name in '\(topic)'") }
            var count = partitions
            if parts.count == 2 {
                guard let parsed = Int32(parts[1]), parsed > 0 else {
                    throw ValidationError("bad partition count in '\(topic)'")
                }
                count = parsed
            }
            specs.append(TopicSpec(name: name, partitions: count, replicationFactor: replication))
        }
        return specs
    }
}
