import Foundation
import HeraldCore
import HeraldPipeline
import Testing

/// Answers by token; records what was sent and when.
final class ScriptedTransport: PushTransport, @unchecked Sendable {
    // @unchecked Sendable: every mutable field is guarded by `lock`.
    private let lock = NSLock()
    private let answers: [String: PushAnswer]
    private var sentTokens: [String] = []
    private var sentAt: [ContinuousClock.Instant] = []
    private var sentTraced: [String] = []

    init(_ answers: [String: PushAnswer]) { self.answers = answers }

    var sent: [String] { lock.withLock { sentTokens } }
    var times: [ContinuousClock.Instant] { lock.withLock { sentAt } }
    /// The tokens of the jobs sent with `traced` set.
    var traced: [String] { lock.withLock { sentTraced } }

    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        lock.withLock {
            for job in jobs {
                sentTokens.append(job.request.token)
                sentAt.append(ContinuousClock.now)
                if job.traced { sentTraced.append(job.request.token) }
            }
        }
        // Answers arrive in reverse order, as they may from many streams.
        for (index, job) in jobs.enumerated().reversed() {
            onAnswer(index, answers[job.request.token] ?? .answered(status: 200, reason: nil, timestamp: nil))
        }
    }
}

/// Claims in memory, with the Redis ledger's rules: a pair is delivered, claimed by an owner until a time, or free.
final class MemoryLedger: DeliveryLedger, @unchecked Sendable {
    // @unchecked Sendable: `delivered` and `claims` are guarded by `lock`.
    private let lock = NSLock()
    private var delivered: Set<DeliveryPair> = []
    private var claims: [DeliveryPair: (owner: String, until: Int64)] = [:]
    private(set) var releasedCount = 0

    init(_ initial: Set<DeliveryPair> = [], claims: [DeliveryPair: (owner: String, until: Int64)] = [:]) {
        delivered = initial
        self.claims = claims
    }

    var pairs: Set<DeliveryPair> { lock.withLock { delivered } }
    var claimed: [DeliveryPair: String] { lock.withLock { claims.mapValues(\.owner) } }
    var released: Int { lock.withLock { releasedCount } }

    func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds: Int64, now: Int64
    ) async throws -> [ClaimOutcome] {
        lock.withLock {
            pairs.map { pair in
                if delivered.contains(pair) { return .delivered }
                if let held = claims[pair], held.until > now, held.owner != owner {
                    return .pendingElsewhere(until: held.until)
                }
                claims[pair] = (owner, now + ttlMilliseconds)
                return .claimed
            }
        }
    }

    func confirm(app: String, pairs: [DeliveryPair], now: Int64) async throws {
        lock.withLock {
            for pair in pairs {
                delivered.insert(pair)
                claims[pair] = nil
            }
        }
    }

    func release(app: String, pairs: [DeliveryPair], owner: String, now: Int64) async throws {
        lock.withLock {
            for pair in pairs where claims[pair]?.owner == owner {
                claims[pair] = nil
                releasedCount += 1
            }
        }
    }
}

func token(_ c: Character) -> String { String(repeating: c, count: 64) }

