import Foundation
import HeraldCore
import Synchronization

/// Where suppress keeps the digests (docs/behaviour.md §6d): Redis in the stage (`RedisDigestLedger`),
/// `MemoryDigestLedger` in tests.
public protocol DigestLedger: Sendable {
    /// Counts each message once per (event, user) and schedules its user's digest at the window's end; whether each
    /// was counted now (false: counted before, a replay).
    func count(_ counts: [DigestCount], now: Int64) async throws -> [Bool]
    /// The digests of `app` due at `now`, each taken for a lease (taken again once it passes unconfirmed).
    func claimDue(app: String, now: Int64) async throws -> [DueDigest]
    /// Forgets a digest sent or dropped.
    func confirm(app: String, _ digest: DueDigest) async throws
    /// Moves a digest to a window that now ends later.
    func reschedule(
        app: String, _ digest: DueDigest, window: DigestSummary.Window, end: Int64, deadlineMilliseconds: Int64,
        now: Int64) async throws
    /// The users' state now (devices and preferences), for the check at send time.
    func users(app: String, _ users: [String], now: Int64) async throws -> [String: UserState]
}

/// The digests' timer, run by suppress beside the burst flush timer: a pass claims the due digests of every app
/// with the digest on (leased, so any suppress process can send them and one a crashed process claimed is taken
/// again when its lease passes), checks each user's Do Not Disturb and snooze again (extended: scheduled again at
/// the new end), produces one deliverable record per digest with a deterministic event id (produced twice, send's
/// delivery records skip the second) and confirms once the broker acknowledged them. A digest's record carries the
/// trace context of the latest traced message counted in it (`DueDigest.trace`), so that message's trace goes on
/// through render and send.
public struct DigestFlusher: Sendable {
    public let stage = "suppress"
    public var ledger: any DigestLedger
    /// The `herald.deliverable` topic of each lane (digests go on the bulk lane).
    public var deliverableTopic: @Sendable (Lane) -> String

    public init(ledger: any DigestLedger, deliverableTopic: @escaping @Sendable (Lane) -> String) {
        self.ledger = ledger
        self.deliverableTopic = deliverableTopic
    }

    /// What one pass did, by outcome (`sent`, `nothing`, `expired`, `rescheduled`, `no_devices`, `off`).
    public struct Pass: Sendable {
        public var outcomes: [String: Int] = [:]
        public var explain: [ExplainEntry] = []
        /// Digests sent.
        public var sent: Int { outcomes["sent"] ?? 0 }
        /// Whether anything was due.
        public var foundDue = false
    }

