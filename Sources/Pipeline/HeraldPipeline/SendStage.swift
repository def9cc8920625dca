import Foundation
import HeraldCore
import Synchronization

/// send's idempotency records: a claim before sending, a confirmation after the 200 (Redis in the stage).
///
/// The protocol closes the window in which two copies of one (event, device) pair, replayed by an upstream
/// stage or handed to two send processes around a rebalance, could both be sent: only the copy that claims the
/// pair sends it; a copy that finds a delivery record is a duplicate; a copy that finds another owner's claim
/// waits (through the retry topic) until that claim is confirmed, released or expired.
public protocol DeliveryLedger: Sendable {
    /// Claims each pair for `owner` until `now + ttlMilliseconds`; one round trip.
    func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds: Int64, now: Int64
    ) async throws -> [ClaimOutcome]
    /// Records the pairs as delivered (after APNs answered 200) at `now`; one round trip.
    func confirm(app: String, pairs: [DeliveryPair], now: Int64) async throws
    /// Gives up `owner`'s claims on pairs that were not delivered (retried later, dead-lettered, token dead).
    func release(app: String, pairs: [DeliveryPair], owner: String, now: Int64) async throws
}

/// What a claim found.
public enum ClaimOutcome: Sendable, Hashable {
    /// Claimed for this owner: send it.
    case claimed
    /// Already delivered: a duplicate, not sent again.
    case delivered
    /// Another owner holds the claim until `until` (epoch ms): not sent now.
    case pendingElsewhere(until: Int64)
}

/// One notification for the transport.
public struct PushJob: Sendable, Hashable {
    public var appID: String
    public var request: PushRequest
    /// From the priority lane: started before queued bulk jobs, and may use the streams reserved for it.
    public var prioritized: Bool
    /// Its notification is traced (docs/operations.md, "Tracing"): the transport keeps what the request span shows
    /// that it otherwise drops (FCM's message name).
    public var traced: Bool
    public init(appID: String, request: PushRequest, prioritized: Bool = false, traced: Bool = false) {
        self.appID = appID
        self.request = request
        self.prioritized = prioritized
        self.traced = traced
    }
}

/// APNs's final answer to one job (after the transport's own transparent resends).
public enum PushAnswer: Sendable, Equatable {
    case answered(status: Int, reason: APNsReason?, timestamp: Int64?)
    case failed(PushTransportFailure)
    /// No credential is configured for the job's app, topic and environment.
    case noCredential(String)
    /// An answer the transport already classified with its provider's table (FCM, webhooks): the status
    /// (nil below HTTP), the reason text, the class, the provider's `Retry-After`, and for a traced job FCM's message
    /// name (`projects/.../messages/...`, from its 200).
    case classified(
        status: Int?, reason: String, answer: PushAnswerClass, retryAfter: Duration?, messageName: String? = nil)
}

/// Sends notifications to APNs (HTTP/2 clients in the stage; a script in tests).
public protocol PushTransport: Sendable {
    /// Sends every job; `onAnswer(index, answer)` is called once per job as its final answer arrives (any
    /// order, any thread; keep it short). Returns after the last answer. Many jobs are in flight at once; the
    /// call waits while the transport's in-flight bound is reached (backpressure).
    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async
    /// `send(_:onAnswer:)`, with `onRetry(index, retry)` called for each retry the transport itself makes of a
    /// traced job's request, before that job's answer. By default a transport reports none.
    func send(
        _ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async
    /// Where `job`'s request goes (host and port), when the transport can tell cheaply: for a traced job's request
    /// span (`server.address`, `server.port`). Nil by default.
    func server(for job: PushJob) -> ServiceEndpoint?
}

extension PushTransport {
    public func server(for job: PushJob) -> ServiceEndpoint? { nil }

