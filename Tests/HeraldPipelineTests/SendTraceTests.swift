import Foundation
import HeraldCore
import HeraldPipeline
import Synchronization
import Testing

/// A context whose clock moves 1 ms each time it is read, so a time read later is a later time.
private func tickingContext() -> BatchContext {
    let ticks = Mutex<Int64>(0)
    return BatchContext(now: {
        Date(
            timeIntervalSince1970: Double(
                1_732_000_100_000
                    + ticks.withLock {
                        $0 += 1; return $0
                    }) / 1000)
    })
}

private let sampled = TracePropagation(
    traceparent: Array("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".utf8))

/// `input` marked traced, as the stage loop hands over an input of a traced event.
private func traced(_ input: StageInput) -> StageInput {
    var input = input
    input.trace = sampled
    return input
}

/// The provider requests `result` reports.
private func requests(_ result: StageResult) -> [ProviderRequest] {
    result.notes.compactMap { if case .providerRequest(let request) = $0 { request } else { nil } }
}

/// Answers every job with what its token is given, and tells where it sends.
private struct EndpointTransport: PushTransport {
    let answers: [String: PushAnswer]
    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        for (index, job) in jobs.enumerated() {
            onAnswer(index, answers[job.request.token] ?? .answered(status: 200, reason: nil, timestamp: nil))
        }
    }
    func server(for job: PushJob) -> ServiceEndpoint? { ServiceEndpoint(host: "push.example", port: 8443) }
}

extension SendTests {
    @Test func aTracedInputReportsItsProviderRequestAndAnUntracedOneReportsNone() async throws {
        let transport = ScriptedTransport([
            token("b"): .answered(status: 410, reason: .unregistered, timestamp: 1_731_999_000_000),
            token("c"): .failed(.connectionLost),
        ])
        let send = sendProcessor(transport, MemoryLedger())
        let batch = [
            traced(try outbound(token("a"))), try outbound(token("d")), traced(try outbound(token("b"))),
            traced(try outbound(token("c"), attempt: 2)),
        ]
        let results = await send.process(batch, context: tickingContext())
        #expect(Set(transport.traced) == [token("a"), token("b"), token("c")], "only traced inputs' jobs are traced")

        let delivered = try #require(requests(results[0]).first)
        #expect(requests(results[0]).count == 1)
        #expect(delivered.provider == "apns" && delivered.status == 200 && delivered.failure == nil)
        #expect(delivered.reason == "" && delivered.attempt == 1)
        #expect(delivered.messageID == APNsID.derive(eventID: "e1", token: token("a")), "the request's apns-id")
        #expect(delivered.startNanoseconds < delivered.endNanoseconds, "from the hand-over to the answer")
        #expect(delivered.server == nil, "the scripted transport cannot tell where it sends")

        #expect(requests(results[1]).isEmpty, "an untraced input reports no request")
        #expect(results[1].notes == [.apnsAnswer(status: 200, reason: "")])

        let dead = try #require(requests(results[2]).first)
        #expect(dead.status == 410 && dead.reason == "Unregistered" && dead.failure == "410")
        #expect(dead.startNanoseconds < dead.endNanoseconds)
        #expect(results[2].notes.contains(.tokenDead(reason: "Unregistered")), "the other notes are kept")

        let lost = try #require(requests(results[3]).first)
        #expect(lost.status == nil && lost.failure == "ConnectionLost" && lost.attempt == 2)
    }

    @Test func aRequestThatWasNeverMadeIsNotReportedAndFCMsMessageNameAndTheServerAre() async throws {
        let name = "projects/demo/messages/0:1700000000000000%abc"
        let transport = EndpointTransport(answers: [
            token("a"): .classified(
                status: 200, reason: "", answer: .delivered, retryAfter: nil, messageName: name),
            token("b"): .noCredential("no credential for app1"),
            token("c"): .classified(status: 500, reason: "INTERNAL", answer: .retryable, retryAfter: nil),
        ])
        let send = SendProcessor(
            retryTopic: "herald.retry", tokenFeedbackTopic: "herald.token-feedback", transport: transport,
            ledger: MemoryLedger(), owner: "me", unit: { 0 })
        let batch = try [token("a"), token("b"), token("c")].map { traced(try outbound($0)) }
        let results = await send.process(batch, context: tickingContext())
        let fcm = try #require(requests(results[0]).first)
        #expect(fcm.messageID == name && fcm.status == 200 && fcm.failure == nil)
        #expect(fcm.server == ServiceEndpoint(host: "push.example", port: 8443))
        #expect(requests(results[1]).isEmpty, "no credential: no request was made")
        #expect(results[1].deadLetter?.reason == "no_credential")
        let failed = try #require(requests(results[2]).first)
        #expect(failed.status == 500 && failed.reason == "INTERNAL" && failed.failure == "500")
    }
}