    /// One pass at `now` (epoch ms): claim, check, produce (`produce` returns once the broker acknowledged every
    /// output and throws otherwise: the digests stay leased and are taken again), confirm.
    public func pass(
        apps: AppDirectory, now: Int64, produce: @Sendable ([FlushOutput]) async throws -> Void
    ) async throws -> Pass {
        var result = Pass()
        for (appID, app) in apps.apps.sorted(by: { $0.key < $1.key }) where app.digest.isOn {
            let due = try await ledger.claimDue(app: appID, now: now)
            if due.isEmpty { continue }
            result.foundDue = true
            let live = due.filter { $0.messages > 0 }
            let states = live.isEmpty ? [:] : try await ledger.users(app: appID, live.map(\.user), now: now)
            var outputs: [FlushOutput] = []
            var done: [DueDigest] = []
            var entries: [ExplainEntry] = []
            for digest in due {
                let state = states[digest.user] ?? UserState()
                let decision = Digest.due(
                    messages: digest.messages, end: digest.end, recipient: digest.user, state: state, app: app,
                    now: now)
                let eventID = Digest.eventID(user: digest.user, end: digest.end)
                func explain(_ decision: String, _ reason: String, count: Int? = nil) {
                    entries.append(
                        ExplainEntry(
                            appID: appID, eventID: eventID, user: digest.user, stage: stage, decision: decision,
                            reason: reason, at: now, count: count))
                }
                switch decision {
                case .reschedule(let window, let end):
                    try await ledger.reschedule(
                        app: appID, digest, window: window, end: end,
                        deadlineMilliseconds: app.digest.deadlineMilliseconds, now: now)
                    result.outcomes["rescheduled", default: 0] += 1
                    continue
                case .nothing:
                    result.outcomes["nothing", default: 0] += 1
                case .off:
                    result.outcomes["off", default: 0] += 1
                    explain("suppress", SuppressionReason.appOff.rawValue)
                case .expired:
                    result.outcomes["expired", default: 0] += 1
                    explain("suppress", Digest.expiredReason)
                case .noDevices:
                    result.outcomes["no_devices", default: 0] += 1
                    explain("suppress", Digest.noDevicesReason)
                case .send(let targets):
                    let summary = Digest.summary(
                        window: digest.window, messages: digest.messages,
                        conversations: digest.conversations.map { ($0.name, $0.count) }, more: digest.other > 0,
                        policy: app.digest)
                    let event = Digest.event(
                        app: appID, user: digest.user, end: digest.end, summary: summary,
                        conversation: digest.conversations.count == 1 ? digest.conversations[0].id : "")
                    var recordState = state
                    recordState.devices = []
                    recordState.online = []
                    let record = DeliverableRecord(
                        event: event, recipient: digest.user, state: recordState, targets: targets,
                        senderDisplayName: nil)
                    outputs.append(
                        FlushOutput(
                            StageOutput(topic: deliverableTopic(.bulk), key: digest.user, value: record.wireBytes()),
                            trace: digest.trace.map(TracePropagation.init)))
                    result.outcomes["sent", default: 0] += 1
                    explain("deliver", Digest.reason, count: targets.count)
                }
                done.append(digest)
            }
            try await produce(outputs)
            for digest in done { try await ledger.confirm(app: appID, digest) }
            result.explain += entries
        }
        return result
    }
}

/// Digests kept in memory, with the rules of the Redis scripts (Digests.swift): each (event, user) counted once,
/// at most `Digest.maxConversations` conversations by name, a lease per claim.
public final class MemoryDigestLedger: DigestLedger {
    struct Key: Hashable {
        var app: String
        var user: String
    }

    struct Entry {
        var digest: DueDigest
        var seen: Set<String> = []
        /// When the timer takes it (nil: not scheduled).
        var due: Int64?
    }

    private let entries = Mutex<[Key: Entry]>([:])
    /// The users' state, as the test set it.
    public let states = Mutex<[String: UserState]>([:])

    public init() {}

    public func count(_ counts: [DigestCount], now: Int64) async throws -> [Bool] {
        entries.withLock { all in
            counts.map { c in
                let key = Key(app: c.appID, user: c.user)
                var e =
                    all[key]
                    ?? Entry(
                        digest: DueDigest(
                            user: c.user, end: 0, window: c.window, messages: 0, conversations: [], other: 0,
                            lease: 0))
                if e.seen.contains(c.eventID) { return false }
                e.seen.insert(c.eventID)
                if let trace = c.trace { e.digest.trace = trace }
                if let i = e.digest.conversations.firstIndex(where: { $0.id == c.conversation }) {
                    e.digest.conversations[i].count += 1
                    e.digest.conversations[i].name = c.name
                } else if e.digest.conversations.count < Digest.maxConversations {
                    e.digest.conversations.append(DueDigest.Conversation(id: c.conversation, name: c.name, count: 1))
                } else {
                    e.digest.other += 1
                }
                e.digest.messages += 1
                if c.end > e.digest.end {
                    e.digest.end = c.end
                    e.digest.window = c.window
                }
                e.due = max(e.due ?? c.end, c.end)
                all[key] = e
                return true
            }
        }
    }

