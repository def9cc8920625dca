import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import Testing

@testable import HeraldStage

#if canImport(Glibc)
import Glibc
#endif

/// Records the priority its `run` saw and the nice value of the thread it ran on.
private final class Probe: Service, @unchecked Sendable {
    let seen = Mutex<(TaskPriority, Int32)?>(nil)
    func run() async throws {
        let nice = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        seen.withLock { $0 = (Task.currentPriority, nice) }
    }
}

@Suite("Lanes: the bulk lane's work runs at low priority")
struct LanePriorityTests {
    @Test("a service run at utility priority stays there though a task of higher priority waits for it")
    func noEscalation() async throws {
        let probe = Probe()
        let waiter = Task(priority: .medium) {
            try await PrioritizedService(inner: probe, priority: .utility).run()
        }
        try await waiter.value
        let seen = try #require(probe.seen.withLock { $0 })
        #expect(seen.0 == .utility, "ran at \(seen.0)")
    }

    @Test("the utility pool's threads get the configured nice value")
    func niceThreads() async throws {
        // Make sure the utility pool has a thread, and keep it busy while the service looks.
        let spin = Task.detached(priority: .utility) {
            while !Task.isCancelled { try? await Task.sleep(for: .milliseconds(5)) }
        }
        defer { spin.cancel() }
        try await Task.sleep(for: .milliseconds(50))
        #expect(!BulkThreadNice.threads(named: "utility-qos").isEmpty)

        let nicer = Task { try await BulkThreadNice(nice: 7, logger: Logger(label: "test")).run() }
        defer { nicer.cancel() }
        // The scanner runs every second; with suites running in parallel the pool keeps making threads, so give it
        // time to catch up with every one of them.
        let deadline = ContinuousClock.now + .seconds(60)
        var values: [Int32] = []
        while ContinuousClock.now < deadline {
            values = BulkThreadNice.threads(named: "utility-qos").map {
                getpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t($0))
            }
            if !values.isEmpty && values.allSatisfy({ $0 == 7 }) { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(!values.isEmpty && values.allSatisfy { $0 == 7 }, "nice values \(values)")
        // Threads of other pools are left alone.
        let others = BulkThreadNice.threads(named: "default-qos").map {
            getpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t($0))
        }
        #expect(!others.contains(7))
    }
}
