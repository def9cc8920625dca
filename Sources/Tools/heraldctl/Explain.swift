import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldRegistryAPI
import HeraldToolSupport

/// `heraldctl explain`: why a user did or did not get a push for an event (the explain trail the stages write).
struct Explain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Explain why a user did or did not get a push for an event.",
        discussion: """
            Reads the explain trail the stages keep in Redis (docs/redis-keys.md, "The explain trail"; \
            HERALD_EXPLAIN_TTL_SECONDS, 2 days by default) and prints one JSON object: the event-level step (an \
            ingest drop), the user's decision with its reason code (docs/behaviour.md §6), and the outcome per \
            device (duplicate, retry, token_dead, dlq with the provider's status and reason). The trail keeps why a \
            user was not notified; a notification that went as expected leaves no entry (unless the pipeline \
            file's explain.full_trail selects the user, the app or the event), so for a recipient without one the \
            answer comes from the user's latest decision and send's delivery records (kept for the replay \
            window). Without --user it prints the entries kept, one line each. Exit status 3 when nothing is known \
            about the event (or the user).
            """)

    @Option(name: .long, help: "App (tenant) id.") var app: String
    @Option(name: .long, help: "Event id.") var event: String
    @Option(name: .long, help: "Recipient user id (omit for the whole trail).") var user: String?
    @Flag(name: .customLong("full-tokens"), help: "Print whole device tokens.") var fullTokens = false
    @OptionGroup var layout: KeyLayoutOptions
    @OptionGroup var redis: RedisOptions

    func run() async throws {
        let store = await redis.store(deliveredShards: UInt64(layout.deliveryShards))
        let ttl = ProcessInfo.processInfo.environment["HERALD_EXPLAIN_TTL_SECONDS"].flatMap(Int64.init)
        let explain = ExplainStore(
            connection: store.connection, ttlMilliseconds: ttl.map { $0 * 1000 } ?? ExplainStore.defaultTTLMilliseconds,
            lastDecisionShards: UInt64(layout.lastDecisionShards), logShards: UInt64(layout.logShards))
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let trail: [ExplainEntry]
        do {
            trail = try await explain.trail(app: app, eventID: event, now: now)
        } catch {
            CLI.fail("redis: \(error)")
        }
        guard let user else {
            if trail.isEmpty {
                CLI.out(
                    CLI.json([
                        "app": .string(app), "event": .string(event), "user": .null, "found": .bool(false),
                        "message":
                            .string(
                                "no explain entry for this event (delivered as expected, never seen, not yet processed, or expired)"
                            ),
                    ]))
                throw ExitCode(3)
            }
            for entry in trail { CLI.out(CLI.json(describe(entry))) }
            return
        }
        // The registry API's explain answer, field for field (RegistryOperations.decision).
        let token: (String) -> String = { fullTokens ? $0 : CLI.short($0) }
        let answer: JSONValue?
        do {
            answer = try await RegistryOperations.decision(
                app: app, user: user, event: event, explain: explain, store: store,
                replayWindowMilliseconds: layout.windowMilliseconds, now: now, token: token)
        } catch {
            CLI.fail("redis: \(error)")
        }
        guard let answer else {
            CLI.out(
                CLI.json([
                    "app": .string(app), "event": .string(event), "user": .string(user), "found": .bool(false),
                    "message":
                        .string(
                            "nothing kept about this user and event (not a recipient, not yet processed, delivered longer ago than the replay window, or expired)"
                        ),
                ]))
            throw ExitCode(3)
        }
        CLI.out(answer.serialized)
    }

    func describe(_ e: ExplainEntry) -> [String: JSONValue] {
        var o: [String: JSONValue] = [
            "stage": .string(e.stage), "decision": .string(e.decision), "reason": .text(e.reason), "at": .int(e.at),
        ]
        if let u = e.user { o["user"] = .string(u) }
        if let t = e.token { o["token"] = .string(fullTokens ? t : CLI.short(t)) }
        if let s = e.status { o["status"] = .int(s) }
        if let a = e.attempt { o["attempt"] = .int(a) }
        if let c = e.count { o["count"] = .int(c) }
        return o
    }
}
