import ArgumentParser
import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldToolSupport

/// `heraldctl dlq list|replay`: inspect herald.dlq and send chosen originals back to where they came from.
struct DLQCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dlq",
        abstract: "Inspect and replay the dead-letter queue (herald.dlq).",
        subcommands: [List.self, Replay.self])

    /// Which DLQ entries a command works on.
    struct Selection: ParsableArguments {
        @Option(name: .long, help: "Only entries of this stage (ingest, resolve, suppress, render, send, registry).")
        var stage: String?
        @Option(name: .long, help: "Only entries with this reason code.") var reason: String?
        @Option(name: .long, parsing: .upToNextOption, help: "Only these entries, as PARTITION:OFFSET of herald.dlq.")
        var entry: [String] = []
        @Option(name: .long, help: "At most this many entries (the oldest first).") var limit: Int?
        @Option(name: .customLong("dlq-topic"), help: "DLQ topic (default: herald.dlq, or the --pipeline file's).")
        var dlqTopic: String?

        func validate() throws {
            if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
            for e in entry where Self.parseEntry(e) == nil {
                throw ValidationError("--entry must be PARTITION:OFFSET, got \(e)")
            }
        }

        static func parseEntry(_ text: String) -> (Int32, Int64)? {
            let parts = text.split(separator: ":")
            guard parts.count == 2, let p = Int32(parts[0]), let o = Int64(parts[1]) else { return nil }
            return (p, o)
        }

        /// Reads the whole DLQ (no consumer group, nothing committed) and keeps what the filters select.
        func select(kafka: KafkaOptions, topics: TopicOptions) async -> [Entry] {
            let topic = dlqTopic ?? topics.topics().dlq
            let records: [ConsumerRecord]
            do {
                records = try await KafkaTopicReader.readAll(
                    topic: topic, configuration: kafka.client, logger: CLI.quietLogger)
            } catch {
                CLI.fail("kafka: \(error.description)")
            }
            let wanted = Swift.Set(entry.compactMap(Self.parseEntry).map { "\($0.0):\($0.1)" })
            var selected: [Entry] = []
            for record in records {
                if !wanted.isEmpty && !wanted.contains("\(record.partition):\(record.offset)") { continue }
                let entry = Entry(record: record)
                if let stage, entry.dlq?.stage != stage { continue }
                if let reason, entry.dlq?.reason != reason { continue }
                selected.append(entry)
                if let limit, selected.count >= limit { break }
            }
            return selected
        }
    }

    /// One record of the DLQ topic, decoded when it can be.
    struct Entry {
        let record: ConsumerRecord
        let dlq: DLQRecord?
        let error: String?

        init(record: ConsumerRecord) {
            self.record = record
            if let value = record.value {
                do {
                    dlq = try StageCodec.decode(DLQRecord.self, from: value)
                    error = nil
                } catch {
                    dlq = nil
                    self.error = "not a DLQ record: \(error.detail)"
                }
            } else {
                dlq = nil
                error = "tombstone"
            }
        }

        func line(withOriginal: Bool) -> String {
            var o: [String: JSONValue] = ["partition": .int(record.partition), "offset": .int(record.offset)]
            if let key = record.key { o["key"] = .string(String(decoding: key, as: UTF8.self)) }
            if let dlq {
                o["stage"] = .string(dlq.stage)
                o["reason"] = .string(dlq.reason)
                o["detail"] = .string(dlq.detail)
                o["time"] = .int(dlq.time)
                o["time_iso"] = .string(CLI.iso(dlq.time))
                o["source_topic"] = .text(dlq.sourceTopic)
                if let target = dlq.targetTopic { o["target_topic"] = .string(target) }
                let bytes = dlq.originalBytes
                o["original_bytes"] = .int(bytes?.count)
                if withOriginal {
                    if let bytes, let text = String(validating: bytes, as: UTF8.self) {
                        o["original"] = .string(text)
                    } else {
                        o["original_base64"] = .string(dlq.original)
                    }
                }
            } else {
                o["error"] = .string(error ?? "unreadable")
            }
            return CLI.json(o)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Print DLQ entries, oldest first, one JSON line each (stage, reason, detail, time, source topic).",
            discussion: """
                Reads herald.dlq from the beginning to its current end without a consumer group and without \
                committing anything, so listing never changes what other readers see. The original record \
                (which may hold message text) is printed only with --original.
                """)

        @OptionGroup var selection: Selection
        @Flag(name: .long, help: "Include the original record (as text when it is UTF-8, else base64).") var original =
            false
        @OptionGroup var kafka: KafkaOptions
        @OptionGroup var topics: TopicOptions

        func run() async throws {
            for entry in await selection.select(kafka: kafka, topics: topics) {
                CLI.out(entry.line(withOriginal: original))
            }
        }
    }

    struct Replay: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Republish the original records of the selected DLQ entries to their source topic (a refused output: to its target topic).",
            discussion: """
                Select with --stage, --reason, --entry and --limit (at least one of --stage, --reason, --entry is \
                required, so a bare replay never floods the pipeline). Each original goes back with the DLQ \
                record's key and a `herald-replayed-from: <dlq-topic>/<partition>/<offset>` header. The DLQ itself \
                is not changed: a replayed record that fails again lands there once more. --dry-run prints what \
                would be sent.
                """)

        /// Records sent (and acknowledged) per progress step.
        static let progressBatch = 200

        @OptionGroup var selection: Selection
        @Option(name: .long, help: "Send to this topic instead of each entry's source topic.") var to: String?
        @Flag(name: .customLong("dry-run"), help: "Print the selection, send nothing.") var dryRun = false
        @OptionGroup var kafka: KafkaOptions
        @OptionGroup var topics: TopicOptions
        @OptionGroup var redis: RedisOptions

        func validate() throws {
            if selection.stage == nil && selection.reason == nil && selection.entry.isEmpty {
                throw ValidationError("select entries with --stage, --reason or --entry")
            }
        }

        func run() async throws {
            let dlqTopic = selection.dlqTopic ?? topics.topics().dlq
            var outgoing: [(Entry, ProducerRecord)] = []
            for entry in await selection.select(kafka: kafka, topics: topics) {
                guard let dlq = entry.dlq, let bytes = dlq.originalBytes else {
                    CLI.warn(
                        "skipping \(entry.record.partition):\(entry.record.offset): \(entry.error ?? "original is not base64")"
                    )
                    continue
                }
                guard let target = to ?? dlq.replayTopic else {
                    CLI.warn(
                        "skipping \(entry.record.partition):\(entry.record.offset): no source topic recorded (use --to)"
                    )
                    continue
                }
                let header = KafkaHeader(
                    key: "herald-replayed-from", string: "\(dlqTopic)/\(entry.record.partition)/\(entry.record.offset)")
                outgoing.append(
                    (entry, ProducerRecord(topic: target, key: entry.record.key, value: bytes, headers: [header])))
            }
            if dryRun || outgoing.isEmpty {
                for (entry, record) in outgoing {
                    CLI.out(
                        CLI.json([
                            "dlq_partition": .int(entry.record.partition), "dlq_offset": .int(entry.record.offset),
                            "topic": .string(record.topic), "would_send": .bool(true),
                        ]))
                }
                if outgoing.isEmpty { CLI.warn("no DLQ entries selected") }
                return
            }
            let producer = try kafka.producer()
            // In batches, so the operator sees progress (a bar on a terminal, plain lines otherwise) on stderr.
            let progress = CLIProgress("replay", total: outgoing.count)
            var reports: [DeliveryReport] = []
            do {
                var start = outgoing.startIndex
                while start < outgoing.endIndex {
                    let end = min(start + Self.progressBatch, outgoing.endIndex)
                    reports += try await producer.send(outgoing[start..<end].map(\.1))
                    progress.advance(by: end - start)
                    start = end
                }
                try await producer.shutdown(timeout: .seconds(10))
            } catch {
                CLI.fail("kafka: \(error.description)")
            }
            progress.finish()
            await ringDoorbells(Set(reports.filter { $0.error == nil }.map(\.topic)))
            var failed = false
            for ((entry, _), report) in zip(outgoing, reports) {
                var o: [String: JSONValue] = [
                    "dlq_partition": .int(entry.record.partition), "dlq_offset": .int(entry.record.offset),
                    "topic": .string(report.topic),
                ]
                if let error = report.error {
                    failed = true
                    o["error"] = .string(error.description)
                } else {
                    o["partition"] = .int(report.partition)
                    o["offset"] = .int(report.offset ?? -1)
                }
                CLI.out(CLI.json(o))
            }
            if failed { throw ExitCode(1) }
        }

        /// Stages whose consumers are idle fetch replayed records at their next probe (the local profile: up to
        /// `doorbell_probe_interval_ms`); ringing the replayed topics' doorbells makes them fetch at once. Best
        /// effort: without Redis the records only wait for that probe.
        private func ringDoorbells(_ replayed: Set<String>) async {
            let rung = replayed.intersection(topics.topics().interStage)
            guard !rung.isEmpty, let configuration = try? redis.configuration() else { return }
            let connection = RedisConnection(configuration: configuration, logger: CLI.quietLogger)
            defer { connection.close() }
            let failed = await RedisKeys.ringDoorbells(rung, on: connection)
            if !failed.isEmpty {
                CLI.warn("could not ring the idle doorbell of \(failed.joined(separator: ", ")) (Redis unreachable?)")
            }
        }
    }
}
