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

    @Test("idle: after the idle time it pauses, probes every interval for the window, and the first record ends it")
    func idleBackoff() {
        let policy = FetchFlowControl.IdlePolicy(
            after: .seconds(2), probeInterval: .seconds(1), probeWindow: .milliseconds(30))
        var flow = FetchFlowControl(capacity: 100, idle: policy)
        #expect(flow.decide(buffered: 0, userPaused: false, now: t0) == .init(pause: nil, fetch: .poll))
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: t0 + .milliseconds(1999))
                == .init(pause: nil, fetch: .poll))
        let idleAt = t0 + .seconds(2)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: idleAt)
                == .init(pause: true, fetch: .poll, idleUntil: idleAt + .seconds(1)))
        #expect(flow.isIdle && flow.isPaused)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: idleAt + .milliseconds(500))
                == .init(pause: nil, fetch: .poll, idleUntil: idleAt + .seconds(1)))
        // The probe: resumed for the window, then paused again until the next one.
        let probe = idleAt + .seconds(1)
        #expect(flow.decide(buffered: 0, userPaused: false, now: probe) == .init(pause: false, fetch: .poll))
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: probe + .milliseconds(29))
                == .init(pause: nil, fetch: .poll))
        let after = probe + .milliseconds(30)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: after)
                == .init(pause: true, fetch: .poll, idleUntil: after + .seconds(1)))
        // A record during the next probe: fetching stays on.
        let next = after + .seconds(1)
        #expect(flow.decide(buffered: 0, userPaused: false, now: next) == .init(pause: false, fetch: .poll))
        flow.noteRecords(now: next + .milliseconds(5))
        #expect(!flow.isIdle)
        #expect(
            flow.decide(buffered: 1, userPaused: false, now: next + .milliseconds(500))
                == .init(pause: nil, fetch: .poll))
        // Records still buffered (a slow caller) count as activity: no idle pause while they wait.
        #expect(
            flow.decide(buffered: 1, userPaused: false, now: next + .seconds(5)) == .init(pause: nil, fetch: .poll))
        #expect(!flow.isIdle)
    }

    @Test("idle: the caller's pause holds through probes, and without a policy nothing idles")
    func idleRespectsUserPause() {
        var flow = FetchFlowControl(
            capacity: 10,
            idle: .init(after: .milliseconds(100), probeInterval: .milliseconds(100), probeWindow: .milliseconds(10)))
        #expect(flow.decide(buffered: 0, userPaused: true, now: t0) == .init(pause: true, fetch: .poll))
        _ = flow.decide(buffered: 0, userPaused: true, now: t0 + .milliseconds(100))
        #expect(flow.isIdle)
        let probe = flow.decide(buffered: 0, userPaused: true, now: t0 + .milliseconds(200))
        #expect(probe.pause == nil && flow.isPaused, "a probe does not resume what the caller paused")
        var plain = FetchFlowControl(capacity: 10)
        #expect(
            plain.decide(buffered: 0, userPaused: false, now: t0 + .seconds(3600)) == .init(pause: nil, fetch: .poll))
        #expect(!plain.isIdle)
    }
}
