import Foundation
import HeraldCore

/// Where the registry writes (Redis's StateStore in the stage). Implementations throw `TransientFailure`
/// when the same write may succeed later; every write is idempotent, so a retry is safe.
public protocol RegistryWriter: Sendable {
    /// Applies one update; returns its outcome (`applied`, or e.g. `evicted:2`).
    func apply(_ record: RegistryRecord, now: Int64) async throws -> String
    /// Removes a dead token unless re-registered after `deadSince`; returns `removed`,
    /// `kept_reregistered` or `not_registered`.
    func removeDeadToken(_ feedback: TokenFeedbackRecord) async throws -> String
}

/// What the read sync needs (Redis in the stage): the user's state after the read, and the rate limiter
/// (`ReadSync.admit`). Implementations throw `TransientFailure` when the same call may succeed later.
public protocol ReadSyncStore: Sendable {
    /// The user's devices, preferences, unread total and, with a `conversation`, that conversation's count (never
    /// every conversation's: a clear's push carries the total).
    func userState(app: String, user: String, conversation: String?, now: Int64) async throws -> UserState
    /// One clear of `conversation` (nil: every conversation) asked of the user's rate limit.
    func admit(
        app: String, user: String, conversation: String?, readAt: Int64?, now: Int64, policy: ReadSyncPolicy
    ) async throws -> ReadSyncOutcome
}

/// registry: `herald.registry` and `herald.token-feedback` -> Redis, in input order (per partition the
/// updates of one user arrive in order, because both topics are keyed by user id). A `mark_read` also sends the
/// user's other devices a clear (docs/behaviour.md §6c): with `readSync` and `deliverableTopic` set, the registry
/// produces a `herald.deliverable` record of kind `conversation_read` that render and send deliver like any push.
public struct RegistryProcessor: StageProcessor {
    public let stage = "registry"
    public var tokenFeedbackTopic: String
    public var writer: any RegistryWriter
    public var onTransientFailure: @Sendable (TransientFailure) -> Void
    /// The pipeline file's apps: an update for an app it does not list is dead-lettered `unknown_app`, nothing is
    /// written (nil: every app is served).
    public var apps: AppDirectory?
    /// The read sync's state and rate limit; nil: no clears are sent.
    public var readSync: (any ReadSyncStore)?
    /// Where clears go (`herald.deliverable`, the bulk lane); nil: no clears are sent.
    public var deliverableTopic: String?

    public init(
        tokenFeedbackTopic: String, writer: any RegistryWriter, apps: AppDirectory? = nil,
        onTransientFailure: @escaping @Sendable (TransientFailure) -> Void = { _ in }
    ) {
        self.tokenFeedbackTopic = tokenFeedbackTopic
        self.writer = writer
        self.apps = apps
        self.onTransientFailure = onTransientFailure
    }

