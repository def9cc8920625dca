import Foundation
import Synchronization

/// Failed authentications per client address: a bucket of `perMinute` failures, refilled evenly over a minute.
/// While an address's bucket is empty, each of its requests is refused (429) before its token is checked, so a
/// client guessing tokens gets no answer about them and costs no more than the head check.
///
/// At most `maxAddresses` addresses are tracked; when the table is full, the addresses whose buckets have
/// refilled are forgotten first, then the oldest entries.
public final class AuthFailureLimiter: Sendable {
    public let perMinute: Int
    public let maxAddresses: Int
    private let now: @Sendable () -> Duration

    private struct Bucket {
        var level: Double
        var updated: Duration
    }

    private let buckets = Mutex<[String: Bucket]>([:])

    /// - Parameters:
    ///   - perMinute: failures allowed per address and minute (the bucket's size); 0 or less: no limit.
    ///   - now: a monotonic clock reading (injected for tests).
    public init(
        perMinute: Int, maxAddresses: Int = 10_000,
        now: @escaping @Sendable () -> Duration = { ContinuousClock.now - AuthFailureLimiter.epoch }
    ) {
        self.perMinute = perMinute
        self.maxAddresses = maxAddresses
        self.now = now
    }

    public static let epoch = ContinuousClock.now

    /// True while the address has no failure left: its requests are refused (429).
    public func isBlocked(_ address: String) -> Bool {
        guard perMinute > 0 else { return false }
        let at = now()
        return buckets.withLock { table in
            guard var bucket = table[address] else { return false }
            refill(&bucket, at: at)
            table[address] = bucket
            return bucket.level < 1
        }
    }

    /// Counts one failed authentication from the address.
    public func recordFailure(_ address: String) {
        guard perMinute > 0 else { return }
        let at = now()
        buckets.withLock { table in
            var bucket = table[address] ?? Bucket(level: Double(perMinute), updated: at)
            refill(&bucket, at: at)
            bucket.level = max(0, bucket.level - 1)
            if table[address] == nil && table.count >= maxAddresses { evict(&table, at: at) }
            table[address] = bucket
        }
    }

    /// Seconds until the address may fail once more (for `Retry-After`), at least 1.
    public func retryAfterSeconds(_ address: String) -> Int {
        guard perMinute > 0 else { return 1 }
        let level = buckets.withLock { $0[address]?.level } ?? Double(perMinute)
        let perSecond = Double(perMinute) / 60
        return max(1, Int(((1 - level) / perSecond).rounded(.up)))
    }

    private func refill(_ bucket: inout Bucket, at: Duration) {
        let elapsed = Double((at - bucket.updated) / .milliseconds(1)) / 1000
        if elapsed > 0 {
            bucket.level = min(Double(perMinute), bucket.level + elapsed * Double(perMinute) / 60)
            bucket.updated = at
        }
    }

    private func evict(_ table: inout [String: Bucket], at: Duration) {
        for (address, var bucket) in table {
            refill(&bucket, at: at)
            if bucket.level >= Double(perMinute) { table[address] = nil }
        }
        while table.count >= maxAddresses, let oldest = table.min(by: { $0.value.updated < $1.value.updated }) {
            table[oldest.key] = nil
        }
    }
}
