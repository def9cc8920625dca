import Foundation
import HeraldCore
import Synchronization

// Send's claims on (event, token) pairs: claiming, confirming and releasing them in Redis (`StateStore`), what a
// claim found (`DeliveryClaim`), the claim numbers a record holds (`ClaimNumbers`, `ClaimNumberSource`) and the
// scripts that change a record.

extension StateStore {
    /// How long a delivery record is kept by default: a copy of a pair replayed within this long after its
    /// delivery is never sent again (the pipeline file's `idempotency.replay_window_seconds`).
    public static let defaultReplayWindowMilliseconds: Int64 = 3_600_000

    /// Claims each (event, token) pair for sending. A pair's record is a field of its shard's hash for one replay
    /// window (`RedisKeys.delivered`): the window its event time falls in when the pair carries one
    /// (`DeliveryPair.eventTime`; every copy of the pair then looks in that hash alone, whenever it is sent), else
    /// the window `now` falls in, and then the previous window's hash is read too. The field's value is one of
    /// `owner`'s claim numbers (`ClaimNumbers`); `confirmDelivered` sets the number's bit in its block's key, and
    /// the record stays as it is. The answer per pair, in order:
    /// - `.claimed`: this call took it (or it was already this owner's): send;
    /// - `.delivered`: a delivery record is there (a number whose bit is set, or `1`): do not send again;
    /// - `.pending(owner:until:)`: another owner's claim that has not lapsed: do not send before `until` (epoch
    ///   ms). A number's claim lapses when its block does (`ClaimNumbers.lifetime` plus the claim TTL after the
    ///   block was taken); its owner is not recorded (empty).
    ///
    /// The common case costs plain commands in one pipelined round trip: per pair an `HSETNX` of its number, per
    /// shard of pairs without an event time an `HMGET` of its pairs in the previous window, and a `PEXPIRE` per
    /// hash when `expiries` says it is due (once a minute per hash and process). Only a pair that finds something
    /// (a record, a claim, a copy replayed across a window's end) is settled by `settleClaims`, in up to three
    /// more round trips.
    public func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds: Int64,
        now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [DeliveryClaim] {
        if pairs.isEmpty { return [] }
        let numbers = try await takeClaimNumbers(
            app: app, owner: owner, count: pairs.count, claimTTL: ttlMilliseconds, now: now, window: window)
        let groups = deliveryGroups(pairs, window: window)
        let fields = pairs.map { RedisKeys.deliveredField(eventId: $0.eventID, token: $0.token) }
        var batch = RedisBatch(capacity: 64 + pairs.count * 96 + groups.count * 64)
        var expiring = Set<ExpiryMemo.Key>()
        var expires = [Bool](repeating: false, count: groups.count)
        for (g, group) in groups.enumerated() {
            let current = group.filed ?? now / window
            for index in group.indices {
                batch.command("HSETNX", arguments: 3)
                Self.windowKey(app: app, shard: group.shard, window: current, into: &batch)
                batch.argument(fields[index])
                batch.argument(numbers[index])
            }
            if group.filed == nil {
                batch.command("HMGET", arguments: 1 + group.indices.count)
                Self.windowKey(app: app, shard: group.shard, window: now / window - 1, into: &batch)
                for index in group.indices { batch.argument(fields[index]) }
            }
            expires[g] = expireIfDue(
                app: app, shard: group.shard, period: current, now: now, window: window, into: &batch, &expiring)
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == batch.count else {
            throw RedisError(.unexpectedReply, "claim: expected \(batch.count) replies, got \(replies.count)")
        }
        var out = [DeliveryClaim](repeating: .claimed, count: pairs.count)
        var held = numbers.map { Optional($0) }
        var unsettled: [Int] = []
        var written = [Int64?](repeating: nil, count: pairs.count)
        var next = 0
        for (g, group) in groups.enumerated() {
            var previous: [RedisValue]?
            if group.filed == nil {
                previous = try replies[next + group.indices.count].orThrow("HMGET claim").array ?? []
                guard previous?.count == group.indices.count else {
                    throw RedisError(
                        .unexpectedReply, "claim: HMGET answered \(previous?.count ?? 0) of \(group.indices.count)")
                }
            }
            for (offset, index) in group.indices.enumerated() {
                let wrote = try replies[next + offset].orThrow("HSETNX claim").int == 1
                if wrote { written[index] = numbers[index] }
                if wrote, previous.map({ $0[offset] == .null }) ?? true { continue }
                unsettled.append(index)
            }
            next += group.indices.count + (group.filed == nil ? 1 : 0)
            if expires[g] {
                _ = try replies[next].orThrow("PEXPIRE claim")
                next += 1
            }
        }
        expiries.mark(Array(expiring), now: now)
        if !unsettled.isEmpty {
            let settled = try await settleClaims(
                app: app, pairs: unsettled.map { pairs[$0] }, written: unsettled.map { written[$0] }, owner: owner,
                claimTTL: ttlMilliseconds, now: now, window: window)
            for (index, answer) in zip(unsettled, settled) {
                out[index] = answer.claim
                held[index] = answer.number
            }
        }
        claimNumbers.hold(
            app: app, owner: owner,
            pairs.indices.compactMap { index in out[index] == .claimed ? held[index].map { (pairs[index], $0) } : nil },
            now: now)
        return out
    }

    /// Numbers for `count` claims of `owner`: from its current block, and from new blocks when that runs out or
    /// its lifetime ended. A new block is picked at random and taken with `SET ... NX PX` of its key, one round
    /// trip; a block whose key exists (another process's, within its TTL) is skipped. Random, not counted: a
    /// failover that loses the newest writes cannot hand a block that is in use to a second process, except by
    /// the same pick among 524,287.
    private func takeClaimNumbers(
        app: String, owner: String, count: Int, claimTTL: Int64, now: Int64, window: Int64
    ) async throws -> [Int64] {
        let who = ClaimNumberSource.Owner(app: app, owner: owner)
        var out = claimNumbers.take(who, count: count, claimTTL: claimTTL, now: now)
        var attempts = 0
        while out.count < count {
            attempts += 1
            if attempts > 64 { throw RedisError(.unexpectedReply, "claim numbers: no free block in 64 attempts") }
            let block = Int64.random(in: 1...ClaimNumbers.blockCount)
            let keyTTL = ClaimNumbers.keyTTL(window: window, claimTTL: claimTTL)
            let header = ClaimNumbers.header(lapsesAt: now + ClaimNumbers.lifetime(claimTTL: claimTTL) + claimTTL)
            let taken = try await connection.send(
                RedisCommand("SET", RedisKeys.claimBlock(app: app, block: block), header, "NX", "PX", keyTTL)
            ).orThrow("SET claim block")
            if taken.isNull { continue }
            claimNumbers.install(who, block: block, claimTTL: claimTTL, takenAt: now, keepFor: keyTTL)
            out += claimNumbers.take(who, count: count - out.count, claimTTL: claimTTL, now: now)
        }
        return out
    }

    /// The second step of `claim` for pairs that found something. `written` is the number the first step wrote
    /// into the pair's current window (nil: its `HSETNX` found a value there). Round trips: an `HMGET` per hash
    /// of what both windows hold; a `BITFIELD` per number found (its block's lapse time and the number's bit);
    /// then a compare-and-set script (`Scripts.swapClaim`) per pair it takes over or per claim of this owner it
    /// withdraws. Per pair: a record in either window (`1`, or a number whose bit is set) is `.delivered`; a claim
    /// of another owner that has not lapsed (a number of another owner's block before its lapse time, a
    /// `p:<owner>:<until>` claim before `until`, a value of any other form) is `.pending`; in both cases a claim of
    /// this owner in the current window is withdrawn. Else the pair is this owner's: its claim in the current
    /// window stands, or a new number replaces what is there (nothing, or a lapsed claim), if it is still there.
    private func settleClaims(
        app: String, pairs: [DeliveryPair], written: [Int64?], owner: String, claimTTL: Int64, now: Int64,
        window: Int64
    ) async throws -> [(claim: DeliveryClaim, number: Int64?)] {
        let who = ClaimNumberSource.Owner(app: app, owner: owner)
        let groups = deliveryGroups(pairs, window: window)
        let fields = pairs.map { RedisKeys.deliveredField(eventId: $0.eventID, token: $0.token) }
        // 1. What both windows hold.
        var read = RedisBatch(capacity: 64 + pairs.count * 24 + groups.count * 160)
        for group in groups {
            read.command("HMGET", arguments: 1 + group.indices.count)
            Self.windowKey(app: app, shard: group.shard, window: group.filed ?? now / window, into: &read)
            for index in group.indices { read.argument(fields[index]) }
            if group.filed == nil {
                read.command("HMGET", arguments: 1 + group.indices.count)
                Self.windowKey(app: app, shard: group.shard, window: now / window - 1, into: &read)
                for index in group.indices { read.argument(fields[index]) }
            }
        }
        let replies = try await connection.pipeline(read)
        guard replies.count == read.count else {
            throw RedisError(.unexpectedReply, "claim: expected \(read.count) replies, got \(replies.count)")
        }
        var current = [RedisValue](repeating: .null, count: pairs.count)
        var previous = [RedisValue](repeating: .null, count: pairs.count)
        var next = 0
        func take(_ into: inout [RedisValue], _ group: DeliveryGroup) throws {
            let values = try replies[next].orThrow("HMGET claim").array ?? []
            guard values.count == group.indices.count else {
                throw RedisError(.unexpectedReply, "claim: HMGET answered \(values.count) of \(group.indices.count)")
            }
            for (offset, index) in group.indices.enumerated() { into[index] = values[offset] }
            next += 1
        }
        for group in groups {
            try take(&current, group)
            if group.filed == nil { try take(&previous, group) }
        }
        // 2. The blocks of the numbers found.
        var found: [Int64] = []
        for index in pairs.indices {
            for value in [current[index], previous[index]] {
                if let n = ClaimNumbers.parse(value), n != written[index] { found.append(n) }
            }
        }
        let blocks = try await readClaimNumbers(app: app, found)
        // 3. Judge each pair.
        var out: [(claim: DeliveryClaim, number: Int64?)] = Array(repeating: (.claimed, nil), count: pairs.count)
        var swaps: [(index: Int, group: DeliveryGroup, expected: RedisValue, replacement: Int64?)] = []
        let ownPrefix = DeliveryClaim.pendingPrefix(owner: owner)
        for group in groups {
            for index in group.indices {
                var delivered = false
                var other: DeliveryClaim?
                var ownNumber: Int64?
                var ownHere = false
                for (value, isCurrent) in [(current[index], true), (previous[index], false)] where value != .null {
                    if let n = ClaimNumbers.parse(value) {
                        let block = n == written[index] ? nil : blocks[n]
                        if block?.delivered == true {
                            delivered = true
                        } else if n == written[index] || claimNumbers.isMine(who, number: n) {
                            if isCurrent {
                                ownNumber = n
                                ownHere = true
                            }
                        } else if let block, block.lapsesAt > now {
                            other = other ?? .pending(owner: "", until: block.lapsesAt)
                        }
                        continue
                    }
                    guard let text = value.text else {
                        other = other ?? .pending(owner: "", until: 0)
                        continue
                    }
                    if text == DeliveryClaim.deliveredValue {
                        delivered = true
                    } else if text.hasPrefix(ownPrefix) {
                        if isCurrent { ownHere = true }
                    } else if case .pending(let holder, let until) = DeliveryClaim(stored: text, owner: owner),
                        until > now || until == 0
                    {
                        other = other ?? .pending(owner: holder, until: until)
                    }
                }
                if delivered || other != nil {
                    out[index] = (delivered ? .delivered : other ?? .delivered, nil)
                    if ownHere { swaps.append((index, group, current[index], nil)) }
                } else if let ownNumber {
                    out[index] = (.claimed, ownNumber)
                } else {
                    swaps.append((index, group, current[index], 0))
                }
            }
        }
        if swaps.isEmpty { return out }
        // 4. Take over or withdraw, each only if the field still holds what step 1 read.
        let fresh = try await takeClaimNumbers(
            app: app, owner: owner, count: swaps.filter { $0.replacement != nil }.count, claimTTL: claimTTL,
            now: now, window: window)
        var nextFresh = 0
        for s in swaps.indices where swaps[s].replacement != nil {
            swaps[s].replacement = fresh[nextFresh]
            nextFresh += 1
        }
        let answers = try await Scripts.swapClaim.run(on: connection, what: "claim") { sha in
            var batch = RedisBatch(capacity: 64 + swaps.count * 160)
            for swap in swaps {
                let group = swap.group
                batch.command("EVALSHA", arguments: 7)
                batch.argument(sha)
                batch.argument("1")
                Self.windowKey(app: app, shard: group.shard, window: group.filed ?? now / window, into: &batch)
                batch.argument(fields[swap.index])
                batch.argument(swap.expected.data.map { Array($0) } ?? [])
                batch.argument(swap.replacement.map { String($0) } ?? "")
                batch.argument(2 * window)
            }
            return batch
        }
        for (swap, answer) in zip(swaps, answers) {
            let done = try answer.orThrow("EVALSHA claim").int == 1
            guard let number = swap.replacement else { continue }
            // Another copy changed the field since it was read: wait for a moment and look again.
            out[swap.index] = done ? (.claimed, number) : (.pending(owner: "", until: now), nil)
        }
        return out
    }

    /// Per claim number: its block's lapse time (0 when the block's key is gone) and whether its bit is set. One
    /// pipelined `BITFIELD` per number.
    private func readClaimNumbers(
        app: String, _ numbers: [Int64]
    ) async throws -> [Int64: (lapsesAt: Int64, delivered: Bool)] {
        var unique: [Int64] = []
        var seen = Set<Int64>()
        for n in numbers where seen.insert(n).inserted { unique.append(n) }
        if unique.isEmpty { return [:] }
        var batch = RedisBatch(capacity: 64 + unique.count * 96)
        for n in unique {
            batch.command("BITFIELD", arguments: 7)
            batch.argument(RedisKeys.claimBlock(app: app, block: ClaimNumbers.block(of: n)))
            batch.argument("GET")
            batch.argument("i64")
            batch.argument("0")
            batch.argument("GET")
            batch.argument("u1")
            batch.argument(ClaimNumbers.bit(of: n))
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == unique.count else {
            throw RedisError(.unexpectedReply, "BITFIELD: expected \(unique.count) replies, got \(replies.count)")
        }
        var out: [Int64: (lapsesAt: Int64, delivered: Bool)] = [:]
        for (n, reply) in zip(unique, replies) {
            guard let values = try reply.orThrow("BITFIELD claim").array, values.count == 2 else {
                throw RedisError(.unexpectedReply, "BITFIELD answered \(reply)")
            }
            out[n] = (values[0].int ?? 0, values[1].int == 1)
        }
        return out
    }

    /// Confirms pairs as delivered (after the provider's 200), whoever held the claim. A pair this store claimed
    /// gets its claim number's bit set: one `BITFIELD` per block for all of them, and its record in the shard hash
    /// stays as it is. Any other pair's field becomes `1` in the hash it is filed under (its event time's window,
    /// else the window `now` falls in), that hash living two windows from now: an `HSET` per hash, and a
    /// `PEXPIRE` per hash when `expiries` says it is due. One pipelined round trip.
    public func confirmDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws {
        if pairs.isEmpty { return }
        let held = claimNumbers.letGo(app: app, pairs)
        var bits: [Int64: [Int64]] = [:]
        var blockOrder: [Int64] = []
        var plain: [DeliveryPair] = []
        func setBit(_ n: Int64) {
            let block = ClaimNumbers.block(of: n)
            if bits[block] == nil { blockOrder.append(block) }
            bits[block, default: []].append(ClaimNumbers.bit(of: n))
        }
        for (pair, claims) in zip(pairs, held) {
            guard let claims else {
                plain.append(pair)
                continue
            }
            setBit(claims.first.number)
            for claim in claims.more { setBit(claim.number) }
        }
        var batch = RedisBatch(capacity: 64 + pairs.count * 32)
        for block in blockOrder {
            let offsets = bits[block] ?? []
            batch.command("BITFIELD", arguments: 1 + 4 * offsets.count)
            batch.argument(RedisKeys.claimBlock(app: app, block: block))
            for offset in offsets {
                batch.argument("SET")
                batch.argument("u1")
                batch.argument(offset)
                batch.argument("1")
            }
        }
        var expiring = Set<ExpiryMemo.Key>()
        for group in deliveryGroups(plain, window: window) {
            let filed = group.filed ?? now / window
            batch.command("HSET", arguments: 1 + 2 * group.indices.count)
            Self.windowKey(app: app, shard: group.shard, window: filed, into: &batch)
            for index in group.indices {
                batch.argument(RedisKeys.deliveredField(eventId: plain[index].eventID, token: plain[index].token))
                batch.argument(DeliveryClaim.deliveredValue)
            }
            expireIfDue(
                app: app, shard: group.shard, period: filed, now: now, window: window, into: &batch, &expiring)
        }
        do {
            try await connection.write(batch, what: "confirm")
        } catch {
            claimNumbers.restore(app: app, pairs, held)
            throw error
        }
        expiries.mark(Array(expiring), now: now)
    }

    /// Releases this owner's claims on pairs that were not delivered (the notification went to the retry topic,
    /// the DLQ or token feedback): a field that still holds the number this owner's claim wrote is deleted (in
    /// either window), so a later copy claims the pair at once; a claim of another owner, or a delivery record, is
    /// left alone. One compare-and-delete script per field and window, in one round trip. A pair this store did not
    /// claim for the owner has nothing to release.
    public func releaseClaims(
        app: String, pairs: [DeliveryPair], owner: String, now: Int64,
        window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws {
        if pairs.isEmpty { return }
        let numbers = claimNumbers.letGo(app: app, owner: owner, pairs)
        let releasing = pairs.indices.filter { numbers[$0] != nil }
        if releasing.isEmpty { return }
        let groups = deliveryGroups(releasing.map { pairs[$0] }, window: window)
        do {
            let replies = try await Scripts.swapClaim.run(on: connection, what: "release") { sha in
                var batch = RedisBatch(capacity: 64 + releasing.count * 320)
                for group in groups {
                    let windows = group.filed.map { [$0] } ?? [now / window, now / window - 1]
                    for w in windows {
                        for index in group.indices {
                            let pair = pairs[releasing[index]]
                            batch.command("EVALSHA", arguments: 7)
                            batch.argument(sha)
                            batch.argument("1")
                            Self.windowKey(app: app, shard: group.shard, window: w, into: &batch)
                            batch.argument(RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token))
                            batch.argument(String(numbers[releasing[index]] ?? 0))
                            batch.argument("")
                            batch.argument(2 * window)
                        }
                    }
                }
                return batch
            }
            for reply in replies { _ = try reply.orThrow("EVALSHA release") }
        } catch {
            claimNumbers.hold(
                app: app, owner: owner, releasing.compactMap { i in numbers[i].map { (pairs[i], $0) } }, now: now)
            throw error
        }
    }

    /// Records that the notification of `eventId` was delivered to `token` unless a record or claim is there:
    /// true when this call created the record. (Tools and tests; send uses claim/confirm.)
    public func markDelivered(
        app: String, eventId: String, token: String, now: Int64,
        window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> Bool {
        try await markDelivered(
            app: app, pairs: [DeliveryPair(eventID: eventId, token: token)], now: now, window: window)[0]
    }

    /// The batch form of `markDelivered`: one pipelined round trip, one answer per pair, in order.
    public func markDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [Bool] {
        let replies = try await Scripts.mark.run(on: connection, what: "mark") { sha in
            var batch = RedisBatch(capacity: 64 + pairs.count * 200)
            for pair in pairs {
                batch.command("EVALSHA", arguments: 6)
                batch.argument(sha)
                batch.argument("2")
                let group = DeliveryGroup(
                    shard: RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards),
                    filed: Self.filedWindow(pair, window: window), indices: [])
                Self.windowKeys(app: app, group: group, now: now, window: window, into: &batch)
                batch.argument(RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token))
                batch.argument(2 * window)
            }
            return batch
        }
        return try replies.map { reply in
            switch try reply.orThrow("EVALSHA mark") {
            case .integer(1): return true
            case .integer(0): return false
            default: throw RedisError(.unexpectedReply, "the mark script answered \(reply)")
            }
        }
    }

    /// Whether each pair has a delivery record (`1`, or a claim number whose bit is set; a claim does not count)
    /// in the hash it is filed under: its event time's window, or (a pair without one) the window `now` falls in or
    /// the one before. One pipelined round trip (one or two `HGET` per pair), and one more (a `BITFIELD` per
    /// number) for the claim numbers found.
    public func wasDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [Bool] {
        if pairs.isEmpty { return [] }
        var batch = RedisBatch(capacity: 64 + pairs.count * 160)
        var looks: [Int] = []
        for pair in pairs {
            let shard = RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards)
            let field = RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token)
            let windows = Self.filedWindow(pair, window: window).map { [$0] } ?? [now / window, now / window - 1]
            for w in windows {
                batch.command("HGET", arguments: 2)
                Self.windowKey(app: app, shard: shard, window: w, into: &batch)
                batch.argument(field)
            }
            looks.append(windows.count)
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == batch.count else {
            throw RedisError(.unexpectedReply, "expected \(batch.count) replies, got \(replies.count)")
        }
        for reply in replies { try reply.orThrow("HGET") }
        let numbers = try await readClaimNumbers(app: app, replies.compactMap(ClaimNumbers.parse))
        var next = 0
        return looks.map { count in
            defer { next += count }
            return replies[next..<next + count].contains { reply in
                if let n = ClaimNumbers.parse(reply) { return numbers[n]?.delivered == true }
                return reply.text == DeliveryClaim.deliveredValue
            }
        }
    }

