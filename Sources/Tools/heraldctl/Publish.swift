import ArgumentParser
import Foundation
import HeraldCore
import HeraldKafka
import HeraldToolSupport

/// `heraldctl publish EVENT.json...`: put chat events on chat.events, keyed by conversation id.
struct Publish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish chat events (docs/behaviour.md §2) to chat.events, keyed by conversation id.",
        discussion: """
            Each file holds one JSON event (pretty-printed is fine) or JSON lines (one event a line). Events are \
            checked as ingest checks them; an invalid one stops the command with status 2 before anything is \
            sent, unless --raw is given (then it is sent as is, e.g. to exercise the DLQ). Prints one line per \
            record with its partition and offset.
            """)

    @Argument(help: "Event files.") var files: [String]
    @Option(name: .long, help: "Topic (default: chat.events, or the --pipeline file's).") var topic: String?
    @Flag(name: .long, help: "Send records even when they are not valid events.") var raw = false
    @OptionGroup var kafka: KafkaOptions
    @OptionGroup var topics: TopicOptions

    func run() async throws {
        var records: [(label: String, key: String?, value: [UInt8])] = []
        for file in files {
            for (index, value) in Self.split(CLI.read(file, what: file)).enumerated() {
                let label = "\(file)#\(index + 1)"
                do {
                    let event = try ChatEvent.decode(value)
                    records.append((label, event.conversation.id, value))
                } catch {
                    guard raw else { CLI.fail("\(label): \(error.description)", status: 2) }
                    records.append((label, Self.conversationID(value), value))
                }
            }
        }
        guard !records.isEmpty else { CLI.fail("no events in \(files.joined(separator: ", "))", status: 2) }
        let name = topic ?? topics.topics().chatEvents
        let producer = try kafka.producer()
        let reports: [DeliveryReport]
        do {
            reports = try await producer.send(records.map { ProducerRecord(topic: name, key: $0.key, value: $0.value) })
            try await producer.shutdown(timeout: .seconds(10))
        } catch {
            CLI.fail("kafka: \(error.description)")
        }
        var failed = false
        for (record, report) in zip(records, reports) {
            if let error = report.error {
                failed = true
                CLI.out(CLI.json(["file": .string(record.label), "error": .string(error.description)]))
            } else {
                CLI.out(
                    CLI.json([
                        "file": .string(record.label), "topic": .string(report.topic), "key": .text(record.key),
                        "partition": .int(report.partition), "offset": .int(report.offset ?? -1),
                    ]))
            }
        }
        if failed { throw ExitCode(1) }
    }

    /// One JSON document, or JSON lines.
    static func split(_ bytes: [UInt8]) -> [[UInt8]] {
        let trimmed = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if trimmed.isEmpty { return [] }
        if (try? JSONValue.parse(trimmed)) != nil { return [Array(trimmed.utf8)] }
        return trimmed.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            .map { Array($0.utf8) }
    }

    /// `conversation.id` of something that is JSON but not a valid event, for the record key.
    static func conversationID(_ value: [UInt8]) -> String? {
        (try? JSONValue.parse(value))?["conversation"]?["id"]?.stringValue
    }
}
