// What a stage's processing function takes and gives back. The batch loop (HeraldStage's StageLoop)
// turns Kafka records into `StageInput`s, calls the stage's `StageProcessor`, produces every
// `StageOutput` (and a DLQ record for every `deadLetter`), and only then completes the inputs.
// Nothing here touches Kafka, so each stage's logic is unit-tested without processes.

import Foundation
import HeraldCore

/// One consumed record.
public struct StageInput: Sendable, Hashable {
    public var topic: String
    public var key: [UInt8]?
    /// nil for a tombstone.
    public var value: [UInt8]?
    /// For a traced event (docs/operations.md, "Tracing"), the W3C context its outputs carry: this stage's span of
    /// it as their parent. nil for nearly every input (an untraced event, or tracing off). A processor that makes a
    /// record outside its result (a held burst flushed later, a digest) keeps it to put on that record; send makes
    /// a span per provider request of a traced input.
    public var trace: TracePropagation?

    public init(topic: String, key: [UInt8]? = nil, value: [UInt8]?, trace: TracePropagation? = nil) {
        self.topic = topic
        self.key = key
        self.value = value
        self.trace = trace
    }
}

/// A trace context as it travels: the `traceparent` and `tracestate` header values (HeraldPipeline does not parse
/// them; HeraldTracing does).
public struct TracePropagation: Sendable, Hashable {
    public static let traceparentHeader = "traceparent"
    public static let tracestateHeader = "tracestate"

    public var traceparent: [UInt8]
    public var tracestate: [UInt8]?

    public init(traceparent: [UInt8], tracestate: [UInt8]? = nil) {
        self.traceparent = traceparent
        self.tracestate = tracestate
    }
}

/// An input that is not a record of the kind the stage reads: a tombstone, or bytes that do not decode.
/// Every stage dead-letters it with reason `invalid` and this detail.
public struct InvalidInput: Error, Sendable {
    public var detail: String
    public var result: StageResult { .dlq("invalid", detail) }
}

extension StageInput {
    /// Decodes the input as a stage record (fast codec).
    public func decode<T: StageRecord>(_ type: T.Type) throws(InvalidInput) -> T {
        guard let value else { throw InvalidInput(detail: "tombstone (no value)") }
        do { return try StageCodec.decode(T.self, from: value) } catch { throw InvalidInput(detail: error.description) }
    }

    /// Decodes a record that starts with its event, taking the event from `reuse` when its bytes are an earlier
    /// record's (`EventReuse`): suppress and render read several records of most events in a batch.
    public func decode<T: StageRecord & EventFirstRecord>(
        _ type: T.Type, reusing reuse: inout EventReuse
    ) throws(InvalidInput) -> T {
        guard let value else { throw InvalidInput(detail: "tombstone (no value)") }
        do {
            if BinaryRecordFormat.isBinary(value) {
                return try T.decodeBinary(value, reusing: &reuse)
            }
            return try StageCodec.decode(T.self, from: value)
        } catch { throw InvalidInput(detail: error.description) }
    }

    /// Reads a `herald.resolved` input for suppress's rules (`ResolvedRecord.readForRules`): the fields the rules
    /// read, and the rest as the input's bytes to carry on.
    public func readForRules(reusing reuse: inout EventReuse) throws(InvalidInput) -> RulesRecord {
        guard let value else { throw InvalidInput(detail: "tombstone (no value)") }
        do { return try ResolvedRecord.readForRules(value, reusing: &reuse) } catch {
            throw InvalidInput(detail: error.description)
        }
    }

    /// Decodes the input as a JSON record (registry and token-feedback records). Bytes that are not UTF-8 are
    /// refused first, with one message for the whole record.
    public func decode<T: JSONRecord>(_ type: T.Type) throws(InvalidInput) -> T {
        guard let value else { throw InvalidInput(detail: "tombstone (no value)") }
        guard String(validating: value, as: UTF8.self) != nil else {
            throw InvalidInput(detail: "(record): not valid UTF-8")
        }
        do { return try StageCodec.decode(T.self, from: value) } catch { throw InvalidInput(detail: error.description) }
    }

