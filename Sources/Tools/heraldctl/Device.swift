import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldRegistryAPI
import HeraldToolSupport

/// `heraldctl device register|unregister`: manage a user's push tokens.
struct DeviceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device",
        abstract: "Register or unregister a user's APNs / VoIP tokens.",
        subcommands: [Register.self, Unregister.self])

    struct Register: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Register a device token (at most 20 per user and kind; the 21st of a kind evicts the oldest of that kind; a token has one owner per app).",
            discussion: """
                Writes Redis directly (the operator path, applied at once) unless --via-kafka is given, in which \
                case a registration record goes to herald.registry and herald-registry applies it.
                """)

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Option(
            name: .long,
            help:
                "Device token (hex for apns and voip; the registration token for fcm; any id for webhook; <p256dh>.<auth>.<endpoint> for webpush)."
        )
        var token: String?
        @Option(
            name: .long,
            help:
                "A browser's push subscription, the JSON of PushSubscription.toJSON() (a webpush device; instead of --token)."
        )
        var subscription: String?
        @Option(
            name: .long,
            help:
                "apns (alert pushes), voip (PushKit, calls), fcm (Firebase), webhook (custom provider) or webpush (a browser)."
        )
        var kind: String?
        @Option(
            name: .long,
            help:
                "CometChat platform name instead of --kind (FCM_ANDROID, FCM_iOS, FCM_WEB, APNS_iOS_DEVICE, APNS_iOS_VOIP, ...)."
        )
        var platform: String?
        @Option(
            name: .customLong("provider-id"),
            help: "Provider id of the app's credential the token belongs to (default: the app's first one).")
        var providerID: String?
        @Option(
            name: .long,
            help: "production or sandbox (default: the provider id's APNs credential's, else production, as a guess).")
        var environment: String?
        @Option(
            name: .customLong("bundle-id"),
            help: "Bundle id of the app the token belongs to (default: the app's first credential).")
        var bundleID: String?
        @Option(name: .customLong("registered-at"), help: "Registration time, epoch milliseconds (default: now).")
        var registeredAt: Int64?
        @Flag(name: .long, help: "Make it the user's only device of its kind (Sendbird's unique: true).")
        var unique = false
        @OptionGroup var write: RegistryWriteOptions

        func validate() throws {
            guard (token != nil) != (subscription != nil) else {
                throw ValidationError("give exactly one of --token and --subscription")
            }
        }

        func run() async throws {
            var kind: Device.Kind
            switch (self.kind, platform) {
            case (let k?, nil):
                guard let v = Device.Kind(rawValue: k) else {
                    CLI.fail("--kind: expected apns, voip, fcm, webhook or webpush, got \(k)", status: 2)
                }
                kind = v
            case (nil, let p?):
                guard let v = PushPlatform.kind(for: p) else {
                    CLI.fail("--platform: unknown platform \(p)", status: 2)
                }
                kind = v
            case (nil, nil): kind = .apns
            case (_?, _?): CLI.fail("give --kind or --platform, not both", status: 2)
            }
            var env: APNsEnvironment?
            if let environment {
                guard let e = APNsEnvironment(rawValue: environment) else {
                    CLI.fail("--environment: expected production or sandbox, got \(environment)", status: 2)
                }
                env = e
            }
            var token = self.token ?? ""
            if let subscription {
                if self.kind != nil && kind != .webpush { CLI.fail("--subscription is for --kind webpush", status: 2) }
                do {
                    let value = try JSONValue.parse(Array(subscription.utf8))
                    token = try RegistryOperations.webPushSubscription(value).token
                } catch let error as FieldError {
                    CLI.fail("--subscription: \(error.field): \(error.message)", status: 2)
                } catch {
                    CLI.fail("--subscription: not JSON", status: 2)
                }
                kind = .webpush
            }
            // The same token checks as the registry API's POST .../devices.
            let device: Device
            do {
                device = try RegistryOperations.device(
                    token: token, kind: kind, environment: env, bundleID: bundleID,
                    providerID: providerID, registeredAt: registeredAt ?? CLI.nowMillis())
            } catch {
                CLI.fail("--\(error.field): \(error.message)", status: 2)
            }
            if write.viaKafka {
                try await RegistryPublisher.publish(
                    .register(app: app, user: user, device: device, unique: unique), kafka: write.kafka,
                    topics: write.topics, trace: write.trace)
                CLI.out(
                    CLI.json([
                        "published": .bool(true), "topic": .string(write.topics.topics().registry),
                        "user": .string(user), "token": .string(CLI.short(device.token)),
                    ]))
                return
            }
            let r = await write.redis.withStore {
                try await $0.registerDeviceReporting(app: app, user: user, device: device, unique: unique)
            }
            var out: [String: JSONValue] = [
                "registered": .string(CLI.short(device.token)), "user": .string(user),
                "evicted": .strings(r.evicted.map(CLI.short)),
            ]
            if let from = r.movedFrom { out["moved_from"] = .string(from) }
            CLI.out(CLI.json(out))
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
        @OptionGroup var write: RegistryWriteOptions

        func validate() throws {
            guard (token != nil) != all else { throw ValidationError("give exactly one of --token and --all") }
        }

        func run() async throws {
            // apns and voip tokens are stored in lower case; other kinds' tokens (webpush's base64url) as given.
            let target = token.map { $0.allSatisfy(\.isHexDigit) ? $0.lowercased() : $0 }
            if write.viaKafka {
                let update: RegistryUpdate =
                    target.map { .unregister(app: app, user: user, token: $0) }
                    ?? .unregisterAll(app: app, user: user)
                try await RegistryPublisher.publish(
                    update, kafka: write.kafka, topics: write.topics, trace: write.trace)
                CLI.out(
                    CLI.json([
                        "published": .bool(true), "topic": .string(write.topics.topics().registry),
                        "user": .string(user),
                    ]))
                return
            }
            await write.redis.withStore { store in
                if let target {
                    let removed = try await store.unregisterDevice(app: app, user: user, token: target)
                    CLI.out(
                        CLI.json([
                            "user": .string(user), "token": .string(CLI.short(target)), "removed": .bool(removed),
                        ]))
                } else {
                    let count = try await store.unregisterAll(app: app, user: user)
                    CLI.out(CLI.json(["user": .string(user), "removed": .int(count)]))
                }
            }
        }
    }
}
