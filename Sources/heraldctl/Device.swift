import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis

/// `heraldctl device register|unregister`: manage a user's push tokens.
struct DeviceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device",
        abstract: "Register or unregister a user's APNs / VoIP tokens.",
        subcommands: [Register.self, Unregister.self])

    struct Register: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Register a device token (at most 20 per user; the 21st evicts the oldest).",
            discussion: """
                Writes Redis directly (the operator path, applied at once) unless --via-kafka is given, in which \
                case a registration record goes to herald.registry and herald-registry applies it.
                """)

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Option(name: .long, help: "Device token (hex).") var token: String
        @Option(name: .long, help: "apns (alert pushes) or voip (PushKit, calls).") var kind: String = "apns"
        @Option(name: .long, help: "production or sandbox.") var environment: String = "production"
        @Option(name: .customLong("bundle-id"), help: "Bundle id of the app the token belongs to (default: the app's first credential).")
        var bundleID: String?
        @Option(name: .customLong("registered-at"), help: "Registration time, epoch milliseconds (default: now).")
        var registeredAt: Int64?
        @Flag(name: .customLong("via-kafka"), help: "Publish to the registry topic instead of writing Redis.")
        var viaKafka = false
        @OptionGroup var redis: RedisOptions
        @OptionGroup var kafka: KafkaOptions
        @OptionGroup var topics: TopicOptions

        func run() async throws {
            guard let kind = Device.Kind(rawValue: kind) else { CLI.fail("--kind: expected apns or voip, got \(kind)", status: 2) }
            guard let env = APNsEnvironment(rawValue: environment) else {
                CLI.fail("--environment: expected production or sandbox, got \(environment)", status: 2)
            }
            guard !token.isEmpty, token.allSatisfy(\.isHexDigit) else { CLI.fail("--token: expected hex digits", status: 2) }
            let device = Device(token: token.lowercased(), kind: kind, environment: env, bundleID: bundleID,
                                registeredAt: registeredAt ?? CLI.nowMillis())
            if viaKafka {
                try await RegistryPublisher.publish(.register(app: app, user: user, device: device), kafka: kafka, topics: topics)
                CLI.out(CLI.json(["published": true, "topic": topics.topics().registry, "user": user, "token": CLI.short(device.token)]))
                return
            }
            let store = await redis.store()
            do {
                let evicted = try await store.registerDevice(app: app, user: user, device: device)
                CLI.out(CLI.json(["registered": CLI.short(device.token), "user": user, "evicted": evicted.map(CLI.short)]))
            } catch {
                CLI.fail("redis: \(error)")
            }
        }
    }

    struct Unregister: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Unregister one device token, or all of a user's devices with --all.",
            discussion: "Writes Redis directly unless --via-kafka is given (then herald-registry applies it).")

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Option(name: .long, help: "Device token to remove.") var token: String?
        @Flag(name: .long, help: "Remove every device of the user.") var all = false
        @Flag(name: .customLong("via-kafka"), help: "Publish to the registry topic instead of writing Redis.")
        var viaKafka = false
        @OptionGroup var redis: RedisOptions
        @OptionGroup var kafka: KafkaOptions
        @OptionGroup var topics: TopicOptions

        func validate() throws {
            guard (token != nil) != all else { throw ValidationError("give exactly one of --token and --all") }
        }

        func run() async throws {
            let target = token?.lowercased()
            if viaKafka {
                let update: RegistryUpdate = target.map { .unregister(app: app, user: user, token: $0) }
                    ?? .unregisterAll(app: app, user: user)
                try await RegistryPublisher.publish(update, kafka: kafka, topics: topics)
                CLI.out(CLI.json(["published": true, "topic": topics.topics().registry, "user": user]))
                return
            }
            let store = await redis.store()
            do {
                if let target {
                    let removed = try await store.unregisterDevice(app: app, user: user, token: target)
                    CLI.out(CLI.json(["user": user, "token": CLI.short(target), "removed": removed]))
                } else {
                    let count = try await store.unregisterAll(app: app, user: user)
                    CLI.out(CLI.json(["user": user, "removed": count]))
                }
            } catch {
                CLI.fail("redis: \(error)")
            }
        }
    }
}
