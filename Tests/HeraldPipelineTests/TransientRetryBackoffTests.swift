import Foundation
import HeraldPipeline
import Testing

@Suite("Transient retry waits")
struct TransientRetryBackoffTests {
    @Test("a transient failure waits 50 ms doubling to 2 s, as the hand-written loop did")
    func retryWaits() {
        var handWritten = Duration.milliseconds(50)
        for failures in 1...20 {
            #expect(BatchContext.transientRetryBackoff.delay(afterAttempt: failures, unit: 0) == handWritten)
            #expect(BatchContext.transientRetryBackoff.delay(afterAttempt: failures, unit: 0.7) == handWritten)
            handWritten = min(handWritten * 2, .seconds(2))
        }
        #expect(BatchContext.transientRetryBackoff.delay(afterAttempt: 6, unit: 0) == .milliseconds(1600))
        #expect(BatchContext.transientRetryBackoff.delay(afterAttempt: 7, unit: 0) == .seconds(2))
    }
}
