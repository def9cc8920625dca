import Foundation
import HeraldCore

/// Where resolve reads state (Redis in the stage; a fixture in tests). Each call is one round trip.
/// Implementations throw `TransientFailure` when the same call may succeed later.
public protocol StateReader: Sendable {
    /// The members of each conversation, in one round trip.
    func members(_ conversations: [ConversationRef]) async throws -> [[String]]
    /// Devices, presence (as of `now`), preferences and every unread count of `users`, in one round trip.
    func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState]
}

public struct ConversationRef: Sendable, Hashable {
    public var appID: String
    public var conversation: String
    public init(appID: String, conversation: String) {
        self.appID = appID
        self.conversation = conversation
    }
}

/// resolve: `herald.ingested` -> `herald.resolved` (one record per recipient, keyed by recipient user id).
///
/// For a whole batch: one round trip for the members of the conversations whose events name no explicit
/// recipients, then one round trip per app (normally one) for the state of every recipient and sender of the
/// batch (the sender's push display name comes from their preferences). Never a round trip per recipient.
public struct ResolveProcessor: StageProcessor {
    public let stage = "resolve"
    public var resolvedTopic: String
    public var state: any StateReader
    /// Called when a transient state failure is retried (for logs / metrics).
    public var onTransientFailure: @Sendable (TransientFailure) -> Void
    /// Lanes: each recipient's record goes to `resolvedTopic` unless its own class (`Priority.classify` with
    /// the member count and the recipient) belongs to the other lane, e.g. the members a message in the
    /// priority lane does not mention; those go to `lanes.topic(lane)`. Nil: everything to `resolvedTopic`.
    public var lanes: (priority: String, bulk: String, apps: AppDirectory)?
    /// Herald-kept counts for the apps that opt in (ResolveCounting.swift); nil: counts come from `set_unread`.
    public var counting: ResolveCounting?

    public init(resolvedTopic: String, state: any StateReader,
                lanes: (priority: String, bulk: String, apps: AppDirectory)? = nil,
                counting: ResolveCounting? = nil,
                onTransientFailure: @escaping @Sendable (TransientFailure) -> Void = { _ in }) {
        self.resolvedTopic = resolvedTopic
        self.state = state
        self.lanes = lanes
        self.counting = counting
        self.onTransientFailure = onTransientFailure
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        let now = context.nowMillis
        var results = [StageResult?](repeating: nil, count: batch.count)
        var events: [(index: Int, event: ChatEvent)] = []
        for (index, input) in batch.enumerated() {
            do {
                let event = try input.decode(IngestedRecord.self).event
                if let apps = lanes?.apps, !apps.isKnown(event.appID) {
                    results[index] = .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(event.appID))
                    continue
                }
                events.append((index, event))
            } catch {
                results[index] = error.result
            }
        }
        if events.isEmpty { return results.map { $0 ?? StageResult() } }

        // Round trip 1: members of the conversations without explicit recipients.
        var refs: [ConversationRef] = []
        var refIndex: [ConversationRef: Int] = [:]
        for (_, event) in events where event.recipients == nil {
            let ref = ConversationRef(appID: event.appID, conversation: event.conversation.id)
            if refIndex[ref] == nil {
                refIndex[ref] = refs.count
                refs.append(ref)
            }
        }
        var members: [[String]] = []
        do {
            if !refs.isEmpty {
                guard let loaded = try await context.retryingTransient({ try await state.members(refs) },
                                                                        onRetry: onTransientFailure) else {
                    return handBack(results)
                }
                members = loaded
            }
        } catch {
            return fail(results, events, "state_error", "members: \(error)")
        }

        // Round trip 2 (per app): every recipient's and sender's state.
        var recipientsOf: [Int: [String]] = [:]
        var senderListed = Set<Int>()
        var usersByApp: [String: [String]] = [:]
        var seen: [String: Set<String>] = [:]
        for (index, event) in events {
            var conversationMembers: [String] = []
            if event.recipients == nil, let i = refIndex[ConversationRef(appID: event.appID, conversation: event.conversation.id)],
               i < members.count {
                conversationMembers = members[i]
            }
            let recipients = FanOut.recipients(of: event, members: conversationMembers)
            recipientsOf[index] = recipients
            if (event.recipients ?? conversationMembers).contains(event.sender.id) { senderListed.insert(index) }
            for user in recipients + [event.sender.id] where seen[event.appID, default: []].insert(user).inserted {
                usersByApp[event.appID, default: []].append(user)
            }
        }
        var states: [String: [String: UserState]] = [:]
        for app in usersByApp.keys.sorted() {
            let users = usersByApp[app] ?? []
            do {
                guard let loaded = try await context.retryingTransient({ try await state.loadUsers(app: app, users: users, now: now) },
                                                                        onRetry: onTransientFailure) else {
                    return handBack(results)
                }
                states[app] = loaded
            } catch {
                return fail(results, events, "state_error", "users of app \(app): \(error)")
            }
        }