    public func send(
        _ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void,
        onRetry: @escaping @Sendable (Int, ProviderRetry) -> Void
    ) async {
        await send(jobs, onAnswer: onAnswer)
    }
}

/// send: `herald.outbound` and `herald.retry` -> APNs; dead tokens -> `herald.token-feedback`,
/// retryable failures -> `herald.retry` (attempt + 1, `not_before` from the backoff policy), permanent
/// failures and exhausted retries -> DLQ.
///
/// - A record whose `not_before` is in the future is held (not sent) until then; shutdown hands it back.
/// - Idempotency (see `DeliveryLedger`): a pair (event, token) is claimed before it is sent and confirmed after
///   APNs's 200, before the input completes. A copy of a pair this process is already sending, or one already
///   delivered, is not sent; a copy claimed by another process goes back to the retry topic until that claim
///   ends. At least once: a crash between the 200 and the confirmation resends that one notification once the
///   claim lapses (same `apns-id`).
public struct SendProcessor: StageProcessor {
    public let stage = "send"
    public var retryTopic: String
    public var tokenFeedbackTopic: String
    public var transport: any PushTransport
    public var ledger: any DeliveryLedger
    /// This process's name in claims (unique per process run).
    public var owner: String
    /// How long a claim holds before it lapses unless confirmed: longer than a request can take, queueing
    /// in the transport included. A process killed after claiming makes the pair wait this long, and in Redis up
    /// to 10 s more (a claim lapses with its block of claim numbers, docs/redis-keys.md).
    public var claimTTL: Duration
    /// Pairs claimed by this process and not yet answered: a second copy arriving meanwhile is not sent.
    let inFlight = InFlightPairs()
    /// Attempts in total and the delay before each retry.
    public var retryPolicy: BackoffPolicy
    /// A random number in [0, 1) for the backoff's jitter.
    public var unit: @Sendable () -> Double
    public var onTransientFailure: @Sendable (TransientFailure) -> Void
    /// The priority lane's processor: its jobs go ahead of bulk ones in the transport.
    public var prioritized = false
    /// The pipeline file's apps: a record of an app it does not list is dead-lettered `unknown_app` before any
    /// claim or send (nil: every app is served).
    public var apps: AppDirectory?
    /// The apps as the pipeline file now says (reloaded on SIGHUP or when the file changes, docs/operations.md
    /// "Reloading"): when set, each batch takes the current directory in place of `apps`.
    public var live: LiveAppDirectory?
    /// Told how long each phase of a batch took: `claim`, `answer` (handing the jobs to the transport until the last
    /// answer), `confirm` (the delivery records still being written after the last answer).
    public var onPhase: @Sendable (_ phase: String, _ duration: Duration) -> Void = { _, _ in }
    /// Attempts before `retries_exhausted` when the last one was lost with its connection (no answer from APNs):
    /// four times the policy's, since a single connection drop fails every request in flight on it.
    public var connectionLossAttempts: Int { retryPolicy.maxAttempts * 4 }

