import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldToolSupport

/// `heraldctl counts show|mark-read`: the unread and mention counts Herald keeps (docs/behaviour.md §12).
struct CountsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "counts",
        abstract: "Show a user's unread and mention counts, or mark a conversation (or everything) read.",
        subcommands: [Show.self, MarkRead.self])

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the user's unread and mention counts as JSON.")

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            let counts = await redis.withStore { store in
                let unread = try await store.loadUser(app: app, user: user, now: CLI.nowMillis()).unread
                return try await store.withMentionCounts(app: app, user: user, unread: unread)
            }
            CLI.out(
                CLI.json([
                    "user": .string(user),
                    "unread": .sorted([
                        "total": .int(counts.total),
                        "conversations": .sorted(counts.conversations.mapValues { .int($0) }),
                    ]),
                    "mentions": .sorted([
                        "total": .int(counts.mentionTotal),
                        "conversations": .sorted(counts.mentionConversations.mapValues { .int($0) }),
                    ]),
                ]))
        }
    }

    struct MarkRead: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "mark-read",
            abstract: "Reset the unread and mention counts of one conversation, or all of them (a mark_read record).",
            discussion:
                "Writes Redis directly unless --via-kafka is given (then herald-registry applies it and sends the user's other devices a clear, docs/behaviour.md §6c)."
        )

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Option(name: .long, help: "Conversation id (omit for every conversation).") var conversation: String?
        @Option(
            name: .long,
            help: "With --via-kafka: the token of the device that read (the user's other devices get the clear).")
        var token: String?
        @OptionGroup var write: RegistryWriteOptions

        func run() async throws {
            if write.viaKafka {
                try await RegistryPublisher.publish(
                    .markRead(app: app, user: user, conversation: conversation, token: token), kafka: write.kafka,
                    topics: write.topics, trace: write.trace)
                CLI.out(
                    CLI.json([
                        "published": .bool(true), "topic": .string(write.topics.topics().registry),
                        "user": .string(user),
                    ]))
                return
            }
            do {
                try await write.redis.store().markRead(app: app, user: user, conversation: conversation)
                CLI.out(
                    CLI.json(["user": .string(user), "conversation": .text(conversation), "marked_read": .bool(true)]))
            } catch {
                CLI.fail("redis: \(error)")
            }
        }
    }
}
