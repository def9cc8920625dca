import HeraldKafka
import Testing

@Suite("When the consumer fetches, waits or pauses")
struct FetchFlowControlTests {
    let t0 = ContinuousClock.now

    @Test("with room in the buffer it polls and leaves the assignment alone")
    func roomMeansPoll() {
        var flow = FetchFlowControl(capacity: 100)
        #expect(flow.decide(buffered: 0, userPaused: false, now: t0) == .init(pause: nil, fetch: .poll))
        #expect(flow.decide(buffered: 99, userPaused: false, now: t0) == .init(pause: nil, fetch: .poll))
        #expect(!flow.isPaused)
    }

    @Test("a full buffer first waits, and pauses only after the stall time; resumes at half")
    func stallPausesWithHysteresis() {
        var flow = FetchFlowControl(capacity: 100, stallPauseAfter: .seconds(1))
        #expect(flow.decide(buffered: 100, userPaused: false, now: t0) == .init(pause: nil, fetch: .wait))
        #expect(
            flow.decide(buffered: 100, userPaused: false, now: t0 + .milliseconds(999))
                == .init(pause: nil, fetch: .wait))
        #expect(
            flow.decide(buffered: 100, userPaused: false, now: t0 + .seconds(1)) == .init(pause: true, fetch: .poll))
        #expect(flow.isPaused)
        #expect(
            flow.decide(buffered: 60, userPaused: false, now: t0 + .seconds(2)) == .init(pause: nil, fetch: .poll),
            "stays paused above half")
        #expect(
            flow.decide(buffered: 50, userPaused: false, now: t0 + .seconds(3)) == .init(pause: false, fetch: .poll))
        #expect(!flow.isPaused)
    }

    @Test("a buffer drained before the stall time never pauses")
    func briefFullnessDoesNotPause() {
        var flow = FetchFlowControl(capacity: 10, stallPauseAfter: .seconds(1))
        _ = flow.decide(buffered: 10, userPaused: false, now: t0)
        _ = flow.decide(buffered: 3, userPaused: false, now: t0 + .milliseconds(500))
        #expect(
            flow.decide(buffered: 10, userPaused: false, now: t0 + .milliseconds(1200))
                == .init(pause: nil, fetch: .wait),
            "the stall clock restarted when the buffer drained")
    }

    @Test("the caller's pause applies at once and is released only by the caller")
    func userPause() {
        var flow = FetchFlowControl(capacity: 10)
        #expect(flow.decide(buffered: 0, userPaused: true, now: t0) == .init(pause: true, fetch: .poll))
        #expect(flow.decide(buffered: 0, userPaused: true, now: t0 + .seconds(5)) == .init(pause: nil, fetch: .poll))
        #expect(flow.decide(buffered: 0, userPaused: false, now: t0 + .seconds(6)) == .init(pause: false, fetch: .poll))
    }
}