    /// Decodes a JSON record whose top-level keys must all be in `knownKeys`: a record of Herald's own format
    /// with a key Herald does not know (a misspelling, or bulk that does not belong there) is invalid rather than
    /// applied with the key ignored. One parse.
    public func decode<T: JSONRecord>(_ type: T.Type, knownKeys: Set<String>) throws(InvalidInput) -> T {
        guard let value else { throw InvalidInput(detail: "tombstone (no value)") }
        guard String(validating: value, as: UTF8.self) != nil else {
            throw InvalidInput(detail: "(record): not valid UTF-8")
        }
        let json: JSONValue
        do { json = try JSONValue.parse(value) } catch { throw InvalidInput(detail: "\(T.self): \(error)") }
        if case .object(let pairs) = json {
            let unknown = Set(pairs.map(\.0)).subtracting(knownKeys)
            if !unknown.isEmpty {
                let names = unknown.sorted().prefix(3).map { $0.count > 32 ? String($0.prefix(32)) + "…" : $0 }
                throw InvalidInput(
                    detail: "\(T.self): unknown key\(unknown.count > 1 ? "s" : "") \(names.joined(separator: ", "))"
                        + (unknown.count > 3 ? " (\(unknown.count) in all)" : ""))
            }
        }
        do { return try T(json: json) } catch { throw InvalidInput(detail: error.description) }
    }
}

/// One record to produce.
public struct StageOutput: Sendable, Hashable {
    public var topic: String
    public var key: String
    public var value: [UInt8]

    public init(topic: String, key: String, value: [UInt8]) {
        self.topic = topic
        self.key = key
        self.value = value
    }

    /// Encodes a JSON record (registry and token-feedback records).
    public static func record<T: JSONRecord>(_ record: T, topic: String, key: String) -> StageOutput {
        StageOutput(topic: topic, key: key, value: StageCodec.encode(record))
    }

    /// Encodes a stage record in its wire form.
    public static func record<T: StageRecord>(_ record: T, topic: String, key: String) -> StageOutput {
        StageOutput(topic: topic, key: key, value: StageCodec.encode(record))
    }
}

/// Something the loop counts (metrics) and logs; the processors report, the loop records.
public enum StageNote: Sendable, Hashable {
    /// A recipient (or, at ingest, an event) not woken, with its reason code (docs/behaviour.md).
    case suppressed(reason: String)
    /// An APNs answer: status (nil for a transport failure) and reason.
    case apnsAnswer(status: Int?, reason: String)
    /// A notification sent to `herald.retry`.
    case retried(reason: String)
    /// A notification already delivered (idempotency record found): not sent again.
    case duplicate
    /// A dead token reported to `herald.token-feedback`.
    case tokenDead(reason: String)
    /// A registry operation applied, with its outcome (`applied`, `removed`, `kept_reregistered`, ...).
    case registry(op: String, outcome: String)
    /// Ingest accepted a field in a vendor REST form (e.g. `1` for `true`); counted per field.
    case inputWarning(field: String)
    /// Ingest classified an event, or resolve `count` recipients' notifications, into a priority class (`urgent`,
    /// `high`, `normal`, `bulk`): each class's throughput.
    case classified(priorityClass: String, count: Int)
    /// suppress stepped a message through a coalesced burst: `update` (it replaces the burst's notification) or
    /// `held` (not sent; the next update counts it).
    case coalesced(outcome: String)
    /// registry: what became of a `mark_read`'s clear for the user's other devices (docs/behaviour.md §6c).
    case readSync(outcome: String)
    /// suppress: a message suppressed by the snooze or Do Not Disturb, for the user's digest (docs/behaviour.md
    /// §6d): `counted`, `replayed` (counted before) or `count_failed` (the ledger failed).
    case digest(outcome: String)
    /// suppress asked its translator for one text (one per message and language in a batch, docs/behaviour.md §7a):
    /// `hit`, `translated`, `timeout`, `failed` (`TranslationOutcome.metricOutcome`).
    case translation(outcome: String)
    /// send: one provider request of a traced input (docs/operations.md, "Tracing"), which the loop makes a child
    /// span of the stage's span. Only a traced input gets one; boxed, so the other notes stay small.
    indirect case providerRequest(ProviderRequest)
}

