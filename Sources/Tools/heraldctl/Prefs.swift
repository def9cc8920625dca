import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis

/// `heraldctl prefs set`: change a user's notification preferences (docs/behaviour.md §3 fields).
struct PrefsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prefs",
        abstract: "Show or change a user's notification preferences.",
        subcommands: [Set.self, Show.self])

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Change the fields given; the others keep their stored values (or defaults).",
            discussion: """
                Reads the stored preferences from Redis, applies the flags, and writes the result: to Redis \
                directly, or with --via-kafka as a preferences record on herald.registry (herald-registry \
                writes it). --json FILE replaces the whole object (state-fixture field names) before the \
                flags apply. Prints the resulting preferences as JSON.
                """)

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Option(name: .long, help: "Start from this preferences JSON instead of the stored one.") var json: String?
        @Option(name: .long, help: "Push trigger: all, mention_only or off.") var trigger: String?
        @Option(name: .long, help: "Conversation id that --conversation-trigger / --mute / --unmute apply to.")
        var conversation: String?
        @Option(name: .customLong("conversation-trigger"), help: "default, all, mention_only or off.")
        var conversationTrigger: String?
        @Flag(name: .long, help: "Mute the --conversation.") var mute = false
        @Flag(name: .long, help: "Unmute the --conversation.") var unmute = false
        @Option(name: .long, help: "Do not disturb window HH:MM-HH:MM in --timezone (00:00-24:00 is all day).")
        var dnd: String?
        @Option(name: .long, help: "IANA time zone of --dnd (default UTC).") var timezone: String?
        @Flag(name: .customLong("clear-dnd"), help: "Remove the do-not-disturb window.") var clearDND = false
        @Option(name: .long, help: "Snooze window START-END, epoch milliseconds.") var snooze: String?
        @Flag(name: .customLong("clear-snooze"), help: "Remove the snooze window.") var clearSnooze = false
        @Option(name: .long, help: "Template choice: default or alternative.") var template: String?
        @Option(name: .customLong("display-style"), help: "summary or simple_banner.") var displayStyle: String?
        @Option(name: .customLong("display-name"), help: "Push display name (empty string removes it).") var displayName: String?
        @Option(name: .long, help: "Preferred languages, comma separated, first wins (at most 4).") var languages: String?
        @Option(name: .long, help: "Badge: on or off.") var badge: String?
        @Flag(name: .customLong("via-kafka"), help: "Publish to the registry topic instead of writing Redis.")
        var viaKafka = false
        @OptionGroup var redis: RedisOptions
        @OptionGroup var kafka: KafkaOptions
        @OptionGroup var topics: TopicOptions

        func validate() throws {
            if (conversationTrigger != nil || mute || unmute) && conversation == nil {
                throw ValidationError("--conversation-trigger, --mute and --unmute need --conversation")
            }
            if mute && unmute { throw ValidationError("give at most one of --mute and --unmute") }
            if dnd != nil && clearDND { throw ValidationError("give at most one of --dnd and --clear-dnd") }
            if snooze != nil && clearSnooze { throw ValidationError("give at most one of --snooze and --clear-snooze") }
        }

        func run() async throws {
            var preferences: Preferences
            var store: StateStore?
            if let json {
                do {
                    preferences = try StageCodec.decode(Preferences.self, from: CLI.read(json, what: "--json"))
                } catch {
                    CLI.fail("--json: \(error.detail)", status: 2)
                }
            } else {
                let s = await redis.store()
                store = s
                do {
                    preferences = try await s.loadUser(app: app, user: user, now: CLI.nowMillis()).preferences
                } catch {
                    CLI.fail("redis: \(error)")
                }
            }
            apply(to: &preferences)
            if viaKafka {
                try await RegistryPublisher.publish(.preferences(app: app, user: user, preferences: preferences),
                                                    kafka: kafka, topics: topics)
            } else {
                let s: StateStore
                if let store { s = store } else { s = await redis.store() }
                do {
                    try await s.setPreferences(app: app, user: user, preferences: preferences)
                } catch {
                    CLI.fail("redis: \(error)")
                }
            }
            CLI.out(String(decoding: StageCodec.encode(preferences), as: UTF8.self))
        }

        func apply(to p: inout Preferences) {
            if let trigger {
                guard let t = PushTrigger(rawValue: trigger) else { CLI.fail("--trigger: expected all, mention_only or off", status: 2) }
                p.trigger = t
            }
            if let conversation {
                var c = p.conversation(conversation)
                if let conversationTrigger {
                    guard let t = ConversationTrigger(rawValue: conversationTrigger) else {
                        CLI.fail("--conversation-trigger: expected default, all, mention_only or off", status: 2)
                    }
                    c.trigger = t
                }
                if mute { c.muted = true }
                if unmute { c.muted = false }
                p.conversations[conversation] = c
            }
            if clearDND { p.dnd = nil }
            if let dnd {
                let parts = dnd.split(separator: "-", omittingEmptySubsequences: false)
                guard parts.count == 2, let start = ClockTime(String(parts[0])), let end = ClockTime(String(parts[1])) else {
                    CLI.fail("--dnd: expected HH:MM-HH:MM, got \(dnd)", status: 2)
                }
                let zone = timezone ?? p.dnd?.timezone ?? "UTC"
                guard TimeZone(identifier: zone) != nil else { CLI.fail("--timezone: unknown IANA time zone \(zone)", status: 2) }
                p.dnd = DoNotDisturb(start: start, end: end, timezone: zone)
            } else if let timezone {
                guard TimeZone(identifier: timezone) != nil else { CLI.fail("--timezone: unknown IANA time zone \(timezone)", status: 2) }
                guard var d = p.dnd else { CLI.fail("--timezone: the user has no DND window; give --dnd too", status: 2) }
                d.timezone = timezone
                p.dnd = d
            }
            if clearSnooze { p.snooze = nil }
            if let snooze {
                let parts = snooze.split(separator: "-", omittingEmptySubsequences: false)
                guard parts.count == 2, let start = Int64(parts[0]), let end = Int64(parts[1]), start <= end else {
                    CLI.fail("--snooze: expected START-END in epoch milliseconds, START <= END", status: 2)
                }
                p.snooze = Snooze(start: start, end: end)
            }
            if let template {
                guard let t = TemplateChoice(rawValue: template) else { CLI.fail("--template: expected default or alternative", status: 2) }
                p.template = t
            }
            if let displayStyle {
                guard let s = DisplayStyle(rawValue: displayStyle) else { CLI.fail("--display-style: expected summary or simple_banner", status: 2) }
                p.displayStyle = s
            }
            if let displayName { p.displayName = displayName.isEmpty ? nil : displayName }
            if let languages {
                let list = languages.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                guard list.count <= Preferences.maxLanguages else { CLI.fail("--languages: at most \(Preferences.maxLanguages)", status: 2) }
                p.languages = list
            }
            if let badge {
                switch badge {
                case "on", "true": p.badge = true
                case "off", "false": p.badge = false
                default: CLI.fail("--badge: expected on or off", status: 2)
                }
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print a user's stored state (devices shortened, preferences, unread, online).")

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Flag(name: .customLong("full-tokens"), help: "Print whole device tokens.") var fullTokens = false
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            let store = await redis.store()
            do {
                var state = try await store.loadUser(app: app, user: user, now: CLI.nowMillis())
                if !fullTokens {
                    state.devices = state.devices.map { var d = $0; d.token = CLI.short(d.token); return d }
                    state.online = state.online.map(CLI.short)
                }
                CLI.out(String(decoding: StageCodec.encode(state), as: UTF8.self))
            } catch {
                CLI.fail("redis: \(error)")
            }
        }
    }
}