    public init(
        retryTopic: String, tokenFeedbackTopic: String, transport: any PushTransport, ledger: any DeliveryLedger,
        owner: String = UUIDString.random(), claimTTL: Duration = .seconds(90),
        retryPolicy: BackoffPolicy = BackoffPolicy(
            initialDelay: .seconds(1), maxDelay: .seconds(60),
            maxAttempts: 6),
        unit: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) },
        onTransientFailure: @escaping @Sendable (TransientFailure) -> Void = { _ in }
    ) {
        self.retryTopic = retryTopic
        self.tokenFeedbackTopic = tokenFeedbackTopic
        self.transport = transport
        self.ledger = ledger
        self.owner = owner
        self.claimTTL = claimTTL
        self.retryPolicy = retryPolicy
        self.unit = unit
        self.onTransientFailure = onTransientFailure
    }

    public func process(_ batch: [StageInput], context: BatchContext) async -> [StageResult] {
        if let live {
            var current = self
            current.live = nil
            current.apps = live.current
            return await current.process(batch, context: context)
        }
        var results = [StageResult?](repeating: nil, count: batch.count)
        let now = context.nowMillis
        // Records grouped by how long they must wait (rounded up to 50 ms).
        var buckets: [Int64: [NumberedRecord]] = [:]
        for (index, input) in batch.enumerated() {
            do {
                let record = try input.decode(OutboundRecord.self)
                if let apps, !apps.isKnown(record.appID) {
                    results[index] = .dlq(AppDirectory.unknownAppReason, AppDirectory.unknownAppDetail(record.appID))
                    continue
                }
                let wait = max(0, Saturating.subtract(record.notBefore ?? 0, now))
                buckets[Saturating.add(wait, 49) / 50 * 50, default: []].append(
                    NumberedRecord(index: index, record: record, traced: input.trace != nil))
            } catch {
                results[index] = error.result
            }
        }
        let done = await withTaskGroup(of: [NumberedResult].self) { group in
            for (wait, records) in buckets {
                group.addTask {
                    if wait > 0, !(await context.sleep(.milliseconds(wait))) {
                        return records.map { NumberedResult($0.index, .handedBack) }
                    }
                    return await self.sendNow(records, context: context)
                }
            }
            var all: [NumberedResult] = []
            for await part in group { all += part }
            return all
        }
        for item in done { results[item.index] = item.result }
        return results.map { $0 ?? .handedBack }
    }

    /// A record of the batch with its position in it. A class: a record passes through the buckets, the candidates,
    /// the groups per app and the claimed ones, and a copy of a reference is one retain where a copy of the record's
    /// strings is one each. (Not a tuple: an array of tuples is copied and destroyed through the runtime's generic
    /// tuple witnesses.)
    final class NumberedRecord: Sendable {
        let index: Int
        let record: OutboundRecord
        /// The record's pair, made (and hashed) once for the sets and tables it is looked up in.
        let pair: DeliveryPair
        /// Its input is traced (`StageInput.trace`): its provider request is reported (`StageNote.providerRequest`).
        let traced: Bool

        init(index: Int, record: OutboundRecord, traced: Bool = false) {
            self.index = index
            self.record = record
            pair = record.deliveryPair
            self.traced = traced
        }
    }

    /// The result for the record at `index` of the batch.
    struct NumberedResult {
        let index: Int
        let result: StageResult

        init(_ index: Int, _ result: StageResult) {
            self.index = index
            self.result = result
        }
    }

    /// Claim, send, classify, confirm or release.
    func sendNow(_ records: [NumberedRecord], context: BatchContext) async -> [NumberedResult] {
        var out: [NumberedResult] = []
        // 1. A pair this process is already sending (a second copy in this or another batch) is not sent again:
        //    the first copy's input completes only once that copy is delivered, retried or dead-lettered.
        var candidates: [NumberedRecord] = []
        let started = context.nowMillis
        for item in records {
            // 0. Past its `apns-expiration`: APNs would drop it, and a ring that is over must not sound.
            if item.record.request.expiration > 0,
                Saturating.milliseconds(fromSeconds: item.record.request.expiration) <= started
            {
                out.append(NumberedResult(item.index, expired(item.record, started)))
                continue
            }
            if inFlight.insert(item.pair) {
                candidates.append(item)
            } else {
                out.append(NumberedResult(item.index, duplicate(item.record, "in_flight", context.nowMillis)))
            }
        }
        defer { inFlight.remove(candidates.map(\.pair)) }

        // 2. Claim (one round trip per app).
        let claimStarted = ContinuousClock.now
        var fresh: [NumberedRecord] = []
        let ttl = claimTTL.milliseconds
        for (app, group) in Dictionary(grouping: candidates, by: { $0.record.appID }) {
            let pairs = group.map(\.pair)
            let now = context.nowMillis
            guard
                let outcomes = await retrying(
                    context,
                    {
                        try await ledger.claim(app: app, pairs: pairs, owner: owner, ttlMilliseconds: ttl, now: now)
                    })
            else {
                return records.map { NumberedResult($0.index, .handedBack) }
            }
            for (position, item) in group.enumerated() {
                switch position < outcomes.count
                    ? outcomes[position] : .pendingElsewhere(until: Saturating.add(now, ttl))
                {
                case .claimed:
                    fresh.append(item)
                case .delivered:
                    out.append(NumberedResult(item.index, duplicate(item.record, "delivered", now)))
                case .pendingElsewhere(let until):
                    out.append(
                        NumberedResult(item.index, deferred(item.record, until: max(until, now) + 100, now: now)))
                }
            }
        }
        onPhase("claim", ContinuousClock.now - claimStarted)
        if fresh.isEmpty { return out }

        // 3. Send them all at once; the transport keeps many in flight. Each 200 is confirmed as soon as it
        //    arrives (the marker batches what arrives while a write is under way), so the window in which a crash
        //    would resend a delivered notification is one Redis round trip, not a whole batch.
        let answers = AnswerBox(count: fresh.count)
        let marker = DeliveryMarker(ledger: ledger, context: context, onTransientFailure: onTransientFailure)
        let prioritized = self.prioritized
        let jobs = fresh.map {
            PushJob(appID: $0.record.appID, request: $0.record.request, prioritized: prioritized, traced: $0.traced)
        }
        let deliveryPairs = fresh.map(\.pair)
        // A traced input's request span runs from here to its answer (wall clock); nothing is read for the others.
        let times = fresh.contains(where: { $0.traced }) ? RequestTimes(count: fresh.count, context: context) : nil
        let sendStarted = ContinuousClock.now
        await transport.send(
            jobs,
            onAnswer: { index, answer in
                guard index >= 0, index < jobs.count else { return }
                if let times, jobs[index].traced { times.answered(index) }
                answers.set(index, answer)
                var delivered = false
                if case .answered(200, _, _) = answer { delivered = true }
                if case .classified(_, _, .delivered, _, _) = answer { delivered = true }
                if delivered {
                    marker.add(app: jobs[index].appID, deliveryPairs[index])
                }
            },
            onRetry: { index, retry in
                guard index >= 0, index < jobs.count, jobs[index].traced, let times else { return }
                times.retried(index, retry)
            })
        // 4. Every 200 is confirmed before the inputs complete; claims of what was not delivered are released.
        let answered = ContinuousClock.now
        onPhase("answer", answered - sendStarted)
        await marker.finish()
        onPhase("confirm", ContinuousClock.now - answered)
        let now = context.nowMillis
        let received = answers.values
        var release: [String: [DeliveryPair]] = [:]
        for (position, item) in fresh.enumerated() {
            let (result, delivered) = classify(
                item.record, received[position] ?? .failed(.clientShutdown), now: now,
                explainFirstDelivery: item.record.attempt > 1
                    || context.keepsRoutine(
                        appID: item.record.appID, eventID: item.record.eventID, user: item.record.recipient)
            )
            if let times, item.traced,
                var request = requestNote(
                    item.record, jobs[position], received[position], start: times.start,
                    end: times.end(position))
            {
                request.retries = times.retries(position)
                var result = result
                result.notes.append(.providerRequest(request))
                out.append(NumberedResult(item.index, result))
            } else {
                out.append(NumberedResult(item.index, result))
            }
            if !delivered {
                release[item.record.appID, default: []].append(item.pair)
            }
        }
        for (app, pairs) in release {
            // Best effort: an unreleased claim only delays a later copy until it expires.
            do { try await ledger.release(app: app, pairs: pairs, owner: owner, now: now) } catch {
                onTransientFailure(TransientFailure("releasing claims: \(error)"))
            }
        }
        return out
    }

    /// The provider request of a traced record (`StageNote.providerRequest`): nil when none was made (no
    /// credential, or handed back at shutdown before an answer).
    func requestNote(
        _ record: OutboundRecord, _ job: PushJob, _ answer: PushAnswer?, start: UInt64, end: UInt64?
    ) -> ProviderRequest? {
        guard let answer, let end else { return nil }
        let status: Int?
        let reason: String
        let failure: String?
        var messageID = record.request.provider == .apns ? record.request.apnsID : nil
        switch answer {
        case .noCredential, .failed(.clientShutdown):
            return nil
        case .failed(let transportFailure):
            status = nil
            reason = transportFailure.kind
            failure = transportFailure.kind
        case .answered(let code, let apnsReason, _):
            status = code
            reason = apnsReason?.wire ?? ""
            failure = code == 200 ? nil : String(code)
        case .classified(let code, let text, let answerClass, _, let name):
            if code == nil, text == "ClientShutdown" { return nil }
            status = code
            reason = text
            failure = answerClass == .delivered ? nil : code.map(String.init) ?? text
            if let name { messageID = name }
        }
        return ProviderRequest(
            provider: record.request.provider.rawValue, status: status, reason: reason, failure: failure,
            messageID: messageID, server: transport.server(for: job), attempt: record.attempt,
            startNanoseconds: start, endNanoseconds: max(start, end))
    }

    /// A notification whose `apns-expiration` passed before it could be sent: dropped, counted, explained.
    private func expired(_ record: OutboundRecord, _ now: Int64) -> StageResult {
        StageResult(notes: [.suppressed(reason: "expired")], explain: [explain(record, "drop", "expired", nil, now)])
    }

    /// A copy that is not sent: the pair is delivered already or being sent by this process.
    private func duplicate(_ record: OutboundRecord, _ why: String, _ now: Int64) -> StageResult {
        StageResult(notes: [.duplicate], explain: [explain(record, "duplicate", why, nil, now)])
    }

    /// A copy whose pair another process claimed: back to the retry topic (same attempt) until the claim ends.
    private func deferred(_ record: OutboundRecord, until: Int64, now: Int64) -> StageResult {
        var later = record
        later.notBefore = until
        return StageResult(
            outputs: [StageOutput.record(later, topic: retryTopic, key: record.request.token)],
            notes: [.retried(reason: "claimed_elsewhere")],
            explain: [explain(record, "retry", "claimed_elsewhere", nil, now)])
    }

    static let badDeviceToken = "BadDeviceToken"
    static let deviceTokenNotForTopic = "DeviceTokenNotForTopic"
    /// The retry reason of a guessed environment tried on the other.
    static let otherEnvironment = "other_environment"

    /// The notes of a 200 from APNs.
    static let delivered200: [StageNote] = [.apnsAnswer(status: 200, reason: "")]

    /// What one answer means for one record; `true` when it was delivered. A delivery's explain entry is left out
    /// when `explainFirstDelivery` is false (the trail would not keep it: `BatchContext.keepsRoutine`).
    func classify(
        _ record: OutboundRecord, _ answer: PushAnswer, now: Int64, explainFirstDelivery: Bool = true
    ) -> (StageResult, Bool) {
        let answerClass: PushAnswerClass
        let reasonText: String
        var status: Int?
        let answerNote: StageNote
        var retryAfter: Duration?
        switch answer {
        case .noCredential(let why):
            return (.dlq("no_credential", why, explain: [explain(record, "dlq", "no_credential", nil, now)]), false)
        case .failed(.clientShutdown):
            return (.handedBack, false)
        case .failed(let failure):
            // A deadline passing is retried through herald.retry like a lost connection (the apns-id is the same).
            answerClass = failure == .deadlineExceeded ? .retryable : APNsAnswerTable.classify(failure)
            reasonText = failure.kind
            answerNote = .apnsAnswer(status: nil, reason: reasonText)
        case .answered(let code, let reason, let timestamp):
            status = code
            answerClass = APNsAnswerTable.classify(status: code, reason: reason, timestamp: timestamp)
            reasonText = reason?.wire ?? (code == 200 ? "" : "HTTP\(code)")
            answerNote = .apnsAnswer(status: code, reason: reason?.wire ?? "")
        case .classified(let code, let reason, let cls, let after, _):
            if code == nil, reason == "ClientShutdown" { return (.handedBack, false) }
            status = code
            answerClass = cls
            reasonText = reason
            retryAfter = after
            answerNote = .apnsAnswer(status: code, reason: reason)
        }
        switch answerClass {
        case .delivered:
            // Nearly every answer: its note array is shared, not allocated per notification.
            let notes = answerNote == Self.delivered200.first ? Self.delivered200 : [answerNote]
            let entries = explainFirstDelivery ? [explain(record, "delivered", nil, status, now)] : []
            return (StageResult(notes: notes, explain: entries), true)
        case .tokenDead(let at):
            // Only an answer about what the device was registered with is the token's death (docs/providers.md,
            // "Dead tokens"): an environment Herald guessed gets one try on the other first, and a topic it guessed
            // says nothing about the token.
            let guesses = record.request.provider == .apns ? record.request.guesses : []
            if reasonText == Self.badDeviceToken, guesses.contains(.environment), !guesses.contains(.otherEnvironment) {
                var retry = record
                retry.request.environment = record.request.environment == .production ? .sandbox : .production
                retry.request.guesses.insert(.otherEnvironment)
                retry.attempt = record.attempt < Int.max ? record.attempt + 1 : Int.max
                retry.notBefore = now
                return (
                    StageResult(
                        outputs: [StageOutput.record(retry, topic: retryTopic, key: record.request.token)],
                        notes: [answerNote, .retried(reason: Self.otherEnvironment)],
                        explain: [explain(record, "retry", Self.otherEnvironment, status, now)]), false
                )
            }
            if reasonText == Self.deviceTokenNotForTopic, guesses.contains(.topic) {
                return (
                    .dlq(
                        reasonText,
                        "APNs answered \(status.map(String.init) ?? "no status") \(reasonText) for the topic Herald guessed (the app's first credential); the token is kept",
                        notes: [answerNote], explain: [explain(record, "dlq", reasonText, status, now)]), false
                )
            }
            let feedback = TokenFeedbackRecord(
                appID: record.appID, user: record.recipient, token: record.request.token,
                reason: reasonText, deadSince: at ?? now)
            let notes: [StageNote] = [answerNote, .tokenDead(reason: reasonText)]
            let output = StageOutput.record(feedback, topic: tokenFeedbackTopic, key: feedback.key)
            return (
                StageResult(
                    outputs: [output], notes: notes,
                    explain: [explain(record, "token_dead", reasonText, status, now)]), false
            )
        case .retryable, .renewCredentials:
            // A request lost with its connection got no answer: APNs refused nothing. One dropped connection takes
            // every stream in flight on it along, so such losses get a larger budget (`connectionLossAttempts`)
            // before the notification is dead-lettered; its expiration still ends it.
            var notes = [answerNote]
            var budget = retryPolicy.maxAttempts
            if case .failed(.connectionLost) = answer { budget = connectionLossAttempts }
            guard record.attempt < budget else {
                return (
                    .dlq(
                        "retries_exhausted", "\(reasonText) after \(record.attempt) attempts", notes: notes,
                        explain: [explain(record, "dlq", "retries_exhausted", status, now)]), false
                )
            }
            var retry = record
            retry.attempt = record.attempt < Int.max ? record.attempt + 1 : Int.max
            let delay = max(retryPolicy.delay(afterAttempt: record.attempt, unit: unit()), retryAfter ?? .zero)
            retry.notBefore = Saturating.add(now, delay.milliseconds)
            notes.append(.retried(reason: reasonText))
            let output = StageOutput.record(retry, topic: retryTopic, key: record.request.token)
            return (
                StageResult(
                    outputs: [output], notes: notes,
                    explain: [explain(record, "retry", reasonText, status, now)]), false
            )
        case .permanent:
            let code = reasonText.isEmpty ? "permanent" : reasonText
            return (
                .dlq(
                    code,
                    "\(record.request.provider == .apns ? "APNs" : record.request.provider.rawValue) answered \(status.map(String.init) ?? "no status") \(code) on attempt \(record.attempt)",
                    notes: [answerNote], explain: [explain(record, "dlq", code, status, now)]), false
            )
        }
    }

    private func explain(
        _ record: OutboundRecord, _ decision: String, _ reason: String?, _ status: Int?,
        _ now: Int64
    ) -> ExplainEntry {
        ExplainEntry(
            appID: record.appID, eventID: record.eventID, user: record.recipient, token: record.request.token,
            stage: stage, decision: decision, reason: reason, at: now, status: status, attempt: record.attempt)
    }

    /// Retries any failure of an idempotent Redis call until it succeeds or shutdown begins.
    private func retrying<T: Sendable>(_ context: BatchContext, _ operation: () async throws -> T) async -> T? {
        try? await context.retryingTransient(
            {
                do { return try await operation() } catch let error as TransientFailure { throw error } catch {
                    throw TransientFailure("\(error)")
                }
            }, onRetry: onTransientFailure)
    }
}