/// One request of a traced notification to its provider, from the moment its job was handed to the transport to
/// its final answer (after the transport's own transparent resends and in-process retry).
public struct ProviderRequest: Sendable, Hashable {
    /// `apns`, `fcm`, `webpush`, `webhook`.
    public var provider: String
    /// The answer's HTTP status; nil when no HTTP answer came (a transport failure).
    public var status: Int?
    /// The provider's reason (APNs `reason`, FCM's error code, a transport failure's kind); empty for a delivery.
    public var reason: String
    /// What went wrong, for `error.type`: the status code of an answer that is not a delivery, or the kind of a
    /// transport failure; nil for a delivery.
    public var failure: String?
    /// The request's `apns-id` (APNs) or the message name FCM answered (`projects/.../messages/...`).
    public var messageID: String?
    /// Where the request went, when the transport can tell.
    public var server: ServiceEndpoint?
    /// The notification's attempt (`herald.retry` counts them; a retry is a later input with its own span).
    public var attempt: Int
    /// When the job was handed to the transport and when its answer arrived, in nanoseconds since the epoch.
    public var startNanoseconds: UInt64
    public var endNanoseconds: UInt64
    /// The transport's own retries of the request before its final answer (APNs, FCM), in order.
    public var retries: [ProviderRetry] = []

    public init(
        provider: String, status: Int?, reason: String, failure: String?, messageID: String?,
        server: ServiceEndpoint?, attempt: Int, startNanoseconds: UInt64, endNanoseconds: UInt64
    ) {
        self.provider = provider
        self.status = status
        self.reason = reason
        self.failure = failure
        self.messageID = messageID
        self.server = server
        self.attempt = attempt
        self.startNanoseconds = startNanoseconds
        self.endNanoseconds = endNanoseconds
    }
}

/// What became of one input.
public struct StageResult: Sendable, Hashable {
    /// Records to produce; the input completes once all of them (and the DLQ record) are acknowledged.
    public var outputs: [StageOutput]
    /// When set, the input goes to the DLQ with this reason and detail (the loop builds the DLQRecord
    /// from the original bytes, topic, stage and time).
    public var deadLetter: DeadLetter?
    /// True when the input must not complete (shutting down mid-way): it is redelivered after a restart.
    public var handBack: Bool
    public var notes: [StageNote]
    /// Explain-trail entries (written best effort after the outputs were produced).
    public var explain: [ExplainEntry]

    public init(
        outputs: [StageOutput] = [], deadLetter: DeadLetter? = nil, handBack: Bool = false,
        notes: [StageNote] = [], explain: [ExplainEntry] = []
    ) {
        self.outputs = outputs
        self.deadLetter = deadLetter
        self.handBack = handBack
        self.notes = notes
        self.explain = explain
    }

    public static func dlq(
        _ reason: String, _ detail: String, notes: [StageNote] = [],
        explain: [ExplainEntry] = []
    ) -> StageResult {
        StageResult(deadLetter: DeadLetter(reason: reason, detail: detail), notes: notes, explain: explain)
    }

    public static let handedBack = StageResult(handBack: true)
}

public struct DeadLetter: Sendable, Hashable {
    /// Stable reason code: `invalid`, `render_error` codes, APNs reasons, `retries_exhausted`, ...
    public var reason: String
    /// Human readable, never message text or a full token.
    public var detail: String

    public init(reason: String, detail: String) {
        self.reason = reason
        self.detail = detail
    }
}

/// What a processor may ask of the loop while it works.
public struct BatchContext: Sendable {
    /// The wall clock.
    public var now: @Sendable () -> Date
    /// True once shutdown began: stop waiting (for a held retry, a broken Redis) and hand inputs back.
    public var isStopping: @Sendable () -> Bool
    /// Signalled when shutdown begins, so `sleep` wakes at once instead of checking `isStopping` now and then.
    public let stopSignal: StopSignal?
    /// Produces outputs of the batch's input at `input` (its index) now, ahead of the batch's results, and
    /// returns once the broker acknowledged them (false when shutting down: hand the input back). Resolve
    /// streams a huge conversation's fan-out through it page by page, so memory stays bounded. Nil when the
    /// loop does not offer it (tests; concurrent batches): outputs then go in the results.
    public var emit: (@Sendable (_ outputs: [StageOutput], _ input: Int) async -> Bool)?
    /// Whether the explain trail keeps a routine entry of event `eventID` in `appID` about a device of `user`, or
    /// about the event when `user` is nil (a first-attempt delivery, a fan-out, a lane's class): the loop asks its
    /// sink (`ExplainSink.keepsRoutine`). A stage does not make such an entry when the answer is no. Nil (tests,
    /// callers without a loop): every entry is made.
    public var keepsRoutineExplain: (@Sendable (_ appID: String, _ eventID: String, _ user: String?) -> Bool)?

