import ArgumentParser
import Foundation
import HeraldConfig
import HeraldCore

/// `heraldctl simulate`: evaluates one event against a state fixture with no
/// Kafka or Redis and prints one JSON line per recipient considered (docs/behaviour.md §9).
struct Simulate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Preview who an event wakes and what they receive, without Kafka or Redis.",
        discussion: """
            Prints one JSON object per line: one per recipient considered, or one line with \
            "user": null when ingest drops the event. Invalid input exits with status 2 and \
            one line on stderr naming the offending field.
            """)

    @Option(name: .long, help: "Chat event JSON file (docs/behaviour.md §2).")
    var event: String

    @Option(name: .long, help: "State fixture JSON file (docs/behaviour.md §3).")
    var state: String

    @Option(name: .long, help: "Pipeline YAML file (apps, templates, catalogs, payload profile).")
    var pipeline: String?

    @Option(
        name: .long,
        help: "Evaluate as of this time: ISO 8601 or epoch milliseconds. Default: the event's created_at, else now.")
    var at: String?

    @Option(
        name: .long,
        help: "For apps with coalesce on: simulate the event as the Nth message of a burst (default 1, the first).")
    var burst: Int = 1

    func run() throws {
        let eventBytes = try read(event, what: "event")
        let stateBytes = try read(state, what: "state")
        var apps = AppDirectory()
        if let pipeline {
            do {
                let loaded = try PipelineLoader.load(path: pipeline)
                for w in loaded.warnings { warn("warning: pipeline \(w)") }
                apps = loaded.config.apps
            } catch {
                fail("pipeline: \(error.description)")
            }
        }
        var atDate: Date?
        if let at {
            guard let d = Simulator.parseTime(at) else {
                fail("--at: expected ISO 8601 (2024-11-19T07:06:40Z) or epoch milliseconds, got \(at)")
            }
            atDate = d
        }
        let fixture: StateFixture
        do {
            fixture = try StageCodec.decode(StateFixture.self, from: stateBytes)
        } catch {
            fail("state: \(error.detail)")
        }
        let lines: [SimulationLine]
        do {
            lines = try Simulator.simulate(
                eventBytes: eventBytes, fixture: fixture, apps: apps, at: atDate, now: Date(), burst: burst)
        } catch {
            fail("event: \(error.description)")
        }
        var out = ""
        for line in lines { out += line.json + "\n" }
        CLI.write(out)
    }

    func read(_ path: String, what: String) throws -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: path) else {
            fail("\(what): cannot read file \(path)")
        }
        return Array(data)
    }

    func warn(_ line: String) {
        CLI.write(line + "\n", to: .standardError)
    }

    func fail(_ line: String) -> Never {
        warn(line.replacingOccurrences(of: "\n", with: " "))
        Foundation.exit(2)
    }
}
