import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis

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
    @Option(
        name: .customLong("replay-window-seconds"),
        help: "send's replay window (the pipeline file's idempotency.replay_window_seconds).")
    var replayWindowSeconds = Int(StateStore.defaultReplayWindowMilliseconds / 1000)
    @OptionGroup var redis: RedisOptions

    func run() async throws {
        let store = await redis.store()
        let ttl = ProcessInfo.processInfo.environment["HERALD_EXPLAIN_TTL_SECONDS"].flatMap(Int64.init)
        let explain = ExplainStore(
            connection: store.connection, ttlMilliseconds: ttl.map { $0 * 1000 } ?? ExplainStore.defaultTTLMilliseconds)
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
                        "app": app, "event": event, "user": NSNull(), "found": false,
                        "message":
                            "no explain entry for this event (delivered as expected, never seen, not yet processed, or expired)",
                    ]))
                throw ExitCode(3)
            }
            for entry in trail { CLI.out(CLI.json(describe(entry))) }
            return
        }
        let eventLevel = trail.first { $0.user == nil && $0.token == nil && $0.decision != "classified" }
        let classified = trail.first { $0.user == nil && $0.token == nil && $0.decision == "classified" }
        var decision = trail.first { $0.user == user && $0.token == nil }
        var devices = trail.filter { $0.user == user && $0.token != nil }.map(describe)
        var delivered: [[String: Any]] = []
        do {
            // A routine decision is not in the trail: the user's latest decision may be this event's.
            if decision == nil, let last = try await explain.lastDecision(app: app, user: user, now: now)?.decision,
                last.eventID == event
            {
                decision = last
            }
            // Devices that took the notification as expected: send's delivery records.
            let state = try await store.loadUser(app: app, user: user, now: now)
            let known = Set(trail.filter { $0.user == user }.compactMap(\.token))
            let tokens = state.devices.map(\.token).filter { !known.contains($0) }
            let records = try await store.wasDelivered(
                app: app, pairs: tokens.map { DeliveryKey(eventId: event, token: $0) }, now: now,
                window: Int64(replayWindowSeconds) * 1000)
            for (token, yes) in zip(tokens, records) where yes {
                delivered.append([
                    "stage": "send", "decision": "delivered", "reason": NSNull(),
                    "token": fullTokens ? token : CLI.short(token), "source": "delivery_record",
                ])
            }
        } catch {
            CLI.fail("redis: \(error)")
        }
        devices += delivered
        if decision == nil && eventLevel?.decision != "drop" && delivered.isEmpty && devices.isEmpty {
            CLI.out(
                CLI.json([
                    "app": app, "event": event, "user": user, "found": false,
                    "message":
                        "nothing kept about this user and event (not a recipient, not yet processed, delivered longer ago than the replay window, or expired)",
                ]))
            throw ExitCode(3)
        }
        var o: [String: Any] = [
            "app": app, "event": event, "user": user,
            "found": decision != nil || eventLevel?.decision == "drop" || !delivered.isEmpty,
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
        } else if !delivered.isEmpty {
            // The decision was overwritten by a later event's; the delivery records say it was delivered.
            o["decision"] = "deliver"
            o["reason"] = NSNull()
            o["stage"] = "suppress"
        } else {
            o["decision"] = NSNull()
            o["reason"] = NSNull()
            o["message"] = "the event has a trail but nothing about this user (not a recipient, or not processed yet)"
        }
        o["devices"] = devices
        CLI.out(CLI.json(o))
        if decision == nil && eventLevel?.decision != "drop" && delivered.isEmpty { throw ExitCode(3) }
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
