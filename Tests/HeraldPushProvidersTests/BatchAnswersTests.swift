// A batch's answers handed from a client's I/O thread to the task that sent the batch (`answers(for:each:)`).
import Foundation
import HeraldCore
import Synchronization
import Testing

@testable import HeraldPushProviders

/// A client that answers from a thread of its own, in an order of its choosing, and accepts at most `window`
/// requests at a time: `submit` waits for room, as the real clients do at `maxInFlight`.
final class ThreadedFakeClient: BatchPushClient {
    let window: Int
    private let pending = Mutex<[(PushDelivery, @Sendable (PushResponse) -> Void)]>([])
    private let room: DispatchSemaphore

    init(window: Int) {
        self.window = window
        room = DispatchSemaphore(value: window)
    }

    func submit(_ requests: [PushDelivery], onComplete: @escaping @Sendable (PushResponse) -> Void) async {
        for request in requests {
            // Waits for room on a thread of its own, so the cooperative pool stays free.
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                Thread.detachNewThread {
                    self.room.wait()
                    c.resume()
                }
            }
            pending.withLock { $0.append((request, onComplete)) }
            Thread.detachNewThread { self.answerOne() }
        }
    }

    /// Answers one pending request, picked at random, with a pause now and then so that answers arrive both
    /// while the taker waits and while it is busy.
    private func answerOne() {
        if Bool.random() { usleep(UInt32.random(in: 0...300)) }
        guard
            let (request, onComplete) = pending.withLock({ p -> (PushDelivery, @Sendable (PushResponse) -> Void)? in
                p.isEmpty ? nil : p.remove(at: Int.random(in: 0..<p.count))
            })
        else { return }
        room.signal()
        onComplete(.delivered(request.tag))
    }
}

extension PushResponse {
    /// A 200 for request `tag`.
    static func delivered(_ tag: UInt64) -> PushResponse {
        PushResponse(
            tag: tag, status: 200, reason: nil, apnsID: nil, unregisteredAt: nil, transportFailure: nil,
            disposition: .delivered, attempts: 1)
    }
}

@Suite("A batch's answers, from the client's thread to the sending task")
struct BatchAnswersTests {
    static func requests(_ n: Int) -> [PushDelivery] {
        (0..<n).map { PushDelivery(deviceToken: "t\($0)", topic: "com.example", payload: [], tag: UInt64($0)) }
    }

    @Test(
        "every request's answer is handed over exactly once, and the call returns after the last",
        arguments: [1, 7, 500])
    func everyAnswerOnce(count: Int) async {
        let client = ThreadedFakeClient(window: 16)
        var seen = [Int](repeating: 0, count: count)
        var calls = 0
        await client.answers(for: Self.requests(count)) { response in
            seen[Int(response.tag)] += 1
            calls += 1
        }
        #expect(calls == count)
        #expect(seen.allSatisfy { $0 == 1 }, "answers per tag: \(seen.enumerated().filter { $0.element != 1 })")
    }

    @Test("an empty batch returns at once")
    func emptyBatch() async {
        var calls = 0
        await ThreadedFakeClient(window: 1).answers(for: []) { _ in calls += 1 }
        #expect(calls == 0)
    }

    @Test("the stream form yields the same answers and finishes")
    func streamForm() async {
        var tags: [UInt64] = []
        for await response in ThreadedFakeClient(window: 4).responses(for: Self.requests(50)) {
            tags.append(response.tag)
        }
        #expect(tags.sorted() == (0..<50).map(UInt64.init))
    }

    @Test("the inbox hands over what arrived before it was asked, then waits, then reports the end")
    func inboxOrder() async {
        let inbox = ResponseInbox(expecting: 3)
        inbox.put(.delivered(0))
        inbox.put(.delivered(1))
        #expect(await inbox.take().map(\.tag) == [0, 1])
        // The taker waits; the last answer wakes it.
        async let next = inbox.take()
        Thread.detachNewThread {
            usleep(20_000)
            inbox.put(.delivered(2))
        }
        #expect(await next.map(\.tag) == [2])
        #expect(await inbox.take().isEmpty)
    }
}
