// The pure APNs answer table, backoff and JWT renewal policy (HeraldCore/APNs).
import Foundation
import HeraldCore
import Testing

struct AnswerTableTests {
    struct Row: Sendable, CustomStringConvertible {
        let status: Int
        let reason: String?
        let expected: PushAnswerClass
        var description: String { "\(status) \(reason ?? "-")" }
    }

    /// One row per status and reason in Apple's "Handling notification responses from APNs".
    static let documented: [Row] = [
        Row(status: 200, reason: nil, expected: .delivered),
        Row(status: 400, reason: "BadCollapseId", expected: .permanent),
        Row(status: 400, reason: "BadDeviceToken", expected: .tokenDead(unregisteredAt: nil)),
        Row(status: 400, reason: "BadExpirationDate", expected: .permanent),
        Row(status: 400, reason: "BadMessageId", expected: .permanent),
        Row(status: 400, reason: "BadPriority", expected: .permanent),
        Row(status: 400, reason: "BadTopic", expected: .permanent),
        Row(status: 400, reason: "DeviceTokenNotForTopic", expected: .tokenDead(unregisteredAt: nil)),
        Row(status: 400, reason: "DuplicateHeaders", expected: .permanent),
        Row(status: 400, reason: "IdleTimeout", expected: .retryable),
        Row(status: 400, reason: "InvalidPushType", expected: .permanent),
        Row(status: 400, reason: "MissingDeviceToken", expected: .permanent),
        Row(status: 400, reason: "MissingTopic", expected: .permanent),
        Row(status: 400, reason: "PayloadEmpty", expected: .permanent),
        Row(status: 400, reason: "TopicDisallowed", expected: .permanent),
        Row(status: 403, reason: "BadCertificate", expected: .permanent),
        Row(status: 403, reason: "BadCertificateEnvironment", expected: .permanent),
        Row(status: 403, reason: "ExpiredProviderToken", expected: .renewCredentials),
        Row(status: 403, reason: "Forbidden", expected: .permanent),
        Row(status: 403, reason: "InvalidProviderToken", expected: .permanent),
        Row(status: 403, reason: "MissingProviderToken", expected: .permanent),
        Row(status: 403, reason: "UnrelatedKeyIdInToken", expected: .permanent),
        Row(status: 403, reason: "BadEnvironmentKeyIdInToken", expected: .permanent),
        Row(status: 404, reason: "BadPath", expected: .permanent),
        Row(status: 405, reason: "MethodNotAllowed", expected: .permanent),
        Row(status: 410, reason: "ExpiredToken", expected: .tokenDead(unregisteredAt: 1_732_000_000_123)),
        Row(status: 410, reason: "Unregistered", expected: .tokenDead(unregisteredAt: 1_732_000_000_123)),
        Row(status: 413, reason: "PayloadTooLarge", expected: .permanent),
        Row(status: 429, reason: "TooManyProviderTokenUpdates", expected: .retryable),
        Row(status: 429, reason: "TooManyRequests", expected: .retryable),
        Row(status: 500, reason: "InternalServerError", expected: .retryable),
        Row(status: 503, reason: "ServiceUnavailable", expected: .retryable),
        Row(status: 503, reason: "Shutdown", expected: .retryable),
    ]

