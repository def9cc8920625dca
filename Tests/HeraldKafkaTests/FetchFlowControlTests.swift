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

    @Test("idle: after the idle time it pauses and probes at once and then every interval; a wake resumes at once")
    func idleBackoff() {
        let policy = FetchFlowControl.IdlePolicy(after: .seconds(2), probeInterval: .seconds(1))
        var flow = FetchFlowControl(capacity: 100, idle: policy)
        #expect(flow.decide(buffered: 0, userPaused: false, now: t0) == .init(pause: nil, fetch: .poll))
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: t0 + .milliseconds(1999))
                == .init(pause: nil, fetch: .poll))
        let idleAt = t0 + .seconds(2)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: idleAt)
                == .init(pause: true, fetch: .poll, probe: true, idleUntil: idleAt + .seconds(1)))
        #expect(flow.isIdle && flow.isPaused)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: idleAt + .milliseconds(500))
                == .init(pause: nil, fetch: .poll, idleUntil: idleAt + .seconds(1)))
        // The next probe, one interval later; still paused (a probe asks for end offsets, it does not fetch).
        let probe = idleAt + .seconds(1)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: probe)
                == .init(pause: nil, fetch: .poll, probe: true, idleUntil: probe + .seconds(1)))
        // The probe found records waiting: the next decision resumes fetching, and it stays on.
        flow.wake(now: probe + .milliseconds(3))
        #expect(!flow.isIdle)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: probe + .milliseconds(4))
                == .init(pause: false, fetch: .poll))
        flow.noteRecords(now: probe + .milliseconds(20))
        #expect(
            flow.decide(buffered: 1, userPaused: false, now: probe + .milliseconds(500))
                == .init(pause: nil, fetch: .poll))
        // Records still buffered (a slow caller) count as activity: no idle pause while they wait.
        #expect(
            flow.decide(buffered: 1, userPaused: false, now: probe + .seconds(5)) == .init(pause: nil, fetch: .poll))
        #expect(!flow.isIdle)
        // Idle again two seconds after the buffer emptied.
        let again = probe + .seconds(7)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: again)
                == .init(pause: true, fetch: .poll, probe: true, idleUntil: again + .seconds(1)))
    }

    @Test("idle: a caller's pause is not idleness, and without a policy nothing idles")
    func idleRespectsUserPause() {
        var flow = FetchFlowControl(
            capacity: 10, idle: .init(after: .milliseconds(100), probeInterval: .milliseconds(100)))
        #expect(flow.decide(buffered: 0, userPaused: true, now: t0) == .init(pause: true, fetch: .poll))
        #expect(
            flow.decide(buffered: 0, userPaused: true, now: t0 + .seconds(10)) == .init(pause: nil, fetch: .poll))
        #expect(!flow.isIdle, "a paused caller's consumer measures its lag the paused way, not by probes")
        // Resumed: idle only after the idle time without records.
        let resumed = t0 + .seconds(11)
        #expect(flow.decide(buffered: 0, userPaused: false, now: resumed) == .init(pause: false, fetch: .poll))
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: resumed + .milliseconds(100))
                == .init(pause: true, fetch: .poll, probe: true, idleUntil: resumed + .milliseconds(200)))
        // Paused by the caller while idle: stays paused; the probes go on until one finds records.
        #expect(
            flow.decide(buffered: 0, userPaused: true, now: resumed + .milliseconds(150))
                == .init(pause: nil, fetch: .poll, idleUntil: resumed + .milliseconds(200)))
        var plain = FetchFlowControl(capacity: 10)
        #expect(
            plain.decide(buffered: 0, userPaused: false, now: t0 + .seconds(3600)) == .init(pause: nil, fetch: .poll))
        #expect(!plain.isIdle)
    }

    @Test("idle: a sibling consumer's records keep a consumer from idling, and end its idle state")
    func sharedActivity() {
        let policy = FetchFlowControl.IdlePolicy(after: .seconds(1), probeInterval: .seconds(2))
        var flow = FetchFlowControl(capacity: 100, idle: policy)
        #expect(flow.decide(buffered: 0, userPaused: false, now: t0) == .init(pause: nil, fetch: .poll))
        // Nothing of its own for 1.5 s, but its sibling had records 0.8 s in: not idle yet.
        let sibling = t0 + .milliseconds(800)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: t0 + .milliseconds(1500), shared: sibling)
                == .init(pause: nil, fetch: .poll))
        #expect(!flow.isIdle)
        // Idle once neither had records for the idle time.
        let idleAt = sibling + .seconds(1)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: idleAt, shared: sibling)
                == .init(pause: true, fetch: .poll, probe: true, idleUntil: idleAt + .seconds(2)))
        // The sibling's next records resume it at once, without a probe or a wake.
        let busy = idleAt + .milliseconds(300)
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: busy + .milliseconds(5), shared: busy)
                == .init(pause: false, fetch: .poll))
        #expect(!flow.isIdle)
        // An older shared time than its own activity changes nothing.
        #expect(
            flow.decide(buffered: 0, userPaused: false, now: busy + .milliseconds(900), shared: t0)
                == .init(pause: nil, fetch: .poll))
    }
}
