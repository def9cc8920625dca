import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis

/// `heraldctl explain`: why a user did or did not get a push for an event (the explain trail the stages write).
struct Explain: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Explain why a user did or did not get a push for an event.",
        discussion: """
            Reads the explain trail the stages keep in Redis (herald:<app>:explain:{<event>}, 7 days by default) \
            and prints one JSON object: the event-level step (ingest drop or resolve fan-out), the user's \
            decision with its reason code (docs/behaviour.md §6), and the outcome per device (delivered, duplicate, retry, \
            token_dead, dlq with the APNs status and reason). Without --user it prints the whole trail, one \
            line per entry. Exit status 3 when there is no trail for the event (or the user).
            """)

    @Option(name: .long, help: "App (tenant) id.") var app: String
    @Option(name: .long, help: "Event id.") var event: String
    @Option(name: .long, help: "Recipient user id (omit for the whole trail).") var user: String?
    @Flag(name: .customLong("full-tokens"), help: "Print whole device tokens.") var fullTokens = false
    @OptionGroup var redis: RedisOptions

    func run() async throws {
        let store = await redis.store()
        let explain = ExplainStore(connection: store.connection)
        let trail: [ExplainEntry]
        do {
            trail = try await explain.trail(app: app, eventID: event)
        } catch {
            CLI.fail("redis: \(error)")
        }
        if trail.isEmpty {
            CLI.out(
                CLI.json([
                    "app": app, "event": event, "user": CLI.orNull(user), "found": false,
                    "message": "no explain trail for this event (never seen, not yet processed, or expired)",
                ]))
            throw ExitCode(3)
        }
        guard let user else {
            for entry in trail { CLI.out(CLI.json(describe(entry))) }
            return
        }
        let eventLevel = trail.first { $0.user == nil && $0.token == nil && $0.decision != "classified" }
        let classified = trail.first { $0.user == nil && $0.token == nil && $0.decision == "classified" }
        let decision = trail.first { $0.user == user && $0.token == nil }
        let devices = trail.filter { $0.user == user && $0.token != nil }
        var o: [String: Any] = [
            "app": app, "event": event, "user": user, "found": decision != nil || eventLevel?.decision == "drop",
        ]
        if let eventLevel { o["event_step"] = describe(eventLevel) }
        // The priority class ingest gave the event (`<class>:<rule>`, docs/pipeline.md "Priority lanes").
        if let classified { o["class"] = CLI.orNull(classified.reason) }
        if let decision {
            o["decision"] = decision.decision
            o["reason"] = CLI.orNull(decision.reason)
            o["stage"] = decision.stage
            o["at"] = Int(decision.at)
            o["at_iso"] = CLI.iso(decision.at)
        } else if eventLevel?.decision == "drop" {
            o["decision"] = "drop"
            o["reason"] = CLI.orNull(eventLevel?.reason)
            o["stage"] = eventLevel?.stage ?? "ingest"
        } else {
            o["decision"] = NSNull()
            o["reason"] = NSNull()
            o["message"] = "the event has a trail but nothing about this user (not a recipient, or not processed yet)"
        }
        o["devices"] = devices.map(describe)
        CLI.out(CLI.json(o))
        if decision == nil && eventLevel?.decision != "drop" { throw ExitCode(3) }
    }

    func describe(_ e: ExplainEntry) -> [String: Any] {
        var o: [String: Any] = [
            "stage": e.stage, "decision": e.decision, "reason": CLI.orNull(e.reason), "at": Int(e.at),
        ]
        if let u = e.user { o["user"] = u }
        if let t = e.token { o["token"] = fullTokens ? t : CLI.short(t) }
        if let s = e.status { o["status"] = s }
        if let a = e.attempt { o["attempt"] = a }
        if let c = e.count { o["count"] = c }
        return o
    }
}
