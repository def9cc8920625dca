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

/// registry: `herald.registry` and `herald.token-feedback` -> Redis, in input order (per partition the
/// updates of one user arrive in order, because both topics are keyed by user id).
public struct RegistryProcessor: StageProcessor {
    public let stage = "registry"
    public var tokenFeedbackTopic: String
    public var writer: any RegistryWriter
    public var onTransientFailure: @Sendable (TransientFailure) -> Void
    /// The pipeline file's apps: an update for an app it does not list is dead-lettered `unknown_app`, nothing is
    /// written (nil: every app is served).
    public var apps: AppDirectory?

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
            if let refused = unknownApp(record.appID) { return refused }
            op = record.op.rawValue
            let now = context.nowMillis
            write = { try await writer.apply(record, now: now) }
        }
        do {
            guard let outcome = try await context.retryingTransient(write, onRetry: onTransientFailure) else {
                return .handedBack
            }
            return StageResult(notes: [.registry(op: op, outcome: outcome)])
        } catch let over as PreferenceLimitError {
            return .dlq(PreferenceLimitError.reason, "\(op): \(over)")
        } catch {
            return .dlq("state_error", "\(op): \(error)")
        }
    }
}

extension RegistryRecord {
    /// Every top-level key of a `herald.registry` record (docs/pipeline.md, Records).
    static let keys: Set<String> = [
        "op", "app_id", "user", "device", "unique", "token", "preferences", "online",
        "ttl_ms", "unread", "conversation", "members", "patch",
    ]
}

extension TokenFeedbackRecord {
    /// Every key of a `herald.token-feedback` record.
    static let keys: Set<String> = ["app_id", "user", "token", "reason", "dead_since"]
}
