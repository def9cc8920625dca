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
                The flags become a field-by-field patch (the registry API's PATCH): applied to Redis directly \
                by one Lua script, or with --via-kafka as a patch_preferences record on herald.registry \
                (herald-registry applies it); a concurrent change of other fields is never lost. --json FILE \
                replaces the whole object (state-fixture field names, a set_preferences record) before the \
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
        @Option(name: .customLong("display-name"), help: "Push display name (empty string removes it).")
        var displayName: String?

        @Option(help: "The user's own nickname: Sendbird's recipient.name (empty string removes it).")
        var nickname: String?
        @Option(name: .long, help: "Preferred languages, comma separated, first wins (at most 4).") var languages:
            String?
        @Option(name: .long, help: "Badge: on or off.") var badge: String?
        @OptionGroup var write: RegistryWriteOptions

        func validate() throws {
            if (conversationTrigger != nil || mute || unmute) && conversation == nil {
                throw ValidationError("--conversation-trigger, --mute and --unmute need --conversation")
            }
            if mute && unmute { throw ValidationError("give at most one of --mute and --unmute") }
            if dnd != nil && clearDND { throw ValidationError("give at most one of --dnd and --clear-dnd") }
            if snooze != nil && clearSnooze { throw ValidationError("give at most one of --snooze and --clear-snooze") }
        }

        func run() async throws {
            if let json {
                // --json replaces the whole object (set_preferences), then the flags change it.
                var preferences: Preferences
                do {
                    preferences = try StageCodec.decode(Preferences.self, from: CLI.read(json, what: "--json"))
                } catch {
                    CLI.fail("--json: \(error.detail)", status: 2)
                }
                preferences = patch(stored: preferences).apply(to: preferences)
                if let over = limits.problem(preferences) { CLI.fail("\(over)", status: 2) }
                if write.viaKafka {
                    try await RegistryPublisher.publish(
                        .preferences(app: app, user: user, preferences: preferences),
                        kafka: write.kafka, topics: write.topics, trace: write.trace)
                } else {
                    do {
                        try await write.redis.store().setPreferences(
                            app: app, user: user, preferences: preferences, limits: limits)
                    } catch {
                        CLI.fail("redis: \(error)")
                    }
                }
                CLI.out(String(decoding: StageCodec.encode(preferences), as: UTF8.self))
                return
            }
            // The flags become a field-by-field patch (the registry API's PATCH, docs/registry-api.md): applied in
            // Redis by one Lua script, so a concurrent change of other fields is never lost.
            let store = await write.redis.store()
            let stored: Preferences
            do {
                stored = try await store.preferences(app: app, user: user)
            } catch {
                CLI.fail("redis: \(error)")
            }
            let change = patch(stored: stored)
            if change.isEmpty { CLI.fail("give at least one preference flag (see --help)", status: 2) }
            // The same bounds as the registry API; the patch script checks them again in Redis.
            if let over = limits.problem(change.apply(to: stored)) {
                CLI.fail("\(over)", status: 2)
            }
            if write.viaKafka {
                try await RegistryPublisher.publish(
                    .patch(app: app, user: user, patch: change), kafka: write.kafka, topics: write.topics,
                    trace: write.trace)
                CLI.out(String(decoding: StageCodec.encode(change.apply(to: stored)), as: UTF8.self))
            } else {
                do {
                    let result = try await store.patchPreferences(
                        app: app, user: user, patch: change, limits: limits)
                    CLI.out(String(decoding: StageCodec.encode(result), as: UTF8.self))
                } catch let over as PreferenceLimitError {
                    CLI.fail("\(over)", status: 2)
                } catch {
                    CLI.fail("redis: \(error)")
                }
            }
        }

        /// The bounds of one user's stored preferences, from the variables herald-registry reads
        /// (`HERALD_PREFERENCES_MAX_CONVERSATIONS`, `HERALD_PREFERENCES_MAX_BYTES`; docs/operations.md).
        var limits: PreferenceLimits {
            let environment = ProcessInfo.processInfo.environment
            func value(_ name: String, _ fallback: Int) -> Int {
                guard let raw = environment[name], !raw.isEmpty else { return fallback }
                guard let v = Int(raw), v > 0 else {
                    CLI.fail("\(name)=\(raw): expected a positive integer", status: 2)
                }
                return v
            }
            return PreferenceLimits(
                maxConversations: value(
                    "HERALD_PREFERENCES_MAX_CONVERSATIONS", PreferenceLimits.defaultMaxConversations),
                maxBytes: value("HERALD_PREFERENCES_MAX_BYTES", PreferenceLimits.defaultMaxBytes))
        }

        /// The flags as a patch. `stored` is read only for `--timezone` without `--dnd` (it changes the stored
        /// window's time zone) and for the conversation's current settings printed back.
        func patch(stored p: Preferences) -> PreferencePatch {
            var patch = PreferencePatch()
            if let trigger {
                guard let t = PushTrigger(rawValue: trigger) else {
                    CLI.fail("--trigger: expected all, mention_only or off", status: 2)
                }
                patch.set.trigger = t
            }
            if let conversation {
                var c = PreferencePatch.ConversationFields()
                if let conversationTrigger {
                    guard let t = ConversationTrigger(rawValue: conversationTrigger) else {
                        CLI.fail("--conversation-trigger: expected default, all, mention_only or off", status: 2)
                    }
                    c.trigger = t
                }
                if mute { c.muted = true }
                if unmute { c.muted = false }
                if c != PreferencePatch.ConversationFields() { patch.conversations[conversation] = c }
            }
            if clearDND { patch.clear.append(.dnd) }
            if let dnd {
                let parts = dnd.split(separator: "-", omittingEmptySubsequences: false)
                guard parts.count == 2, let start = ClockTime(String(parts[0])), let end = ClockTime(String(parts[1]))
                else {
                    CLI.fail("--dnd: expected HH:MM-HH:MM, got \(dnd)", status: 2)
                }
                let zone = timezone ?? p.dnd?.timezone ?? "UTC"
                guard TimeZone(identifier: zone) != nil else {
                    CLI.fail("--timezone: unknown IANA time zone \(zone)", status: 2)
                }
                patch.set.dnd = DoNotDisturb(start: start, end: end, timezone: zone)
            } else if let timezone {
                guard TimeZone(identifier: timezone) != nil else {
                    CLI.fail("--timezone: unknown IANA time zone \(timezone)", status: 2)
                }
                guard var d = p.dnd else {
                    CLI.fail("--timezone: the user has no DND window; give --dnd too", status: 2)
                }
                d.timezone = timezone
                patch.set.dnd = d
            }
            if clearSnooze { patch.clear.append(.snooze) }
            if let snooze {
                let parts = snooze.split(separator: "-", omittingEmptySubsequences: false)
                guard parts.count == 2, let start = Int64(parts[0]), let end = Int64(parts[1]), start <= end else {
                    CLI.fail("--snooze: expected START-END in epoch milliseconds, START <= END", status: 2)
                }
                patch.set.snooze = Snooze(start: start, end: end)
            }
            if let template {
                guard let t = TemplateChoice(rawValue: template) else {
                    CLI.fail("--template: expected default or alternative", status: 2)
                }
                patch.set.template = t
            }
            if let displayStyle {
                guard let s = DisplayStyle(rawValue: displayStyle) else {
                    CLI.fail("--display-style: expected summary or simple_banner", status: 2)
                }
                patch.set.displayStyle = s
            }
            if let displayName {
                if displayName.isEmpty { patch.clear.append(.displayName) } else { patch.set.displayName = displayName }
            }
            if let nickname {
                if nickname.isEmpty { patch.clear.append(.nickname) } else { patch.set.nickname = nickname }
            }
            if let languages {
                let list = languages.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter {
                    !$0.isEmpty
                }
                guard list.count <= Preferences.maxLanguages else {
                    CLI.fail("--languages: at most \(Preferences.maxLanguages)", status: 2)
                }
                if list.isEmpty { patch.clear.append(.languages) } else { patch.set.languages = list }
            }
            if let badge {
                switch badge {
                case "on", "true": patch.set.badge = true
                case "off", "false": patch.set.badge = false
                default: CLI.fail("--badge: expected on or off", status: 2)
                }
            }
            return patch
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a user's stored state (devices shortened, preferences, unread, online).")

        @Option(name: .long, help: "App (tenant) id.") var app: String
        @Option(name: .long, help: "User id.") var user: String
        @Flag(name: .customLong("full-tokens"), help: "Print whole device tokens.") var fullTokens = false
        @OptionGroup var redis: RedisOptions

        func run() async throws {
            await redis.withStore { store in
                var state = try await store.loadUser(app: app, user: user, now: CLI.nowMillis())
                if !fullTokens {
                    state.devices = state.devices.map {
                        var d = $0; d.token = CLI.short(d.token); return d
                    }
                    state.online = state.online.map(CLI.short)
                }
                CLI.out(String(decoding: StageCodec.encode(state), as: UTF8.self))
            }
        }
    }
}