    /// An update for an app the pipeline file does not list.
    private func unknownApp(_ id: String) -> StageResult? {
        guard let apps, !apps.isKnown(id) else { return nil }
        return .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(id))
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        var results: [StageResult] = []
        results.reserveCapacity(batch.count)
        for (position, input) in batch.enumerated() {
            let result = await process(input, context: context)
            if result.handBack {
                // Keep the order: nothing after a handed-back update may complete before it.
                results += Array(repeating: StageResult.handedBack, count: batch.count - position)
                break
            }
            results.append(result)
        }
        return results
    }

    func process(_ input: StageInput, context: BatchContext) async -> StageResult {
        let op: String
        let write: () async throws -> String
        var read: RegistryRecord?
        if input.topic == tokenFeedbackTopic {
            let feedback: TokenFeedbackRecord
            do { feedback = try input.decode(TokenFeedbackRecord.self, knownKeys: TokenFeedbackRecord.keys) } catch {
                return error.result
            }
            if let refused = unknownApp(feedback.appID) { return refused }
            op = "remove_dead_token"
            write = { try await writer.removeDeadToken(feedback) }
        } else {
            let record: RegistryRecord
            do { record = try input.decode(RegistryRecord.self, knownKeys: RegistryRecord.keys) } catch {
                return error.result
            }
            if let problem = record.validationError() { return .dlq("invalid", problem.description) }
            if let outside = record.rangeError() { return .dlq(outside.reason, "RegistryRecord: \(outside)") }
            if let refused = unknownApp(record.appID) { return refused }
            if let device = record.device, record.op == .registerDevice,
                let problem = apps?.app(record.appID).webPushProblem(device)
            {
                return .dlq("invalid", "RegistryRecord: device: \(problem)")
            }
            op = record.op.rawValue
            if record.op == .markRead { read = record }
            let now = context.nowMillis
            write = { try await writer.apply(record, now: now) }
        }
        do {
            guard let outcome = try await context.retryingTransient(write, onRetry: onTransientFailure) else {
                return .handedBack
            }
            var result = StageResult(notes: [.registry(op: op, outcome: outcome)])
            if let read, outcome == "applied", readSync != nil, deliverableTopic != nil {
                guard let cleared = try await clear(read, context: context) else { return .handedBack }
                result.outputs = cleared.outputs
                result.notes += cleared.notes
                result.explain = cleared.explain
            }
            return result
        } catch let over as PreferenceLimitError {
            return .dlq(PreferenceLimitError.reason, "\(op): \(over)")
        } catch {
            return .dlq("state_error", "\(op): \(error)")
        }
    }

    /// The clear of one applied `mark_read` (docs/behaviour.md §6c): the user's devices but the one that read, then
    /// the rate limit; a `herald.deliverable` record when it is sent. Nil when the stage stopped meanwhile.
    func clear(_ record: RegistryRecord, context: BatchContext) async throws -> StageResult? {
        guard let store = readSync, let topic = deliverableTopic, let user = record.user else { return StageResult() }
        let app = record.appID
        let config = apps?.app(app)
        let policy = config?.readSync ?? ReadSyncPolicy()
        let now = context.nowMillis
        let readAt = record.readAt ?? now
        let event = ReadSync.event(app: app, user: user, conversation: record.conversation, readAt: readAt)
        func result(_ outcome: ReadSyncOutcome, targets: Int? = nil) -> StageResult {
            var entry = ExplainEntry(
                appID: app, eventID: event.eventID, stage: stage, decision: ReadSync.explainDecision,
                reason: outcome.rawValue, at: now, count: targets)
            entry.routine = outcome == .sent
            return StageResult(notes: [.readSync(outcome: outcome.rawValue)], explain: [entry])
        }
        guard config?.push ?? true else { return result(.appOff) }
        guard policy.enabled else { return result(.off) }
        guard
            let state = try await context.retryingTransient(
                { try await store.userState(app: app, user: user, conversation: record.conversation, now: now) },
                onRetry: onTransientFailure)
        else { return nil }
        let targets = ReadSync.targets(state.devices, excluding: record.token)
        if targets.isEmpty { return result(.noOtherDevice) }
        guard
            let outcome = try await context.retryingTransient(
                {
                    try await store.admit(
                        app: app, user: user, conversation: record.conversation, readAt: record.readAt, now: now,
                        policy: policy)
                }, onRetry: onTransientFailure)
        else { return nil }
        var sent = result(outcome, targets: targets.count)
        guard outcome == .sent else { return sent }
        // The record carries what the clear's push is made of, not every conversation's preferences and counts.
        var rendered = state.scoped(to: record.conversation ?? "")
        rendered.devices = []
        rendered.online = []
        let deliverable = DeliverableRecord(event: event, recipient: user, state: rendered, targets: targets)
        sent.outputs = [StageOutput.record(deliverable, topic: topic, key: user)]
        return sent
    }
}

extension RegistryRecord {
    /// Every top-level key of a `herald.registry` record (docs/pipeline.md, Records).
    static let keys: Set<String> = [
        "op", "app_id", "user", "device", "unique", "token", "preferences", "online",
        "ttl_ms", "unread", "conversation", "members", "patch", "read_at",
    ]
}

extension TokenFeedbackRecord {
    /// Every key of a `herald.token-feedback` record.
    static let keys: Set<String> = ["app_id", "user", "token", "reason", "dead_since"]
}