/// The answers of one send, filled in from the transport's threads.
final class AnswerBox: Sendable {
    private let answers: Mutex<[PushAnswer?]>
    init(count: Int) { answers = Mutex(Array(repeating: nil, count: count)) }
    func set(_ index: Int, _ answer: PushAnswer) { answers.withLock { $0[index] = answer } }
    var values: [PushAnswer?] { answers.withLock { $0 } }
}

/// When one send handed its jobs to the transport and when each traced job's answer arrived (wall clock,
/// nanoseconds since the epoch); made only for a send with a traced job.
final class RequestTimes: Sendable {
    let start: UInt64
    private let ends: Mutex<[UInt64?]>
    private let retries = Mutex<[Int: [ProviderRetry]]>([:])
    private let context: BatchContext

    init(count: Int, context: BatchContext) {
        self.context = context
        start = Self.nanoseconds(context.now())
        ends = Mutex(Array(repeating: nil, count: count))
    }

    /// Notes now as the answer time of the job at `index`.
    func answered(_ index: Int) {
        let now = Self.nanoseconds(context.now())
        ends.withLock { $0[index] = now }
    }

    func end(_ index: Int) -> UInt64? { ends.withLock { $0[index] } }

    /// Notes a retry the transport made of the job at `index`.
    func retried(_ index: Int, _ retry: ProviderRetry) { retries.withLock { $0[index, default: []].append(retry) } }