    @Test("every documented status and reason maps to its disposition class", arguments: documented)
    func documentedRow(_ row: Row) {
        let reason = row.reason.map(APNsReason.init(wire:))
        if let reason { #expect(reason.wire == row.reason, "reason round-trips through its wire spelling") }
        if case .unknown = reason { Issue.record("\(row.reason ?? "") should be a known reason") }
        let ts: Int64? = row.status == 410 ? 1_732_000_000_123 : nil
        #expect(APNsAnswerTable.classify(status: row.status, reason: reason, timestamp: ts) == row.expected)
    }

    @Test func unknownReasonIsKeptAsText() {
        let r = APNsReason(wire: "SomethingNew")
        #expect(r == .unknown("SomethingNew"))
        #expect(r.wire == "SomethingNew")
        #expect(APNsAnswerTable.classify(status: 400, reason: r, timestamp: nil) == .permanent)
        #expect(APNsAnswerTable.classify(status: 502, reason: r, timestamp: nil) == .retryable)
        #expect(APNsAnswerTable.classify(status: 418, reason: nil, timestamp: nil) == .permanent)
    }

    @Test func transportFailures() {
        #expect(APNsAnswerTable.classify(.connectionLost) == .retryable)
        #expect(APNsAnswerTable.classify(.connectFailed("refused")) == .retryable)
        #expect(APNsAnswerTable.classify(.streamReset(errorCode: 2)) == .retryable)
        #expect(APNsAnswerTable.classify(.deadlineExceeded) == .permanent)
        #expect(APNsAnswerTable.classify(.credentialUnusable("bad key")) == .permanent)
    }

    @Test func backoffGrowsExponentiallyAndIsCapped() {
        let p = BackoffPolicy(
            initialDelay: .milliseconds(100), maxDelay: .seconds(1), multiplier: 2, jitter: 0, maxAttempts: 10)
        #expect(p.delay(afterAttempt: 1, unit: 0.7) == .milliseconds(100))
        #expect(p.delay(afterAttempt: 2, unit: 0.7) == .milliseconds(200))
        #expect(p.delay(afterAttempt: 4, unit: 0.7) == .milliseconds(800))
        #expect(p.delay(afterAttempt: 5, unit: 0.7) == .seconds(1))
        #expect(p.delay(afterAttempt: 60, unit: 0.7) == .seconds(1))
    }

    @Test func jitterStaysWithinItsFraction() {
        let p = BackoffPolicy(initialDelay: .milliseconds(400), maxDelay: .seconds(10), jitter: 0.5)
        #expect(p.delay(afterAttempt: 1, unit: 0) == .milliseconds(400))
        #expect(p.delay(afterAttempt: 1, unit: 0.5) == .milliseconds(300))
        var rng = SystemRandomNumberGenerator()
        var seen = Set<Duration>()
        for _ in 0..<200 {
            let d = p.delay(afterAttempt: 1, using: &rng)
            #expect(d > .milliseconds(200) && d <= .milliseconds(400))
            seen.insert(d)
        }
        #expect(seen.count > 10, "jitter spreads the delays")
    }

    @Test func attemptsAreBounded() {
        let p = BackoffPolicy(initialDelay: .milliseconds(100), jitter: 0, maxAttempts: 3)
        #expect(
            p.disposition(for: .retryable, reasonText: "TooManyRequests", attempt: 1, unit: 0)
                == .retry(after: .milliseconds(100)))
        #expect(
            p.disposition(for: .retryable, reasonText: "TooManyRequests", attempt: 2, unit: 0)
                == .retry(after: .milliseconds(200)))
        #expect(
            p.disposition(for: .retryable, reasonText: "TooManyRequests", attempt: 3, unit: 0)
                == .permanentFailure(reason: "TooManyRequests after 3 attempts"))
        #expect(
            p.disposition(for: .tokenDead(unregisteredAt: 5), reasonText: "Unregistered", attempt: 3, unit: 0)
                == .tokenDead(unregisteredAt: 5))
        #expect(
            p.disposition(for: .permanent, reasonText: "BadTopic", attempt: 1, unit: 0)
                == .permanentFailure(reason: "BadTopic"))
        #expect(p.disposition(for: .delivered, reasonText: "", attempt: 1, unit: 0) == .delivered)
        #expect(
            p.disposition(for: .renewCredentials, reasonText: "ExpiredProviderToken", attempt: 1, unit: 0)
                == .renewCredentials)
    }

    @Test func renewalPolicyRenewsAfterFiftyMinutesNeverWithinTwenty() {
        let policy = APNsTokenRenewalPolicy()
        let t0 = Date(timeIntervalSince1970: 1_732_000_000)
        #expect(policy.decide(issuedAt: nil, now: t0) == .renew)
        #expect(policy.decide(issuedAt: t0, now: t0 + 49 * 60) == .keep)
        #expect(policy.decide(issuedAt: t0, now: t0 + 50 * 60) == .renew)
        #expect(policy.decide(issuedAt: t0, now: t0 + 19 * 60, rejectedAsExpired: true) == .keep)
        #expect(policy.decide(issuedAt: t0, now: t0 + 20 * 60, rejectedAsExpired: true) == .renew)
        #expect(policy.decide(issuedAt: t0, now: t0 + 30 * 60, rejectedAsExpired: false) == .keep)
    }
}
