import Foundation
import HeraldCore
import HeraldPipeline
import Testing

/// send with answers its transports classified by the FCM and webhook tables (`PushAnswer.classified`).
@Suite struct ProviderSendTests {
    @Test func classifiedAnswersHaveTheirDispositions() async throws {
        let transport = ScriptedTransport([
            token("1"): .classified(status: 200, reason: "", answer: .delivered, retryAfter: nil),
            token("2"): .classified(
                status: 404, reason: "UNREGISTERED", answer: .tokenDead(unregisteredAt: nil), retryAfter: nil),
            token("3"): .classified(
                status: 429, reason: "QUOTA_EXCEEDED", answer: .retryable, retryAfter: .seconds(30)),
            token("4"): .classified(status: 503, reason: "HTTP503", answer: .retryable, retryAfter: nil),
            token("5"): .classified(status: 403, reason: "SENDER_ID_MISMATCH", answer: .permanent, retryAfter: nil),
            token("6"): .classified(status: nil, reason: "TimedOut", answer: .retryable, retryAfter: nil),
            token("7"): .classified(status: nil, reason: "ClientShutdown", answer: .permanent, retryAfter: nil),
        ])
        let ledger = MemoryLedger()
        let send = sendProcessor(transport, ledger)
        let batch = try ["1", "2", "3", "4", "5", "6", "7"].map { try outbound(token(Character($0))) }
        let results = await send.process(batch, context: fixedContext)
        let now: Int64 = 1_732_000_100_000

        #expect(results[0].outputs.isEmpty && results[0].deadLetter == nil)
        #expect(ledger.pairs == [DeliveryPair(eventID: "e1", token: token("1"))])
        // UNREGISTERED: token feedback, dead since the answer.
        let feedback = try decode(TokenFeedbackRecord.self, try #require(results[1].outputs.first))
        #expect(feedback.token == token("2") && feedback.reason == "UNREGISTERED" && feedback.deadSince == now)
        // QUOTA_EXCEEDED with Retry-After 30 s: not before now + 30 s (the backoff alone says 1 s).
        let quota = try decode(OutboundRecord.self, try #require(results[2].outputs.first))
        #expect(quota.attempt == 2 && quota.notBefore == now + 30_000)
        // A webhook 503 and a webhook timeout: the backoff.
        for index in [3, 5] {
            let retry = try decode(OutboundRecord.self, try #require(results[index].outputs.first))
            #expect(results[index].outputs[0].topic == "herald.retry" && retry.notBefore == now + 1000)
        }
        #expect(results[4].deadLetter?.reason == "SENDER_ID_MISMATCH")
        #expect(results[6].handBack && results[6].outputs.isEmpty)
    }
}
