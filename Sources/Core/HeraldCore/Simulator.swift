// One event against a state fixture, with no Kafka or Redis: the JSON lines
// of `heraldctl simulate` (docs/behaviour.md §9). It calls exactly the functions the
// stages call: Ingest.admit, FanOut.candidates, Suppression.decide, Renderer.render.

import Foundation

/// One line of `simulate` output.
public struct SimulationLine: Sendable, Hashable {
    public enum Outcome: String, Sendable, Hashable {
        case deliver, suppress, drop
        /// Rendering failed (e.g. `no_topic`); the stage would send it to the DLQ.
        case error
    }

    /// The recipient, or nil when the event itself was dropped.
    public var user: String?
    public var decision: Outcome
    public var reason: String?
    public var notifications: [PushRequest]
    /// The recipient's priority class and lane (`class`, `lane`, `class_rule` in the JSON); nil for a dropped event.
    public var priority: PriorityDecision?
    /// The push's place in a coalesced burst (`burst` in the JSON, docs/behaviour.md §6a): 1 opens it, n > 1 is an
    /// update showing n messages; nil when the push is never coalesced.
    public var burst: Int?

    public init(
        user: String?, decision: Outcome, reason: String?, notifications: [PushRequest] = [],
        priority: PriorityDecision? = nil
    ) {
        self.user = user
        self.decision = decision
        self.reason = reason
        self.notifications = notifications
        self.priority = priority
    }

    /// The line as compact JSON (no trailing newline).
    public var json: String {
        var w = JSONWriter(capacity: 1024)
        w.raw("{\"user\":")
        if let user { w.string(user) } else { w.null() }
        w.raw(",\"decision\":"); w.string(decision.rawValue)
        w.raw(",\"reason\":")
        if let reason { w.string(reason) } else { w.null() }
        if let priority {
            w.raw(",\"class\":"); w.string(priority.priorityClass.rawValue)
            w.raw(",\"lane\":"); w.string(priority.lane.rawValue)
            w.raw(",\"class_rule\":"); w.string(priority.rule)
        }
        if let burst { w.raw(",\"burst\":"); w.int(burst) }
        w.raw(",\"notifications\":[")
        for (n, r) in notifications.enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            w.raw("{\"token\":"); w.string(r.token)
            w.raw(",\"push_type\":"); w.string(r.pushType.rawValue)
            w.raw(",\"topic\":"); w.string(r.topic)
            w.raw(",\"priority\":"); w.int(r.priority)
            w.raw(",\"collapse_id\":")
            if let c = r.collapseID { w.string(c) } else { w.null() }
            w.raw(",\"environment\":"); w.string(r.environment.rawValue)
            w.raw(",\"expiration\":"); w.int(r.expiration)
            w.raw(",\"apns_id\":"); w.string(r.apnsID)
            if r.provider != .apns { w.raw(",\"provider\":"); w.string(r.provider.rawValue) }
            if let id = r.providerID { w.raw(",\"provider_id\":"); w.string(id) }
            w.raw(",\"payload\":"); w.bytes.append(contentsOf: r.payload)
            w.byte(UInt8(ascii: "}"))
        }
        w.raw("]}")
        return w.string
    }
}

public enum Simulator {
    /// Evaluates one event.
    /// - Parameters:
    ///   - at: the moment to evaluate the rules at; nil means the event's
    ///     `created_at`, else `now` (what the stages do).
    ///   - now: the wall clock, used when neither `at` nor `created_at` is given.
    ///   - burst: for a recipient whose push may be coalesced, the message's place in its burst (default 1, the
    ///     first: what a single message sends); n > 1 shows the update of n messages suppress would send.
    /// - Throws: `FieldError` when the event is not valid.
    public static func simulate(
        eventBytes: some Collection<UInt8>, fixture: StateFixture, apps: AppDirectory,
        at: Date?, now: Date, burst: Int = 1
    ) throws(FieldError) -> [SimulationLine] {
        let event = try ChatEvent.decode(eventBytes)
        // The stages dead-letter an app the pipeline file does not list (`unknown_app`), as they do an invalid event.
        guard apps.isKnown(event.appID) else {
            throw FieldError(field: "app_id", message: AppDirectory.unknownAppDetail(event.appID))
        }
        switch Ingest.admit(event) {
        case .drop(.channelType, _):
            return [SimulationLine(user: nil, decision: .drop, reason: DropReason.channelType.rawValue)]
        case .drop(.invalid, let detail):
            throw Ingest.nothingToPush(event) ?? FieldError(field: "(event)", message: detail)
        case .drop(.outOfRange, let detail):
            throw event.rangeError() ?? FieldError(field: "(event)", message: detail, reason: InputRanges.reason)
        case .admit:
            break
        }
        let app = apps.app(event.appID)
        let nowMillis = now.millisecondsSince1970
        let ruleTime = at.map(\.millisecondsSince1970) ?? event.ruleTime(now: nowMillis)
        let renderNow = at ?? now
        let members = fixture.conversations[event.conversation.id]?.members ?? []
        let senderDisplayName = fixture.users[event.sender.id]?.preferences.displayName
        var lines: [SimulationLine] = []
        let candidates = FanOut.candidates(of: event, members: members)
        let recipients = FanOut.recipients(of: event, members: members)
        let memberCount = recipients.count
        // An app that keeps counts (docs/behaviour.md §12) counts the event for each recipient before the rules, as
        // resolve does: the fixture's counts are those before this event.
        var counted: [String: CountKey] = [:]
        if app.counts {
            for key in Counting.keys(for: event, recipients: recipients) { counted[key.user] = key }
        }
        for user in candidates {
            var state = fixture.user(user)
            if let key = counted[user] {
                var book = CountBook()
                book.unread[user] = state.unread
                state = Counting.applying(book.count(key), to: state, conversation: key.conversation)
            }
            let priority = Priority.classify(event, policy: app.priority, memberCount: memberCount, recipient: user)
            switch Suppression.decide(event: event, recipient: user, state: state, app: app, at: ruleTime) {
            case .suppress(let reason):
                lines.append(
                    SimulationLine(user: user, decision: .suppress, reason: reason.rawValue, priority: priority))
            case .deliver(let targets):
                let position = Coalescing.eligible(event, recipient: user, app: app) ? max(1, burst) : nil
                do {
                    let requests = try Renderer.render(
                        event: event, recipient: user, state: state, targets: targets,
                        app: app, senderDisplayName: senderDisplayName, burst: position, now: renderNow)
                    var line = SimulationLine(
                        user: user, decision: .deliver, reason: (position ?? 1) > 1 ? Coalescing.updateReason : nil,
                        notifications: requests, priority: priority)
                    line.burst = position
                    lines.append(line)
                } catch {
                    lines.append(
                        SimulationLine(user: user, decision: .error, reason: error.code.rawValue, priority: priority))
                }
            }
        }
        return lines
    }

    /// Parses `--at`: epoch milliseconds or ISO 8601 (with or without fractional seconds).
    public static func parseTime(_ text: String) -> Date? {
        let t = text.trimmingCharacters(in: .whitespaces)
        if let ms = Int64(t) { return Date(timeIntervalSince1970: Double(ms) / 1000) }
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let d = f.date(from: t) { return d }
        f.formatOptions = [.withInternetDateTime]
        return f.date(from: t)
    }
}