func outbound(_ tok: String, event: String = "e1", attempt: Int = 1, notBefore: Int64? = nil) throws -> StageInput {
    let request = PushRequest(
        token: tok, environment: .production, pushType: .alert, topic: "com.example.chat",
        priority: 10, collapseID: nil, expiration: 0,
        apnsID: APNsID.derive(eventID: event, token: tok), payload: Array(#"{"aps":{}}"#.utf8))
    let record = OutboundRecord(
        eventID: event, appID: "app1", recipient: "u2", request: request, attempt: attempt,
        notBefore: notBefore)
    return StageInput(topic: attempt == 1 ? "herald.outbound" : "herald.retry", value: StageCodec.encode(record))
}

func sendProcessor(
    _ transport: ScriptedTransport, _ ledger: MemoryLedger, maxAttempts: Int = 3,
    owner: String = "me"
) -> SendProcessor {
    SendProcessor(
        retryTopic: "herald.retry", tokenFeedbackTopic: "herald.token-feedback", transport: transport,
        ledger: ledger, owner: owner, claimTTL: .seconds(90),
        retryPolicy: BackoffPolicy(
            initialDelay: .seconds(1), maxDelay: .seconds(60), jitter: 0,
            maxAttempts: maxAttempts),
        unit: { 0 })
}

@Suite struct SendTests {
    @Test func everyAnswerHasItsDisposition() async throws {
        let transport = ScriptedTransport([
            token("b"): .answered(status: 410, reason: .unregistered, timestamp: 1_731_999_000_000),
            token("c"): .answered(status: 503, reason: .serviceUnavailable, timestamp: nil),
            token("d"): .answered(status: 400, reason: .badTopic, timestamp: nil),
            token("e"): .answered(status: 400, reason: .badDeviceToken, timestamp: nil),
            token("f"): .failed(.connectionLost),
            token("0"): .noCredential("no credential for app1"),
        ])
        let ledger = MemoryLedger()
        let send = sendProcessor(transport, ledger)
        let batch = try ["a", "b", "c", "d", "e", "f", "0"].map { try outbound(token(Character($0))) }
        let results = await send.process(batch, context: fixedContext)
        let now: Int64 = 1_732_000_100_000

        // 200: delivered and remembered.
        #expect(results[0].outputs.isEmpty && results[0].deadLetter == nil)
        #expect(ledger.pairs == [DeliveryPair(eventID: "e1", token: token("a"))])
        #expect(results[0].explain.first?.decision == "delivered")

        // 410: token feedback with the 410 timestamp, keyed by user.
        let feedback = try decode(TokenFeedbackRecord.self, try #require(results[1].outputs.first))
        #expect(results[1].outputs[0].topic == "herald.token-feedback")
        #expect(
            feedback
                == TokenFeedbackRecord(
                    appID: "app1", user: "u2", token: token("b"), reason: "Unregistered",
                    deadSince: 1_731_999_000_000))
        // 400 BadDeviceToken: dead since the answer.
        #expect(try decode(TokenFeedbackRecord.self, results[4].outputs[0]).deadSince == now)

        // 503 and a lost connection: herald.retry with attempt 2, not before now + 1 s.
        for index in [2, 5] {
            let retry = try decode(OutboundRecord.self, try #require(results[index].outputs.first))
            #expect(results[index].outputs[0].topic == "herald.retry")
            #expect(results[index].outputs[0].key == retry.request.token)
            #expect(retry.attempt == 2)
            #expect(retry.notBefore == now + 1000)
        }
        #expect(results[2].notes.contains(.retried(reason: "ServiceUnavailable")))

        // 400 BadTopic: permanent, DLQ with the APNs reason.
        #expect(results[3].deadLetter?.reason == "BadTopic")
        #expect(results[6].deadLetter?.reason == "no_credential")
    }

    @Test func aFirstDeliveryTheTrailWouldNotKeepGetsNoExplainEntry() async throws {
        let transport = ScriptedTransport([token("c"): .answered(status: 400, reason: .badTopic, timestamp: nil)])
        let send = sendProcessor(transport, MemoryLedger())
        var context = fixedContext
        // The trail keeps routine entries of user "vip" only.
        context.keepsRoutineExplain = { _, _, user in user == "vip" }
        let batch = try [
            outbound(token("a")), outbound(token("b"), event: "e2", attempt: 2), outbound(token("c"), event: "e3"),
        ]
        let results = await send.process(batch, context: context)
        // A first-attempt delivery of another user: delivered, without an entry.
        #expect(results[0].explain.isEmpty && results[0].notes.contains(.apnsAnswer(status: 200, reason: "")))
        // A delivery after a retry and a refusal are not routine: explained.
        #expect(results[1].explain.map(\.decision) == ["delivered"])
        #expect(results[2].explain.map(\.decision) == ["dlq"])
        // Without a predicate every entry is made.
        let all = await sendProcessor(ScriptedTransport([:]), MemoryLedger()).process(
            [try outbound(token("d"))], context: fixedContext)
        #expect(all[0].explain.map(\.decision) == ["delivered"])
    }

    @Test func retriesEndInTheDLQAfterMaxAttempts() async throws {
        let transport = ScriptedTransport([
            token("c"): .answered(status: 500, reason: .internalServerError, timestamp: nil)
        ])
        let send = sendProcessor(transport, MemoryLedger(), maxAttempts: 3)
        let results = await send.process([try outbound(token("c"), attempt: 3)], context: fixedContext)
        #expect(results[0].outputs.isEmpty)
        #expect(results[0].deadLetter?.reason == "retries_exhausted")
    }

    @Test func aConnectionLossHasALargerBudgetThanAnAnswer() async throws {
        // A 503 at the last attempt is dead-lettered; a request lost with its connection at that attempt is retried
        // (APNs said nothing about it), until four times the attempts.
        let transport = ScriptedTransport([
            token("c"): .answered(status: 503, reason: .serviceUnavailable, timestamp: nil),
            token("d"): .failed(.connectionLost),
        ])
        let send = sendProcessor(transport, MemoryLedger(), maxAttempts: 3)
        let results = await send.process(
            [
                try outbound(token("c"), attempt: 3), try outbound(token("d"), attempt: 3),
                try outbound(token("d"), event: "e2", attempt: 12),
            ], context: fixedContext)
        #expect(results[0].deadLetter?.reason == "retries_exhausted")
        #expect(results[1].deadLetter == nil)
        let retry = try decode(OutboundRecord.self, try #require(results[1].outputs.first))
        #expect(retry.attempt == 4 && results[1].outputs.first?.topic == "herald.retry")
        #expect(results[2].deadLetter?.reason == "retries_exhausted")
    }

    @Test func aPairClaimedByAnotherProcessWaitsInTheRetryTopicUntilTheClaimEnds() async throws {
        let now: Int64 = 1_732_000_100_000
        let pair = DeliveryPair(eventID: "e1", token: token("a"))
        let transport = ScriptedTransport([:])
        let ledger = MemoryLedger(claims: [pair: ("other", now + 5_000)])
        let results = await sendProcessor(transport, ledger).process(
            [try outbound(token("a"), attempt: 2)],
            context: fixedContext)
        #expect(transport.sent.isEmpty)
        let later = try decode(OutboundRecord.self, try #require(results[0].outputs.first))
        #expect(results[0].outputs[0].topic == "herald.retry")
        #expect(later.attempt == 2)  // waiting for a claim is not an attempt
        #expect(later.notBefore == now + 5_100)
        #expect(results[0].notes == [.retried(reason: "claimed_elsewhere")])
        #expect(ledger.claimed[pair] == "other")
    }

    @Test func anExpiredClaimOfAnotherProcessIsTakenOverAndSent() async throws {
        let now: Int64 = 1_732_000_100_000
        let pair = DeliveryPair(eventID: "e1", token: token("a"))
        let transport = ScriptedTransport([:])
        let ledger = MemoryLedger(claims: [pair: ("dead", now - 1)])
        let results = await sendProcessor(transport, ledger).process([try outbound(token("a"))], context: fixedContext)
        #expect(transport.sent == [token("a")])
        #expect(results[0].explain.first?.decision == "delivered")
        #expect(ledger.pairs == [pair])
    }

    @Test func twoCopiesOfOnePairInFlightAreSentOnce() async throws {
        let transport = ScriptedTransport([:])
        let ledger = MemoryLedger()
        let send = sendProcessor(transport, ledger)
        // The same pair twice in one batch, and again in a batch processed at the same time.
        let one = [try outbound(token("a")), try outbound(token("a"))], two = [try outbound(token("a"))]
        async let first = send.process(one, context: fixedContext)
        async let second = send.process(two, context: fixedContext)
        let all = await first + second
        #expect(transport.sent == [token("a")])
        #expect(all.filter { $0.notes == [.duplicate] }.count == 2)
        #expect(all.allSatisfy { !$0.handBack && $0.deadLetter == nil && $0.outputs.isEmpty })
    }

    @Test func claimsOfNotificationsThatWereNotDeliveredAreReleased() async throws {
        let transport = ScriptedTransport([
            token("c"): .answered(status: 503, reason: .serviceUnavailable, timestamp: nil),
            token("d"): .answered(status: 400, reason: .badTopic, timestamp: nil),
        ])
        let ledger = MemoryLedger()
        _ = await sendProcessor(transport, ledger).process(
            [try outbound(token("c")), try outbound(token("d"))],
            context: fixedContext)
        #expect(ledger.released == 2)
        #expect(ledger.claimed.isEmpty)
        #expect(ledger.pairs.isEmpty)
    }

    @Test func aDeliveredPairIsNeverSentAgain() async throws {
        let transport = ScriptedTransport([:])
        let ledger = MemoryLedger([DeliveryPair(eventID: "e1", token: token("a"))])
        let send = sendProcessor(transport, ledger)
        let results = await send.process(
            [try outbound(token("a")), try outbound(token("a"), event: "e2")], context: fixedContext)
        #expect(transport.sent == [token("a")])
        #expect(results[0].notes == [.duplicate])
        #expect(ledger.pairs.contains(DeliveryPair(eventID: "e2", token: token("a"))))
    }

    @Test func aRetryIsHeldUntilItsNotBeforeTime() async throws {
        let transport = ScriptedTransport([:])
        let send = sendProcessor(transport, MemoryLedger())
        let start = ContinuousClock.now
        let context = BatchContext(now: { Date() })
        let due = BatchContext.millis(Date()) + 300
        let results = await send.process(
            [try outbound(token("a"), attempt: 2, notBefore: due), try outbound(token("b"))],
            context: context)
        #expect(results.allSatisfy { !$0.handBack && $0.deadLetter == nil })
        let times = transport.times
        #expect(transport.sent == [token("b"), token("a")])
        // Held until its not-before time (a lower bound, so a busy machine cannot make it flake);
        // the fresh record was not held behind it (the order above).
        #expect(times[1] - start >= .milliseconds(250))
        #expect(times[0] < times[1])
    }

    /// The crash window is one Redis write: a 200 is remembered while the rest of the batch is still in flight.
    @Test func aDeliveryIsRememberedBeforeTheBatchFinishes() async throws {
        final class GatedTransport: PushTransport, @unchecked Sendable {
            // @unchecked Sendable: `markedEarly` is written once before `send` returns and read after.
            let ledger: MemoryLedger
            var markedEarly = false
            init(_ ledger: MemoryLedger) { self.ledger = ledger }
            func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
                onAnswer(0, .answered(status: 200, reason: nil, timestamp: nil))
                let first = DeliveryPair(eventID: "e1", token: jobs[0].request.token)
                let deadline = ContinuousClock.now + .seconds(2)
                while !ledger.pairs.contains(first), ContinuousClock.now < deadline {
                    try? await Task.sleep(for: .milliseconds(1))
                }
                markedEarly = ledger.pairs.contains(first)
                for index in 1..<jobs.count { onAnswer(index, .answered(status: 200, reason: nil, timestamp: nil)) }
            }
        }
        let ledger = MemoryLedger()
        let transport = GatedTransport(ledger)
        let send = SendProcessor(
            retryTopic: "herald.retry", tokenFeedbackTopic: "herald.token-feedback",
            transport: transport, ledger: ledger)
        let results = await send.process([try outbound(token("a")), try outbound(token("b"))], context: fixedContext)
        #expect(transport.markedEarly)
        #expect(ledger.pairs.count == 2)
        #expect(results.allSatisfy { $0.deadLetter == nil && $0.outputs.isEmpty && !$0.handBack })
    }

    @Test func shutdownHandsBackAHeldRetry() async throws {
        let transport = ScriptedTransport([:])
        let send = sendProcessor(transport, MemoryLedger())
        let context = BatchContext(now: { Date() }, isStopping: { true })
        let results = await send.process(
            [try outbound(token("a"), attempt: 2, notBefore: BatchContext.millis(Date()) + 60_000)],
            context: context)
        #expect(results[0].handBack)
        #expect(transport.sent.isEmpty)
    }

    // Held for an hour, handed back within minutes: the signal ended the wait, however loaded the machine is.
    @Test("a retry held until its not_before is handed back when shutdown is signalled", .timeLimit(.minutes(10)))
    func signalledShutdownEndsAHeldRetry() async throws {
        let transport = ScriptedTransport([:])
        let send = sendProcessor(transport, MemoryLedger())
        let stop = StopSignal()
        let context = BatchContext(now: { Date() }, stop: stop)
        let clock = ContinuousClock()
        let start = clock.now
        async let results = send.process(
            [try outbound(token("a"), attempt: 2, notBefore: BatchContext.millis(Date()) + 3_600_000)],
            context: context)
        stop.stop()
        #expect(try await results[0].handBack)
        #expect(clock.now - start < .seconds(600))
        #expect(transport.sent.isEmpty)
    }
}

final class MemoryRegistry: RegistryWriter, @unchecked Sendable {
    // @unchecked Sendable: every field is guarded by `lock`.
    private let lock = NSLock()
    var applied: [RegistryRecord.Op] = []
    var removed: [TokenFeedbackRecord] = []
    var failuresLeft = 0

    func apply(_ record: RegistryRecord, now: Int64) async throws -> String {
        try lock.withLock {
            if failuresLeft > 0 {
                failuresLeft -= 1
                throw TransientFailure("connection_broken")
            }
            applied.append(record.op)
            return "applied"
        }
    }

    func removeDeadToken(_ feedback: TokenFeedbackRecord) async throws -> String {
        lock.withLock { removed.append(feedback) }
        return "removed"
    }
}

@Suite struct RegistryTests {
    func input(_ json: String, topic: String = "herald.registry") -> StageInput {
        StageInput(topic: topic, value: Array(json.utf8))
    }

    @Test func appliesUpdatesAndTokenFeedbackInOrder() async throws {
        let writer = MemoryRegistry()
        writer.failuresLeft = 1
        let registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: writer)
        let results = await registry.process(
            [
                input(
                    #"{"op": "register_device", "app_id": "app1", "user": "u2", "device": {"token": "\#(token("a"))", "bundle_id": "com.example.chat", "registered_at": 5}}"#
                ),
                input(
                    #"{"op": "set_preferences", "app_id": "app1", "user": "u2", "preferences": {"trigger": "mention_only"}}"#
                ),
                input(#"{"op": "set_members", "app_id": "app1", "conversation": "c1", "members": ["u1", "u2"]}"#),
                input(
                    #"{"app_id": "app1", "user": "u2", "token": "\#(token("a"))", "reason": "Unregistered", "dead_since": 7}"#,
                    topic: "herald.token-feedback"),
            ], context: fixedContext)
        #expect(results.allSatisfy { $0.deadLetter == nil && !$0.handBack })
        #expect(writer.applied == [.registerDevice, .setPreferences, .setMembers])
        #expect(writer.removed.map(\.deadSince) == [7])
        #expect(results[3].notes == [.registry(op: "remove_dead_token", outcome: "removed")])
    }

    @Test func invalidUpdatesAreDeadLettered() async {
        let registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: MemoryRegistry())
        let results = await registry.process(
            [
                input(#"{"op": "register_device", "app_id": "app1", "user": "u2"}"#),
                input(#"{"op": "explode", "app_id": "app1", "user": "u2"}"#),
                input("{"),
                StageInput(topic: "herald.registry", value: nil),
                // A user id with a byte that is not UTF-8 must not be repaired into another user's id.
                StageInput(
                    topic: "herald.registry",
                    value: Array(#"{"op": "unregister_all", "app_id": "app1", "user": "u"#.utf8)
                        + [0xff] + Array(#""}"#.utf8)),
            ], context: fixedContext)
        #expect(results.map { $0.deadLetter?.reason } == ["invalid", "invalid", "invalid", "invalid", "invalid"])
        #expect(results[0].deadLetter?.detail.contains("device") == true)
        #expect(results[4].deadLetter?.detail.contains("UTF-8") == true)
    }
}