    /// A `mark_read`: the conversation's part (all of it without a conversation) is no longer in the digest.
    public func markRead(app: String, user: String, conversation: String?) {
        entries.withLock { all in
            let key = Key(app: app, user: user)
            guard var e = all[key] else { return }
            if let conversation {
                if let i = e.digest.conversations.firstIndex(where: { $0.id == conversation }) {
                    e.digest.messages = max(e.digest.messages - e.digest.conversations[i].count, 0)
                    e.digest.conversations.remove(at: i)
                }
            } else {
                e.digest.messages = 0
                e.digest.conversations = []
                e.digest.other = 0
            }
            all[key] = e
        }
    }

    public func claimDue(app: String, now: Int64) async throws -> [DueDigest] {
        entries.withLock { all in
            var out: [DueDigest] = []
            for (key, e) in all where key.app == app {
                guard let due = e.due, due <= now else { continue }
                all[key]?.due = now + 10_000
                var d = e.digest
                d.lease = now + 10_000
                d.conversations.sort { $0.id < $1.id }
                out.append(d)
            }
            return out.sorted { $0.user < $1.user }
        }
    }

    public func confirm(app: String, _ digest: DueDigest) async throws {
        entries.withLock { all in
            let key = Key(app: app, user: digest.user)
            guard let e = all[key] else { return }
            if e.digest.end <= digest.end { all[key] = nil }
        }
    }

    public func reschedule(
        app: String, _ digest: DueDigest, window: DigestSummary.Window, end: Int64, deadlineMilliseconds: Int64,
        now: Int64
    ) async throws {
        entries.withLock { all in
            let key = Key(app: app, user: digest.user)
            guard var e = all[key] else { return }
            if end > e.digest.end {
                e.digest.end = end
                e.digest.window = window
            }
            e.due = end
            all[key] = e
        }
    }

    public func users(app: String, _ users: [String], now: Int64) async throws -> [String: UserState] {
        let states = states.withLock { $0 }
        var out: [String: UserState] = [:]
        for user in users { out[user] = states[user] ?? UserState() }
        return out
    }
}

extension SuppressProcessor {
    /// The digest count of a message suppressed by `reason`, when its app has the digest on and the reason is the
    /// snooze or Do Not Disturb (docs/behaviour.md §6d). A traced input's context (`trace`) goes with the count, so
    /// the digest's record continues it.
    func digestCount(
        _ read: RulesRecord, reason: SuppressionReason, now: Date, trace: TracePropagation? = nil
    ) -> DigestCount? {
        let record = read.record
        var event = record.event
        let app = apps.app(event.appID)
        guard Digest.counts(event, reason: reason, app: app) else { return nil }
        // The rules' reader leaves the conversation's name out: the digest names it, so read the event whole.
        if let forwarded = read.forwarded,
            let whole = try? StageCodec.decode(ResolvedRecord.self, from: forwarded.bytes)
        {
            event = whole.event
        }
        let at = event.ruleTime(now: BatchContext.millis(now))
        guard let (window, end) = Digest.window(reason: reason, preferences: record.state.preferences, at: at) else {
            return nil
        }
        return DigestCount(
            appID: event.appID, user: record.recipient, eventID: event.eventID, conversation: event.conversation.id,
            name: event.conversation.name ?? "", window: window, end: end,
            deadlineMilliseconds: app.digest.deadlineMilliseconds, trace: trace?.held)
    }

    /// Counts the batch's digest messages in one ledger round trip; the outcome of each by input index.
    func countDigests(_ decided: [Decided], now: Date) async -> [Int: String] {
        guard let digests else { return [:] }
        var asks: [(index: Int, count: DigestCount)] = []
        for (index, d) in decided.enumerated() {
            if case .counted(_, let count) = d { asks.append((index, count)) }
        }
        if asks.isEmpty { return [:] }
        var out: [Int: String] = [:]
        do {
            let counted = try await digests.count(asks.map(\.count), now: BatchContext.millis(now))
            for (ask, fresh) in zip(asks, counted) { out[ask.index] = fresh ? "counted" : "replayed" }
        } catch {
            onDigestFailure(error)
            for ask in asks { out[ask.index] = "count_failed" }
        }
        return out
    }
}
