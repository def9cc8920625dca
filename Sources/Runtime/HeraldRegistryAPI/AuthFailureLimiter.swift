import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Failed authentications per client address: a bucket of `perMinute` failures, refilled evenly over a minute.
/// While an address's bucket is empty, each of its requests is refused (429) before its token is checked, so a
/// client guessing tokens gets no answer about them and costs no more than the head check.
///
/// An IPv6 client counts by its /64 network, the block one host or one customer line gets, so an attacker cannot
/// take a fresh bucket with each of its addresses (an IPv4-mapped address counts as its IPv4 address). At most
/// `maxAddresses` clients are tracked; when the table is full, the clients whose buckets have refilled are
/// forgotten first, then the oldest half, in one pass (a full table costs one sort per `maxAddresses / 2` new
/// clients, not a scan per failure).
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
        let address = Self.client(address)
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
        let address = Self.client(address)
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
        let address = Self.client(address)
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

    /// Tracked clients now (for tests).
    public var trackedClients: Int { buckets.withLock { $0.count } }

    private func evict(_ table: inout [String: Bucket], at: Duration) {
        for (address, var bucket) in table {
            refill(&bucket, at: at)
            if bucket.level >= Double(perMinute) { table[address] = nil }
        }
        guard table.count >= maxAddresses else { return }
        let oldest = table.sorted { $0.value.updated < $1.value.updated }.prefix(max(1, table.count / 2))
        for (address, _) in oldest { table[address] = nil }
    }

    /// The key a client's failures are counted under: an IPv4 address as it is, an IPv6 address's /64 network
    /// (`2001:db8:1:2::/64`), an IPv4-mapped IPv6 address as its IPv4 address; anything else as given.
    public static func client(_ address: String) -> String {
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, address, &v6) == 1 else { return address }
        let bytes = withUnsafeBytes(of: v6) { Array($0) }
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xff && bytes[11] == 0xff {
            return bytes[12..<16].map(String.init).joined(separator: ".")
        }
        let groups = stride(from: 0, to: 8, by: 2).map {
            String(UInt16(bytes[$0]) << 8 | UInt16(bytes[$0 + 1]), radix: 16)
        }
        return groups.joined(separator: ":") + "::/64"
    }
}