    func retries(_ index: Int) -> [ProviderRetry] { retries.withLock { $0[index] ?? [] } }

    static func nanoseconds(_ date: Date) -> UInt64 { UInt64(max(0, date.timeIntervalSince1970 * 1_000_000_000)) }
}

/// Confirms deliveries as 200s arrive: the first one at once, the ones arriving meanwhile in the next
/// pipelined write (one round trip per app), until `finish()` finds nothing pending.
final class DeliveryMarker: Sendable {
    /// The pairs waiting for the next write, whether a drain is running, and who waits for it to end.
    private struct State {
        var pending: [String: [DeliveryPair]] = [:]
        var running = false
        var finishers: [CheckedContinuation<Void, Never>] = []
    }
    private let state = Mutex(State())
    private let ledger: any DeliveryLedger
    private let context: BatchContext
    private let onTransientFailure: @Sendable (TransientFailure) -> Void

    init(
        ledger: any DeliveryLedger, context: BatchContext,
        onTransientFailure: @escaping @Sendable (TransientFailure) -> Void
    ) {
        self.ledger = ledger
        self.context = context
        self.onTransientFailure = onTransientFailure
    }

    func add(app: String, _ pair: DeliveryPair) {
        let start = state.withLock { state -> Bool in
            state.pending[app, default: []].append(pair)
            if state.running { return false }
            state.running = true
            return true
        }
        if start { Task { await self.drain() } }
    }

