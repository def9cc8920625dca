import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldRegistryAPI

/// `heraldctl members show|set|add|remove`: a conversation's members (the registry API's
/// `/v1/apps/{app}/conversations/{conversation}/members`).
struct MembersCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "members",
        abstract: "Show or change a conversation's members (who resolve wakes for its events).",
        discussion: """
            set replaces the list, add and remove change it. Each writes Redis directly (the operator path, \
            applied at once) unless --via-kafka is given: then a set_members, add_members or remove_members \
            record goes to herald.registry, keyed by the conversation, and herald-registry applies it in order.
            """,
        subcommands: [Show.self, Set.self, Add.self, Remove.self])

    /// What the write subcommands share.
    struct Change: ParsableArguments {
        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "Conversation id.") var conversation: String
        @Argument(help: "User ids.") var users: [String] = []
        @OptionGroup var write: RegistryWriteOptions

        func apply(_ op: RegistryRecord.Op) async throws {
            // The same checks as the registry API and herald-registry (RegistryRecord.validationError).
            let record = RegistryRecord(op: op, appID: app, conversation: conversation, members: users)
            if let problem = record.validationError() { CLI.fail(problem.detail, status: 2) }
            if write.viaKafka {
                try await RegistryPublisher.publish(
                    record, kafka: write.kafka, topics: write.topics, trace: write.trace)
                CLI.out(
                    JSONValue.object([
                        ("published", .bool(true)), ("topic", .string(write.topics.topics().registry)),
                        ("op", .string(op.rawValue)), ("conversation", .string(conversation)),
                    ]).serialized)
                return
            }
            let store = await write.redis.store()
            do {
                switch op {
                case .addMembers: try await store.addMembers(app: app, conversation: conversation, members: users)
                case .removeMembers:
                    try await store.removeMembers(app: app, conversation: conversation, members: users)
                default: try await store.setMembers(app: app, conversation: conversation, members: users)
                }
                let members = try await store.members(app: app, conversation: conversation)
                CLI.out(MembersCommand.json(app: app, conversation: conversation, members: members))
            } catch {
                CLI.fail("redis: \(error)")
            }
        }
    }

    /// `{"app": ..., "conversation": ..., "members": [...]}`: what the API's GET answers.
    static func json(app: String, conversation: String, members: [String]) -> String {
        JSONValue.object([
            ("app", .string(app)), ("conversation", .string(conversation)),
            ("members", .array(members.map(JSONValue.string))),
        ]).serialized
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the conversation's members, sorted.")
        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "Conversation id.") var conversation: String
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            let members = await redis.withStore { try await $0.members(app: app, conversation: conversation) }
            CLI.out(MembersCommand.json(app: app, conversation: conversation, members: members))
        }
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace the conversation's members with the users given (none: empty it).")
        @OptionGroup var change: Change
        func run() async throws { try await change.apply(.setMembers) }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add the users given to the conversation.")
        @OptionGroup var change: Change
        func validate() throws { if change.users.isEmpty { throw ValidationError("give at least one user id") } }
        func run() async throws { try await change.apply(.addMembers) }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove the users given from the conversation.")
        @OptionGroup var change: Change
        func validate() throws { if change.users.isEmpty { throw ValidationError("give at least one user id") } }
        func run() async throws { try await change.apply(.removeMembers) }
    }
}