    /// A context whose stop is signalled: `sleep` wakes the moment `stop.stop()` is called.
    public init(now: @escaping @Sendable () -> Date = { Date() }, stop: StopSignal) {
        self.now = now
        self.isStopping = { stop.isStopped }
        self.stopSignal = stop
    }

    /// A context that can only be asked whether it is stopping (tests; callers without a `StopSignal`): `sleep`
    /// checks `isStopping` every 100 ms.
    public init(
        now: @escaping @Sendable () -> Date = { Date() }, isStopping: @escaping @Sendable () -> Bool = { false }
    ) {
        self.now = now
        self.isStopping = isStopping
        self.stopSignal = nil
    }

    public var nowMillis: Int64 { Self.millis(now()) }

    /// `keepsRoutineExplain`'s answer, true without one.
    public func keepsRoutine(appID: String, eventID: String, user: String?) -> Bool {
        keepsRoutineExplain?(appID, eventID, user) ?? true
    }

    public static func millis(_ date: Date) -> Int64 { date.millisecondsSince1970 }

    /// Sleeps up to `duration`, waking early when shutdown begins. Returns false if stopping.
    public func sleep(_ duration: Duration) async -> Bool {
        if let stopSignal { return await stopSignal.sleep(for: duration) }
        var left = duration
        let slice = Duration.milliseconds(100)
        while left > .zero {
            if isStopping() { return false }
            let step = min(left, slice)
            try? await Task.sleep(for: step)
            left -= step
        }
        return !isStopping()
    }

    /// The wait after `n` transient failures of the same work in a row: 50 ms doubling to 2 s, not randomised.
    public static let transientRetryBackoff = BackoffPolicy(
        initialDelay: .milliseconds(50), maxDelay: .seconds(2), multiplier: 2, jitter: 0, maxAttempts: .max)

    /// Runs `operation` until it succeeds, retrying `TransientFailure`s after `transientRetryBackoff`'s waits.
    /// Returns nil when shutdown began before it succeeded; rethrows any other error.
    public func retryingTransient<T: Sendable>(
        _ operation: () async throws -> T,
        onRetry: (TransientFailure) -> Void = { _ in }
    ) async throws -> T? {
        var failures = 0
        while true {
            if isStopping() { return nil }
            do {
                return try await operation()
            } catch let failure as TransientFailure {
                onRetry(failure)
                failures += 1
                guard await sleep(Self.transientRetryBackoff.delay(afterAttempt: failures, unit: 0)) else { return nil }
            }
        }
    }
}

/// A failure worth retrying the same work for (a broken Redis connection, a timeout).
public struct TransientFailure: Error, Sendable, Hashable, CustomStringConvertible {
    public var detail: String
    public init(_ detail: String) { self.detail = detail }
    public var description: String { detail }
}

/// A stage's processing: one result per input, in input order.
public protocol StageProcessor: Sendable {
    /// ingest, resolve, suppress, render, send, registry.
    var stage: String { get }
    func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult]
    /// The event and app a traced input is about, for its span's `herald.event_id` and `herald.app_id`
    /// (docs/operations.md, "Tracing"); nil when the stage cannot tell (the default). The loop asks only about
    /// traced inputs, so decoding the input again is fine.
    func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)?
}

extension StageProcessor {
    public func traceIdentity(of input: StageInput) -> (eventID: String, appID: String)? { nil }
}

/// The explain trail sink (Redis in the stages, an array in tests).
public protocol ExplainSink: Sendable {
    func record(_ entries: [ExplainEntry]) async throws
    /// Whether `record` would keep `entry`. The stage loop hands the sink only such entries, so that the many a
    /// compact trail leaves out (a first-attempt delivery, the fan-out) are not gathered and copied for nothing.
    func keeps(_ entry: ExplainEntry) -> Bool
    /// Whether `record` would keep a routine entry (`ExplainEntry.isRoutine`) about a device of `user`, or about
    /// the event when `user` is nil, in event `eventID` of `appID`; asked before such an entry is made.
    func keepsRoutine(appID: String, eventID: String, user: String?) -> Bool
}

extension ExplainSink {
    /// Every entry, unless the sink says otherwise.
    public func keeps(_ entry: ExplainEntry) -> Bool { true }

    public func keepsRoutine(appID: String, eventID: String, user: String?) -> Bool { true }
}
