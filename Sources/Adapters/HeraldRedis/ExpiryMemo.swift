import Synchronization

/// Which keys this process set a TTL on lately, so that a key written by every batch gets its `PEXPIRE` once a
/// minute instead of once a batch.
///
/// Herald's shard keys (send's delivery records, the explain trail's hourly logs) are written only during the
/// window or hour their name holds, and the TTL a first write sets already outlives it (two windows; the
/// retention after the hour): setting it again on later writes changes nothing but Redis's work. The TTL is set
/// again after `refreshMilliseconds` anyway, so a key that lost its TTL (deleted and written again, `FLUSHALL`)
/// gets one within that time. A key counts as set only once the round trip that set it succeeded (`mark`), so a
/// failed write leaves it due.
public final class ExpiryMemo: Sendable {
    /// One key: its kind, app, shard and the window or hour in its name.
    public struct Key: Hashable, Sendable {
        public var kind: UInt8
        public var app: String
        public var shard: UInt64
        public var period: Int64

        public init(kind: UInt8, app: String, shard: UInt64, period: Int64) {
            self.kind = kind
            self.app = app
            self.shard = shard
            self.period = period
        }

        /// Hashed without the app's id: a process's keys are nearly all of one app, and the id's bytes would be
        /// hashed at every lookup (a batch looks up a key per delivery shard it touches).
        public func hash(into hasher: inout Hasher) {
            hasher.combine(kind)
            hasher.combine(shard)
            hasher.combine(period)
        }

        public static func == (a: Key, b: Key) -> Bool {
            a.kind == b.kind && a.shard == b.shard && a.period == b.period && a.app == b.app
        }
    }

    public static let deliveredKind: UInt8 = 1
    public static let explainKind: UInt8 = 2

    /// How long a set TTL is trusted.
    public let refreshMilliseconds: Int64
    /// At most so many keys are remembered; past it the memo starts over (every key due once more).
    public let limit: Int
    private let setAt = Mutex<[Key: Int64]>([:])

    public init(refreshMilliseconds: Int64 = 60_000, limit: Int = 16_384) {
        self.refreshMilliseconds = refreshMilliseconds
        self.limit = limit
    }

    /// Whether `key` needs its TTL set at `now` (never set by this process, or longer ago than the refresh).
    public func isDue(_ key: Key, now: Int64) -> Bool {
        setAt.withLock { known in
            guard let at = known[key] else { return true }
            return now - at >= refreshMilliseconds || now < at
        }
    }

    /// Records that the TTLs of `keys` were set at `now`.
    public func mark(_ keys: [Key], now: Int64) {
        if keys.isEmpty { return }
        setAt.withLock { known in
            if known.count + keys.count > limit { known.removeAll(keepingCapacity: true) }
            for key in keys { known[key] = now }
        }
    }
}
