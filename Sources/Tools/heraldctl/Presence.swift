import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldToolSupport

/// `heraldctl presence set`: which of a user's devices hold a live connection.
struct PresenceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "presence",
        abstract: "Set which of a user's devices are online.",
        subcommands: [Set.self])

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace the user's online devices; each stays online for --ttl seconds unless refreshed.",
            discussion: """
                With no --online token the user is offline on every device. Writes Redis directly unless \
                --via-kafka is given (then a presence record goes to herald.registry).
                """)

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Option(name: .long, parsing: .upToNextOption, help: "Online device token(s); repeat or list several.")
        var online: [String] = []
        @Option(name: .long, help: "Seconds the entries stay online without a refresh.") var ttl: Int = 120
        @OptionGroup var write: RegistryWriteOptions

        func validate() throws {
            guard ttl > 0 else { throw ValidationError("--ttl must be positive") }
        }

        func run() async throws {
            let tokens = online.flatMap { $0.split(separator: ",").map { String($0).lowercased() } }.filter {
                !$0.isEmpty
            }
            let now = CLI.nowMillis()
            let ttlMs = Int64(ttl) * 1000
            if write.viaKafka {
                try await RegistryPublisher.publish(
                    .presence(app: app, user: user, online: tokens, ttlMilliseconds: ttlMs),
                    kafka: write.kafka, topics: write.topics, trace: write.trace)
            } else {
                let store = await write.redis.store()
                do {
                    try await store.setPresence(app: app, user: user, online: tokens, ttlMilliseconds: ttlMs, now: now)
                } catch {
                    CLI.fail("redis: \(error)")
                }
            }
            CLI.out(
                CLI.json([
                    "user": .string(user), "online": .strings(tokens.map(CLI.short)), "expires_at": .int(now + ttlMs),
                    "via_kafka": .bool(write.viaKafka),
                ]))
        }
    }
}
