import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldToolSupport

/// `heraldctl state load FIXTURE.json`: write a state fixture (docs/behaviour.md §3) into Redis.
struct StateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "state",
        abstract: "Load state fixtures into Redis, or move release 0.9.0's user keys into the current layout.",
        subcommands: [Load.self, Migrate.self])

    struct Load: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace the listed users' and conversations' state in Redis with a fixture's.",
            discussion: """
                Users and conversations the fixture does not list are left alone. Online entries expire after \
                --presence-ttl seconds. The same fixture is what `heraldctl simulate --state` reads. Entries are \
                written in pipelines of --batch users or conversations (one round trip each, per Redis Cluster \
                master), each user and each conversation replaced in a transaction of its own (one hash slot, so \
                it works on one node and on a cluster alike); progress goes to stderr, as a bar on a terminal and \
                as plain lines otherwise.
                """)

        @Argument(help: "State fixture JSON file.") var fixture: String
        @Option(name: .long, help: "App (tenant) id the state belongs to.") var app: String
        @Option(name: .customLong("presence-ttl"), help: "Seconds online entries stay online.") var presenceTTL: Int =
            3600
        @Option(name: .long, help: "Users or conversations per round trip.") var batch: Int = 500
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            let parsed: StateFixture
            do {
                parsed = try StageCodec.decode(StateFixture.self, from: CLI.read(fixture, what: "fixture"))
            } catch {
                CLI.fail("fixture: \(error.detail)", status: 2)
            }
            guard batch > 0 else { CLI.fail("--batch: expected a positive number", status: 2) }
            let store = await redis.store()
            let chunks = Self.chunks(parsed, size: batch)
            let progress = CLIProgress("state load", total: parsed.users.count + parsed.conversations.count)
            do {
                for chunk in chunks {
                    try await store.loadFixture(
                        app: app, fixture: chunk, presenceTTLMilliseconds: Int64(presenceTTL) * 1000,
                        now: CLI.nowMillis())
                    progress.advance(by: chunk.users.count + chunk.conversations.count)
                }
            } catch {
                CLI.fail("redis: \(error)")
            }
            progress.finish()
            CLI.out(
                CLI.json([
                    "app": .string(app), "users": .int(parsed.users.count),
                    "conversations": .int(parsed.conversations.count),
                ]))
        }

        /// The fixture as fixtures of at most `size` users or conversations each (users first, in name order).
        static func chunks(_ fixture: StateFixture, size: Int) -> [StateFixture] {
            var out: [StateFixture] = []
            var current = StateFixture()
            func take() {
                if current.users.count + current.conversations.count >= size {
                    out.append(current); current = StateFixture()
                }
            }
            for (user, state) in fixture.users.sorted(by: { $0.key < $1.key }) {
                current.users[user] = state
                take()
            }
            for (conversation, state) in fixture.conversations.sorted(by: { $0.key < $1.key }) {
                current.conversations[conversation] = state
                take()
            }
            if !current.users.isEmpty || !current.conversations.isEmpty || out.isEmpty { out.append(current) }
            return out
        }
    }
}