    private func drain() async {
        while true {
            let (batch, done) = state.withLock { state in
                let b = state.pending
                state.pending = [:]
                guard b.isEmpty else { return (b, [CheckedContinuation<Void, Never>]()) }
                state.running = false
                defer { state.finishers = [] }
                return (b, state.finishers)
            }
            if batch.isEmpty {
                done.forEach { $0.resume() }
                return
            }
            for (app, pairs) in batch {
                // Retried until it succeeds or shutdown begins (then the pairs stay unmarked: at least once).
                _ = try? await context.retryingTransient(
                    {
                        do {
                            try await self.ledger.confirm(app: app, pairs: pairs, now: self.context.nowMillis)
                        } catch let error as TransientFailure {
                            throw error
                        } catch {
                            throw TransientFailure("\(error)")
                        }
                    }, onRetry: onTransientFailure)
            }
        }
    }

    /// Returns once everything added so far is written (or shutdown began).
    func finish() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { state -> Bool in
                if !state.running && state.pending.isEmpty { return true }
                state.finishers.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }
}

/// The (event, token) pairs this process is sending right now.
final class InFlightPairs: Sendable {
    private let pairs = Mutex(Set<DeliveryPair>())

    /// False when the pair is in flight already.
    func insert(_ pair: DeliveryPair) -> Bool { pairs.withLock { $0.insert(pair).inserted } }

    func remove(_ done: [DeliveryPair]) { pairs.withLock { pairs in done.forEach { pairs.remove($0) } } }
}

/// A random identifier (a process's name in claims).
public enum UUIDString {
    public static func random() -> String { UUID().uuidString.lowercased() }
}
