import Foundation
import HeraldCore
import Testing

@testable import HeraldPushProviders

@Suite("FCM access token retry waits")
struct FCMTokenBackoffTests {
    @Test("after n failed fetches the renewal waits 200 ms × 2^n, at most 30 s, as the hand-written wait did")
    func retryWaits() {
        for failures in 1...40 {
            let handWritten = Duration.milliseconds(min(30_000, 200 * (1 << min(failures, 8))))
            #expect(FCMAccessTokens.retryBackoff.delay(afterAttempt: failures, unit: 0) == handWritten)
        }
        #expect(FCMAccessTokens.retryBackoff.delay(afterAttempt: 1, unit: 0) == .milliseconds(400))
        #expect(FCMAccessTokens.retryBackoff.delay(afterAttempt: 7, unit: 0) == .milliseconds(25_600))
        #expect(FCMAccessTokens.retryBackoff.delay(afterAttempt: 8, unit: 0) == .seconds(30))
        // Not randomised: the unit makes no difference.
        #expect(FCMAccessTokens.retryBackoff.delay(afterAttempt: 3, unit: 0.99) == .milliseconds(1600))
    }
}
