import HeraldCore
import Synchronization
import Testing

@Suite("Waiting for a signal")
struct WaitListTests {
    @Test("wakeAll wakes a parked waiter; a waiter whose condition already holds does not park")
    func wakes() async {
        let list = WaitList()
        let ready = Flag()
        async let woken = list.wait(timeout: .seconds(60), unlessAlready: { ready.value })
        // Wake only once the waiter is parked (a condition, not a sleep).
        while list.isEmpty { await Task.yield() }
        ready.value = true
        list.wakeAll()
        #expect(await woken)
        #expect(await list.wait(timeout: .seconds(60), unlessAlready: { true }))
    }

    @Test("the deadline ends a wait with false")
    func deadline() async {
        let list = WaitList()
        #expect(await list.wait(timeout: .milliseconds(20), unlessAlready: { false }) == false)
        #expect(list.isEmpty)
    }

    @Test("cancelling the waiting task ends the wait")
    func cancellation() async {
        let list = WaitList()
        let task = Task { await list.wait(timeout: .seconds(60), unlessAlready: { false }) }
        while list.isEmpty { await Task.yield() }
        task.cancel()
        #expect(await task.value == false)
    }

    // An hour-long sleep that ends within minutes ended on the signal, however loaded the machine is.
    @Test("a StopSignal ends a long sleep and answers false from then on", .timeLimit(.minutes(10)))
    func stopSignal() async {
        let signal = StopSignal()
        let clock = ContinuousClock()
        let start = clock.now
        async let slept = signal.sleep(for: .seconds(3600))
        await Task.yield()
        signal.stop()
        #expect(await slept == false)
        #expect(clock.now - start < .seconds(600))
        #expect(await signal.sleep(for: .seconds(3600)) == false)
        #expect(await StopSignal().sleep(for: .milliseconds(1)))
    }
}

/// A Boolean shared between tasks.
final class Flag: Sendable {
    private let stored = Mutex(false)
    var value: Bool {
        get { stored.withLock { $0 } }
        set { stored.withLock { $0 = newValue } }
    }
}