    /// Adds the `PEXPIRE` (two windows) of a shard's hash for window `period` when `expiries` says it is due, and
    /// notes its key in `expiring` (to `mark` once the round trip succeeded). True when it added one.
    @discardableResult
    private func expireIfDue(
        app: String, shard: UInt64, period: Int64, now: Int64, window: Int64, into batch: inout RedisBatch,
        _ expiring: inout Set<ExpiryMemo.Key>
    ) -> Bool {
        let key = ExpiryMemo.Key(kind: ExpiryMemo.deliveredKind, app: app, shard: shard, period: period)
        // Pairs without an event time and pairs filed under the current window share a hash: one PEXPIRE does.
        guard !expiring.contains(key), expiries.isDue(key, now: now) else { return false }
        batch.command("PEXPIRE", arguments: 2)
        Self.windowKey(app: app, shard: shard, window: period, into: &batch)
        batch.argument(2 * window)
        expiring.insert(key)
        return true
    }

    /// Pairs grouped by idempotency shard and filing window (in the order they first appear), so each script
    /// touches one slot. `filed` is the window a group's records are filed under when its pairs carry their event's
    /// time (`DeliveryPair.eventTime`), nil for pairs filed under the window of the send.
    func deliveryGroups(_ pairs: [DeliveryPair], window: Int64) -> [DeliveryGroup] {
        var groups = IndexGroups<DeliveryGroup.Key>(capacity: pairs.count)
        var last: (event: String, time: Int64?, group: Int)?
        for (index, pair) in pairs.enumerated() {
            // Pairs of one event mostly come one after another: only a change of event hashes again.
            if let last, last.event == pair.eventID, last.time == pair.eventTime {
                groups.add(index, toGroup: last.group)
                continue
            }
            let key = DeliveryGroup.Key(
                shard: RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards),
                filed: Self.filedWindow(pair, window: window))
            last = (pair.eventID, pair.eventTime, groups.add(index, to: key))
        }
        return zip(groups.keys, groups.members()).map { key, indices in
            DeliveryGroup(shard: key.shard, filed: key.filed, indices: indices)
        }
    }

    /// The window a pair's record is filed under whenever it is sent: its event time's, when it has one.
    static func filedWindow(_ pair: DeliveryPair, window: Int64) -> Int64? {
        guard let time = pair.eventTime, time >= 0 else { return nil }
        return time / window
    }

    /// `RedisKeys.delivered(app:shard:window:)` as one argument.
    static func windowKey(app: String, shard: UInt64, window: Int64, into batch: inout RedisBatch) {
        batch.argument(RedisKeys.prefix, ":", app, ":delivered:{d", String(shard), "}:", String(window))
    }

    /// The two keys a group's scripts read, as two arguments: the hash its records are filed under twice, or the
    /// hashes of the window `now` falls in and of the one before.
    static func windowKeys(
        app: String, group: DeliveryGroup, now: Int64, window: Int64, into batch: inout RedisBatch
    ) {
        let current = group.filed ?? now / window
        windowKey(app: app, shard: group.shard, window: current, into: &batch)
        windowKey(app: app, shard: group.shard, window: group.filed ?? now / window - 1, into: &batch)
    }
}

