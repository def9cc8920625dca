// herald_in_flight is the sum over a stage's lanes; each lane's loop sets its own value as batches start and complete.
import Dispatch
import Foundation
import Synchronization
import Testing

@testable import HeraldStage

@Suite("herald_in_flight over lanes")
struct InFlightGaugeTests {
    @Test(
        "a lane's new sum is published before another lane can change its value, so the last sum published is current")
    func sumsArePublishedInOrder() {
        let totals = LaneTotals()
        let published = Mutex<[Int]>([])
        let bulkPublishing = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let priorityDone = DispatchSemaphore(value: 0)
        Thread {
            totals.set("bulk", 5) { sum in
                bulkPublishing.signal()
                release.wait()
                published.withLock { $0.append(sum) }
            }
        }.start()
        bulkPublishing.wait()
        Thread {
            totals.set("priority", 3) { sum in published.withLock { $0.append(sum) } }
            priorityDone.signal()
        }.start()
        // While the bulk lane publishes, the priority lane's set waits. (On a busy host the priority thread may not
        // even have started within the wait: the check then passes without having tested anything, never fails.)
        let finishedMeanwhile = priorityDone.wait(timeout: .now() + .milliseconds(300)) == .success
        #expect(!finishedMeanwhile, "the priority lane published while the bulk lane was publishing")
        release.signal()
        if !finishedMeanwhile { priorityDone.wait() }
        // The bulk lane's sum last only once both threads are done publishing.
        while published.withLock({ $0.count }) < 2 { usleep(1_000) }
        #expect(published.withLock { $0 } == [5, 8])
    }
}
