import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis

/// `heraldctl state load FIXTURE.json`: write a state fixture (docs/behaviour.md §3) into Redis.
struct StateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "state",
        abstract: "Load state fixtures into Redis.",
        subcommands: [Load.self])

    struct Load: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace the listed users' and conversations' state in Redis with a fixture's (one round trip).",
            discussion: """
                Users and conversations the fixture does not list are left alone. Online entries expire after \
                --presence-ttl seconds. The same fixture is what `heraldctl simulate --state` reads.
                """)

        @Argument(help: "State fixture JSON file.") var fixture: String
        @Option(name: .long, help: "App (tenant) id the state belongs to.") var app: String
        @Option(name: .customLong("presence-ttl"), help: "Seconds online entries stay online.") var presenceTTL: Int = 3600
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            let parsed: StateFixture
            do {
                parsed = try StageCodec.decode(StateFixture.self, from: CLI.read(fixture, what: "fixture"))
            } catch {
                CLI.fail("fixture: \(error.detail)", status: 2)
            }
            let store = await redis.store()
            do {
                try await store.loadFixture(app: app, fixture: parsed, presenceTTLMilliseconds: Int64(presenceTTL) * 1000,
                                            now: CLI.nowMillis())
            } catch {
                CLI.fail("redis: \(error)")
            }
            CLI.out(CLI.json(["app": app, "users": parsed.users.count, "conversations": parsed.conversations.count]))
        }
    }
}