/// What a claim found (see `StateStore.claim`).
public enum DeliveryClaim: Sendable, Hashable {
    case claimed
    case delivered
    case pending(owner: String, until: Int64)

    static let deliveredValue = "1"

    static func pendingPrefix(owner: String) -> String { "p:\(owner):" }

    /// Reads a stored value; a claim of `owner` itself counts as claimed (an earlier attempt of this process).
    init(stored: String, owner: String) {
        if stored == Self.deliveredValue {
            self = .delivered
            return
        }
        if stored.hasPrefix(Self.pendingPrefix(owner: owner)) {
            self = .claimed
            return
        }
        // p:<owner>:<until>; anything else (an unknown value) is treated as a claim that expires with its TTL.
        let parts = stored.split(separator: ":")
        if parts.count >= 3, parts[0] == "p", let until = Int64(parts[parts.count - 1]) {
            self = .pending(owner: parts[1..<(parts.count - 1)].joined(separator: ":"), until: until)
        } else {
            self = .pending(owner: "", until: 0)
        }
    }
}

/// Pairs of one idempotency hash: a shard, and the window the records are filed under (nil: the window of the
/// send, with the previous one read too).
struct DeliveryGroup {
    struct Key: Hashable {
        var shard: UInt64
        var filed: Int64?
    }
    var shard: UInt64
    var filed: Int64?
    /// The positions of the group's pairs among those grouped, ascending (a slice of one array for all groups).
    var indices: ArraySlice<Int>
}

extension Scripts {
    /// KEYS: a delivery-record hash. ARGV: field, the value it must hold (empty: none), the value to write (empty:
    /// delete the field), the hash's TTL (ms, set when it has none). Compare and set: 1 when the field held the
    /// expected value and was changed, 0 when it held something else.
    static let swapClaim = LoadedScript(
        """
        local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
        if cur ~= ARGV[2] then return 0 end
        if ARGV[3] == '' then
          if cur ~= '' then redis.call('HDEL', KEYS[1], ARGV[1]) end
          return 1
        end
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
        if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
        return 1
        """)

    /// KEYS: this window's and the previous window's idempotency hash. ARGV: field, TTL (ms). Writes a delivery
    /// record unless either window holds anything for the field; 1 when it wrote one.
    static let mark = LoadedScript(
        """
        if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
          return 0
        end
        redis.call('HSET', KEYS[1], ARGV[1], '1')
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return 1
        """)
}

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
