import Foundation
import HeraldCore
import Synchronization

/// Claim numbers: what send writes into a pair's delivery record when it claims the pair (`StateStore.claim`).
///
/// A send process takes its numbers in blocks of `perBlock`, a block picked at random and held through its key
/// (`RedisKeys.claimBlock`): 8 bytes holding when the block's claims lapse, then one bit per number. Confirming
/// deliveries sets their numbers' bits, one `BITFIELD` per block for every pair confirmed at once, where a `1`
/// written into each pair's field would cost a command per shard hash touched. So a pair's record is written once, by the claim, and stays a number:
/// - its bit set: delivered;
/// - its bit clear: a claim, held until the block's lapse time (a process takes a new block at least every
///   `lifetime(claimTTL:)`, so a claim lapses at most that long plus the claim TTL after it was written);
/// - its block key gone (older than the records it served, or deleted): a claim that lapsed.
enum ClaimNumbers {
    /// Numbers per block.
    static let perBlock: Int64 = 4096
    /// Blocks are numbered 1...blockCount, so a number is at least `perBlock` (never the `1` of a plain record) and
    /// below 2^31, which Redis keeps as an integer of at most 4 bytes in a hash's listpack. A block whose key still
    /// exists is in use, so at most this many are held at once per app: a claiming process takes one every 10 s or
    /// every 4,096 claims, whichever comes first, and a key lives `keyTTL` (2 h 13 min at the default window).
    static let blockCount: Int64 = (1 << 19) - 1
    /// The bits before a block's first number: its lapse time.
    static let headerBits: Int64 = 64

    /// How long a process hands out one block's numbers: 10 s, or the claim TTL when that is shorter.
    static func lifetime(claimTTL: Int64) -> Int64 { max(1, min(10_000, claimTTL)) }

    /// How long a block's key is kept (ms): longer than the delivery records that hold its numbers are read (two
    /// replay windows from their claim).
    static func keyTTL(window: Int64, claimTTL: Int64) -> Int64 { 2 * window + 2 * claimTTL + 600_000 }

    static func block(of number: Int64) -> Int64 { number / perBlock }

    /// The bit offset of a number in its block's key.
    static func bit(of number: Int64) -> Int64 { headerBits + number % perBlock }

    /// A stored value as a claim number; nil for a record `1`, a `p:<owner>:<until>` claim of an earlier release,
    /// or anything else.
    static func parse(_ value: RedisValue) -> Int64? {
        guard case .string(let data) = value, data.count >= 4, data.count <= 10 else { return nil }
        var n: Int64 = 0
        for byte in data {
            guard byte >= 48, byte <= 57 else { return nil }
            n = n * 10 + Int64(byte - 48)
        }
        guard n >= perBlock, n < perBlock * (blockCount + 1), data.first != 48 else { return nil }
        return n
    }

    /// A block's key value when it is taken: its lapse time, big-endian.
    static func header(lapsesAt: Int64) -> [UInt8] {
        withUnsafeBytes(of: UInt64(bitPattern: lapsesAt).bigEndian) { Array($0) }
    }
}

/// The blocks of claim numbers a store has taken (per app and owner), and the number each pair it claimed holds,
/// until that pair is confirmed or released.
final class ClaimNumberSource: Sendable {
    struct Owner: Hashable {
        var app: String
        var owner: String
    }

    private struct Lease {
        var block: Int64
        var next: Int64
        var takenAt: Int64
        var claimTTL: Int64
    }

    /// One owner's claim of a pair: its number, and when it was taken.
    struct Held {
        var owner: String
        var number: Int64
        var at: Int64
    }

    /// The claims of one pair: one, unless two owners of this store took the pair in turn (kept inline, so the
    /// common pair costs no array of its own).
    struct PairClaims {
        var first: Held
        var more: [Held] = []

        init(_ first: Held) { self.first = first }

        /// Notes `claim`, in place of the same owner's earlier one.
        mutating func put(_ claim: Held) {
            if first.owner == claim.owner {
                first = claim
            } else if let index = more.firstIndex(where: { $0.owner == claim.owner }) {
                more[index] = claim
            } else {
                more.append(claim)
            }
        }

        /// Every claim, the first one first.
        var all: [Held] { [first] + more }

        /// Whether any claim was taken after `time`.
        func anyAfter(_ time: Int64) -> Bool { first.at > time || more.contains { $0.at > time } }

        /// Takes `owner`'s claim out; nil when it has none. `empty` tells whether no claim is left.
        mutating func take(_ owner: String) -> (number: Int64, empty: Bool)? {
            if first.owner == owner {
                let number = first.number
                if more.isEmpty { return (number, true) }
                first = more.removeFirst()
                return (number, false)
            }
            guard let index = more.firstIndex(where: { $0.owner == owner }) else { return nil }
            return (more.remove(at: index).number, false)
        }
    }