        // Round trip 3 (per counting app): count the message events and take the counts after each.
        let counts: [Int: [String: CountsAfter]]
        switch await countMessages(events, recipientsOf: recipientsOf, context: context) {
        case .counted(let c): counts = c
        case .handBack: return handBack(results)
        case .failed(let detail): return fail(results, events, "state_error", detail)
        }

        for (index, event) in events {
            let appStates = states[event.appID] ?? [:]
            let displayName = appStates[event.sender.id]?.preferences.displayName
            let recipients = recipientsOf[index] ?? []
            var result = StageResult()
            let scoped = recipients.map { user in
                let state = (appStates[user] ?? UserState()).scoped(to: event.conversation.id)
                guard let after = counts[index]?[user] else { return (user: user, state: state) }
                return (user: user, state: Counting.applying(after, to: state, conversation: event.conversation.id))
            }
            let encoded = ResolvedRecord.wireBytes(event: event, recipients: scoped, senderDisplayName: displayName)
            var reason: String?
            if let lanes {
                let policy = lanes.apps.app(event.appID).priority
                let whole = Priority.classify(event, policy: policy, memberCount: recipients.count)
                if whole.rule == "members" { reason = "\(whole.priorityClass.rawValue):members" }
                for (user, bytes) in zip(recipients, encoded) {
                    let lane = Priority.classify(event, policy: policy, memberCount: recipients.count, recipient: user).lane
                    let topic = lane == .priority ? lanes.priority : lanes.bulk
                    result.outputs.append(StageOutput(topic: topic, key: user, value: bytes))
                }
            } else {
                for (user, bytes) in zip(recipients, encoded) {
                    result.outputs.append(StageOutput(topic: resolvedTopic, key: user, value: bytes))
                }
            }
            result.explain.append(ExplainEntry(appID: event.appID, eventID: event.eventID, stage: stage,
                                               decision: "fanned_out", reason: reason, at: now, count: recipients.count))
            // The sender is never woken (rule 1); say so when they were listed.
            if senderListed.contains(index) {
                result.explain.append(ExplainEntry(appID: event.appID, eventID: event.eventID, user: event.sender.id,
                                                   stage: stage, decision: "suppress",
                                                   reason: SuppressionReason.sender.rawValue, at: now))
            }
            results[index] = result
        }
        return results.map { $0 ?? StageResult() }
    }

    private func handBack(_ results: [StageResult?]) -> [StageResult] {
        results.map { $0 ?? .handedBack }
    }

    private func fail(_ results: [StageResult?], _ events: [(index: Int, event: ChatEvent)], _ reason: String,
                      _ detail: String) -> [StageResult] {
        var out = results
        for (index, _) in events { out[index] = .dlq(reason, detail) }
        return out.map { $0 ?? StageResult() }
    }
}

/// A `StateReader` over an in-memory state fixture (tests, `heraldctl` previews). Counts its round trips.
public final class FixtureStateReader: StateReader, @unchecked Sendable {
    // @unchecked Sendable: `fixture` is immutable; `calls` is guarded by `lock`.
    private let fixture: [String: StateFixture]
    private let lock = NSLock()
    private var calls = 0

    /// - Parameter fixtures: per app id.
    public init(fixtures: [String: StateFixture]) {
        self.fixture = fixtures
    }

    public var roundTrips: Int { lock.withLock { calls } }

    public func members(_ conversations: [ConversationRef]) async throws -> [[String]] {
        lock.withLock { calls += 1 }
        return conversations.map { fixture[$0.appID]?.conversations[$0.conversation]?.members ?? [] }
    }

    public func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState] {
        lock.withLock { calls += 1 }
        var out: [String: UserState] = [:]
        for user in users { out[user] = fixture[app]?.users[user] ?? UserState() }
        return out
    }
}