    /// A pair of one app. Hashed by the pair's hash alone (taken once, when the pair was made): hashing the app's
    /// id too cost a pass over its bytes at every lookup, and a store's pairs are nearly all of one app.
    private struct PairKey: Hashable {
        var app: String
        var pair: DeliveryPair

        static func == (a: PairKey, b: PairKey) -> Bool { a.pair == b.pair && a.app == b.app }
        func hash(into hasher: inout Hasher) { pair.hash(into: &hasher) }
    }

    private struct State {
        var leases: [Owner: Lease] = [:]
        /// Blocks each owner took, with when: a number of one of them (bit clear) is this owner's own claim.
        var mine: [Owner: [Int64: Int64]] = [:]
        /// The claims of each pair.
        var held: [PairKey: PairClaims] = [:]
    }

    private let state = Mutex(State())

    /// Up to `count` numbers of the owner's current block: fewer (maybe none) when it runs out, was taken more than
    /// its lifetime before `now`, or for another claim TTL.
    func take(_ owner: Owner, count: Int, claimTTL: Int64, now: Int64) -> [Int64] {
        state.withLock { s in
            guard var lease = s.leases[owner], lease.claimTTL == claimTTL,
                now < lease.takenAt + ClaimNumbers.lifetime(claimTTL: claimTTL)
            else { return [] }
            let n = Int(min(Int64(count), ClaimNumbers.perBlock - lease.next))
            let first = lease.block * ClaimNumbers.perBlock + lease.next
            lease.next += Int64(n)
            s.leases[owner] = lease
            return (0..<n).map { first + Int64($0) }
        }
    }

    /// Makes a block the owner's current one.
    func install(_ owner: Owner, block: Int64, claimTTL: Int64, takenAt: Int64, keepFor: Int64) {
        state.withLock { s in
            s.leases[owner] = Lease(block: block, next: 0, takenAt: takenAt, claimTTL: claimTTL)
            var blocks = s.mine[owner, default: [:]]
            if blocks.count > 64 { blocks = blocks.filter { $0.value > takenAt - keepFor } }
            blocks[block] = takenAt
            s.mine[owner] = blocks
        }
    }

    /// Whether the number is from a block this owner took.
    func isMine(_ owner: Owner, number: Int64) -> Bool {
        state.withLock { $0.mine[owner]?[ClaimNumbers.block(of: number)] != nil }
    }

    /// Notes the number each pair's claim of `owner` holds.
    func hold(app: String, owner: String, _ claims: [(DeliveryPair, Int64)], now: Int64) {
        if claims.isEmpty { return }
        state.withLock { s in
            // Claims are let go by confirm or release; what neither reached (a process that gave up on a batch)
            // is dropped once the map is large and the claim an hour old.
            if s.held.count > 100_000 { s.held = s.held.filter { $0.value.anyAfter(now - 3_600_000) } }
            for (pair, number) in claims {
                let claim = Held(owner: owner, number: number, at: now)
                let key = PairKey(app: app, pair: pair)
                // Most pairs are new here: one lookup, and no closure for a default value (`[key, default:]`
                // allocates one per call).
                if var earlier = s.held.updateValue(PairClaims(claim), forKey: key) {
                    earlier.put(claim)
                    s.held[key] = earlier
                }
            }
        }
    }

    /// The claims of each pair, whoever of this store's owners took them (confirm: whoever held the claim), and
    /// lets them go; nil for a pair this store did not claim.
    func letGo(app: String, _ pairs: [DeliveryPair]) -> [PairClaims?] {
        state.withLock { s in pairs.map { s.held.removeValue(forKey: PairKey(app: app, pair: $0)) } }
    }

    /// The number `owner`'s claim of each pair holds (nil: none through this store), and lets it go.
    func letGo(app: String, owner: String, _ pairs: [DeliveryPair]) -> [Int64?] {
        state.withLock { s in
            pairs.map { pair in
                let key = PairKey(app: app, pair: pair)
                guard var claims = s.held[key], let taken = claims.take(owner) else { return nil }
                s.held[key] = taken.empty ? nil : claims
                return taken.number
            }
        }
    }

    /// Holds what `letGo(app:_:)` took again (a confirmation that failed is tried again with the same numbers).
    func restore(app: String, _ pairs: [DeliveryPair], _ taken: [PairClaims?]) {
        state.withLock { s in
            for (pair, claims) in zip(pairs, taken) {
                guard let claims else { continue }
                let key = PairKey(app: app, pair: pair)
                guard var current = s.held[key] else {
                    s.held[key] = claims
                    continue
                }
                current.more += claims.all
                s.held[key] = current
            }
        }
    }
}
