import Foundation
import HeraldCore
import Synchronization

// Burst coalescing state (docs/behaviour.md §6a, docs/redis-keys.md "Bursts"). Bursts are spread over 64 shards by
// user; each shard is two keys in one Cluster slot: a hash of the shard's active bursts and a sorted set of when
// each is due (its flush, or its end). Every script touches one shard. Ended bursts are deleted by the flush
// timer, and both keys expire when their shard has been quiet for two windows.
//
// A held message's event is kept once, however many bursts hold it (unless it is small and seen once in its batch,
// `SharedEvents`): in a hash of its own (`burst_event`), named by a digest of its bytes, with a count of the
// references to it. A burst keeps the message's record without the
// event and the digest (`HeldPart`); the flush timer puts the two together again. The copies are counted before
// any burst can refer to them (in the same round trip as the steps, ahead of them) and given back after the
// references are gone (riding on the next round trip), so a crash or a failed round trip can only keep a copy
// longer, until its TTL, never drop one a burst still needs.
//
// A traced message's trace context goes with its held part (`HeldPart.traced`), and only then: untraced traffic
// stores and sends no byte more. The burst keeps the context of the latest traced message held since it last
// showed (an untraced message held after it keeps it), and its flush carries it.

extension RedisKeys {
    /// Shards of the burst state, by user.
    public static let burstShards: UInt64 = 64

    /// The burst shard of a user.
    public static func burstShard(user: String) -> UInt64 { fnv(user) % burstShards }

    /// Hash: burst field -> `<count>:<shown>:<shown at ms>:<last at ms>:<lane>[:<held part>]` (`HeldPart`; a traced
    /// one starts with its trace context, `HeldPart.traced`).
    public static func bursts(app: String, shard: UInt64) -> String { "\(prefix):\(app):burst:{b\(shard)}" }

    /// Sorted set: burst field -> when the flush timer looks at it next (epoch ms).
    public static func burstsDue(app: String, shard: UInt64) -> String { "\(prefix):\(app):burst_due:{b\(shard)}" }

    /// Hash: one held event, kept once for every burst that holds it: `e` -> its bytes, `n` -> how many references
    /// to it were counted. `digest`: the first 16 bytes of the bytes' SHA-256 in hex, which is also the hash tag (the
    /// copies spread over the Cluster's slots).
    public static func burstEvent(app: String, digest: String) -> String {
        "\(prefix):\(app):burst_event:{\(digest)}"
    }

    /// The field of a (user, conversation) burst: `<user's length in bytes>:<user>:<conversation>`.
    public static func burstField(user: String, conversation: String) -> String {
        "\(user.utf8.count):\(user):\(conversation)"
    }

    /// The user and conversation of a burst field; nil for anything else.
    static func burstParts(_ field: String) -> (user: String, conversation: String)? {
        let bytes = Array(field.utf8)
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")),
            let length = Int(String(decoding: bytes[..<colon], as: UTF8.self)), length >= 0,
            colon + 1 + length < bytes.count, bytes[colon + 1 + length] == UInt8(ascii: ":")
        else { return nil }
        return (
            String(decoding: bytes[(colon + 1)..<(colon + 1 + length)], as: UTF8.self),
            String(decoding: bytes[(colon + 2 + length)...], as: UTF8.self)
        )
    }
}

extension StateStore {
    /// How long a claimed flush stays with the claiming process before another may take it (it died before the
    /// flush was produced and confirmed).
    public static let burstLeaseMilliseconds: Int64 = 10_000
    /// The most flushes one shard hands out per claim.
    static let burstClaimLimit = 200

    /// The TTL of a shard's keys, refreshed by every write: two windows (at least two minutes, for the flood guard) and
    /// the lease. A shared event copy has the same TTL, refreshed by every step that counts it and every claim that
    /// reads it.
    static func burstTTL(_ policy: CoalescePolicy) -> Int64 {
        2 * max(policy.windowMilliseconds, FloodGuard.minuteMilliseconds) + burstLeaseMilliseconds + 60_000
    }

    /// Steps each message through its burst (`Coalescing.step`, in Lua), or, for a message with an empty
    /// conversation, through its user's flood guard (`FloodGuard.step`): one pipelined round trip, one script per
    /// message, each atomic on its shard; the answers in order.
    ///
    /// The same round trip first counts the batch's references to each distinct event (`share`: the copy is written
    /// when it is not there yet, so it exists before any burst can refer to it) and gives back the references
    /// waiting since the last round trip (`release`). A message that is not held gives its reference back, and so
    /// does a held message replaced by a later one; they go out with the next round trip.
    public func stepBursts(_ messages: [BurstMessage]) async throws -> [BurstStep] {
        if messages.isEmpty { return [] }
        let shared = SharedEvents(messages)
        let releases = burstReleases.take()
        let copiesAt = releases.count
        let stepsAt = copiesAt + shared.copies.count
        let capacity =
            256 + releases.count * 128 + shared.copies.reduce(0) { $0 + $1.bytes.count + 160 }
            + shared.held.reduce(0) { $0 + $1.count + 200 }
        let replies = try await BurstPipeline.run(
            [BurstScripts.release, BurstScripts.share, BurstScripts.step, BurstScripts.flood],
            count: stepsAt + messages.count, on: connection, what: "burst step", capacity: capacity
        ) { batch, sha, i in
            if i < copiesAt {
                Self.releaseCall(&batch, sha: sha(BurstScripts.release), releases[i])
            } else if i < stepsAt {
                let copy = shared.copies[i - copiesAt]
                batch.command("EVALSHA", arguments: 6)
                batch.argument(sha(BurstScripts.share))
                batch.argument("1")
                batch.argument(copy.key)
                batch.argument(copy.bytes)
                batch.argument(copy.references)
                batch.argument(copy.ttl)
            } else {
                let index = i - stepsAt
                let m = messages[index]
                let flood = m.conversation.isEmpty
                let shard = RedisKeys.burstShard(user: m.user)
                batch.command("EVALSHA", arguments: 11)
                batch.argument(sha(flood ? BurstScripts.flood : BurstScripts.step))
                batch.argument("2")
                batch.argument(RedisKeys.bursts(app: m.appID, shard: shard))
                batch.argument(RedisKeys.burstsDue(app: m.appID, shard: shard))
                batch.argument(RedisKeys.burstField(user: m.user, conversation: m.conversation))
                batch.argument(m.at)
                batch.argument(flood ? FloodGuard.minuteMilliseconds : max(1, m.policy.windowMilliseconds))
                batch.argument(flood ? Int64(m.flood.perMinute) : m.policy.updateMilliseconds)
                batch.argument(Self.burstTTL(m.policy))
                batch.argument(m.lane.rawValue)
                batch.argument(shared.held[index])
            }
        }
        // A release that failed leaves its copy until the copy's TTL. A copy that could not be counted is not given
        // back (whether it was counted is not known), so it too stays until its TTL at most; and the batch goes out
        // without coalescing, since a burst that held one of its messages may lack the event (that burst's later
        // flush is the same event to the same devices, which send skips).
        var failure: (any Error)?
        var uncounted = Set<Int>()
        for c in shared.copies.indices {
            if case .error(let message) = replies[copiesAt + c] {
                uncounted.insert(c)
                logger.warning(
                    "a shared burst event could not be written", metadata: ["key": "\(shared.copies[c].key)"])
                failure = failure ?? RedisError(.serverError, "EVALSHA burst share: \(message)")
            }
        }
        var out = [BurstStep](repeating: .first, count: messages.count)
        for (index, m) in messages.enumerated() {
            let copy = shared.copyOf[index]
            let counted = copy.map { !uncounted.contains($0) } ?? false
            let step: BurstStep
            let replaced: String
            do {
                (step, replaced) = try Self.readStep(replies[stepsAt + index])
            } catch {
                if counted, let copy { burstReleases.add(shared.copies[copy].key) }
                failure = failure ?? error
                continue
            }
            out[index] = step
            if !replaced.isEmpty { burstReleases.add(RedisKeys.burstEvent(app: m.appID, digest: replaced)) }
            // A held message's reference is its burst's now; any other gives it back.
            if let copy, counted, !step.isHeld { burstReleases.add(shared.copies[copy].key) }
        }
        if let failure { throw failure }
        return out
    }

    /// A step script's answer: the step, and the digest of the shared event of the held message it replaced ("" for
    /// none).
    static func readStep(_ reply: RedisValue) throws -> (BurstStep, String) {
        guard let values = try reply.orThrow("EVALSHA burst step").array, values.count == 3,
            let step = values[0].int, let count = values[1].int
        else { throw RedisError(.unexpectedReply, "the burst script answered \(reply)") }
        let replaced = values[2].text ?? ""
        switch step {
        case 0: return (.first, replaced)
        case 1: return (.update(count: Int(count)), replaced)
        default: return (.held(count: Int(count)), replaced)
        }
    }

    /// Takes the bursts of every shard of `app` whose flush is due at `now` (one pipelined round trip, one script
    /// per shard), leasing each to the caller for `burstLeaseMilliseconds`; ended bursts are deleted on the way.
    /// The shared events the held messages refer to are read in one more round trip (each copy once, its TTL
    /// renewed) and put back into their records, so each `HeldBurst.record` is the record suppress held, byte for
    /// byte. A held message whose copy is gone comes back with `eventMissing` (no record), unless it was held less
    /// than a lease ago: then it stays leased and is taken again once the lease passes (its copy may be on its way
    /// to another Cluster node).
    public func claimDueBursts(app: String, policy: CoalescePolicy, now: Int64) async throws -> [HeldBurst] {
        let shards = Array(0..<RedisKeys.burstShards)
        let releases = burstReleases.take()
        let replies = try await BurstPipeline.run(
            [BurstScripts.release, BurstScripts.claim], count: releases.count + shards.count, on: connection,
            what: "burst claim", capacity: releases.count * 128 + shards.count * 160
        ) { batch, sha, i in
            if i < releases.count {
                Self.releaseCall(&batch, sha: sha(BurstScripts.release), releases[i])
                return
            }
            Self.shardCall(
                &batch, sha: sha(BurstScripts.claim), app: app, shard: shards[i - releases.count], more: 3, now: now,
                policy: policy)
            batch.argument(Self.burstLeaseMilliseconds)
            batch.argument(Int64(Self.burstClaimLimit))
            batch.argument(Self.burstTTL(policy))
        }
        var claimed: [(burst: HeldBurst, part: HeldPart, lastAt: Int64)] = []
        for reply in replies[releases.count...] {
            guard let values = try reply.orThrow("EVALSHA burst claim").array, values.count % 5 == 0 else {
                throw RedisError(.unexpectedReply, "the burst claim script answered \(reply)")
            }
            var i = 0
            while i < values.count {
                defer { i += 5 }
                guard let field = values[i].text, let parts = RedisKeys.burstParts(field),
                    let count = values[i + 1].int, let laneName = values[i + 2].text,
                    let held = values[i + 3].data, let lastAt = values[i + 4].int
                else { throw RedisError(.unexpectedReply, "the burst claim script answered \(values[i])") }
                let (trace, part) = HeldPart.untraced(Array(held))
                claimed.append(
                    (
                        HeldBurst(
                            user: parts.user, conversation: parts.conversation, count: Int(count),
                            lane: Lane(rawValue: laneName) ?? .bulk, record: [], trace: trace),
                        HeldPart(part), lastAt
                    ))
            }
        }
        let events = try await sharedEvents(app: app, of: claimed.map(\.part), ttl: Self.burstTTL(policy))
        var out: [HeldBurst] = []
        out.reserveCapacity(claimed.count)
        for (burst, part, lastAt) in claimed {
            var held = burst
            switch part {
            case .whole(let record):
                held.record = record
            case .shared(let digest, let offset, let length, let stub):
                if let event = events[digest], event.count == length, offset <= stub.count {
                    held.record = HeldPart.splice(stub, at: offset, event)
                } else if now - lastAt < Self.burstLeaseMilliseconds {
                    continue
                } else {
                    held.eventMissing = true
                }
            }
            out.append(held)
        }
        return out
    }

    /// The shared events `parts` refer to, by digest (a copy that is gone is left out): one pipelined round trip,
    /// each copy read once and its TTL renewed.
    func sharedEvents(app: String, of parts: [HeldPart], ttl: Int64) async throws -> [String: [UInt8]] {
        var digests: [String] = []
        var seen = Set<String>()
        for part in parts {
            if case .shared(let digest, _, _, _) = part, seen.insert(digest).inserted { digests.append(digest) }
        }
        if digests.isEmpty { return [:] }
        var batch = RedisBatch(capacity: digests.count * 160)
        for digest in digests {
            let key = RedisKeys.burstEvent(app: app, digest: digest)
            batch.command("HGET", arguments: 2)
            batch.argument(key)
            batch.argument("e")
            batch.command("PEXPIRE", arguments: 2)
            batch.argument(key)
            batch.argument(ttl)
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == 2 * digests.count else {
            throw RedisError(
                .unexpectedReply, "burst events: expected \(2 * digests.count) replies, got \(replies.count)")
        }
        var out: [String: [UInt8]] = [:]
        for (n, digest) in digests.enumerated() {
            if let data = try replies[2 * n].orThrow("HGET burst event").data { out[digest] = Array(data) }
        }
        return out
    }

    /// Records flushes as shown (`Coalescing.flushed`, in Lua) once their records were produced: one pipelined round
    /// trip, one script per shard. The references of the held messages shown go back with the next round trip.
    public func confirmBursts(app: String, policy: CoalescePolicy, flushed: [HeldBurst], now: Int64) async throws {
        if flushed.isEmpty { return }
        var byShard: [UInt64: [HeldBurst]] = [:]
        for b in flushed { byShard[RedisKeys.burstShard(user: b.user), default: []].append(b) }
        let groups = byShard.sorted { $0.key < $1.key }
        let replies = try await BurstPipeline.run(
            [BurstScripts.confirm], count: groups.count, on: connection, what: "burst confirm",
            capacity: 256 + flushed.count * 96
        ) { batch, sha, i in
            let (shard, bursts) = groups[i]
            Self.shardCall(
                &batch, sha: sha(BurstScripts.confirm), app: app, shard: shard, more: 1 + 2 * bursts.count, now: now,
                policy: policy)
            batch.argument(Self.burstTTL(policy))
            for b in bursts {
                batch.argument(RedisKeys.burstField(user: b.user, conversation: b.conversation))
                batch.argument(Int64(b.count))
            }
        }
        var failure: (any Error)?
        for reply in replies {
            do {
                for digest in try reply.orThrow("EVALSHA burst confirm").array ?? [] {
                    if let digest = digest.text, !digest.isEmpty {
                        burstReleases.add(RedisKeys.burstEvent(app: app, digest: digest))
                    }
                }
            } catch {
                failure = failure ?? error
            }
        }
        if let failure { throw failure }
    }

    /// Gives back, now, the references to shared burst events that wait for the next round trip (a process that
    /// stops; tests). What is not given back stays until the copies' TTL.
    public func releaseBurstEvents() async throws {
        let releases = burstReleases.take()
        if releases.isEmpty { return }
        let replies = try await BurstPipeline.run(
            [BurstScripts.release], count: releases.count, on: connection, what: "burst release",
            capacity: releases.count * 128
        ) { batch, sha, i in
            Self.releaseCall(&batch, sha: sha(BurstScripts.release), releases[i])
        }
        for reply in replies { try reply.orThrow("EVALSHA burst release") }
    }

    /// A `release` script call: `count` references to the shared event `key` given back.
    static func releaseCall(_ batch: inout RedisBatch, sha: String, _ release: (key: String, count: Int64)) {
        batch.command("EVALSHA", arguments: 4)
        batch.argument(sha)
        batch.argument("1")
        batch.argument(release.key)
        batch.argument(release.count)
    }

    /// A script call on one shard up to its common arguments: EVALSHA, the shard's hash and due set, now, the window
    /// and the update interval; `more` arguments follow.
    static func shardCall(
        _ batch: inout RedisBatch, sha: String, app: String, shard: UInt64, more: Int, now: Int64,
        policy: CoalescePolicy
    ) {
        batch.command("EVALSHA", arguments: 7 + more)
        batch.argument(sha)
        batch.argument("2")
        batch.argument(RedisKeys.bursts(app: app, shard: shard))
        batch.argument(RedisKeys.burstsDue(app: app, shard: shard))
        batch.argument(now)
        batch.argument(max(1, policy.windowMilliseconds))
        batch.argument(policy.updateMilliseconds)
    }
}

/// The held part of a burst's value. A record with a shared part (its event, `BurstMessage.sharedBytes`) is kept as
/// `#<digest>:<offset>:<length>:` followed by the record without those `<length>` bytes at `<offset>` (the stub);
/// the bytes are in the `burst_event` copy of `<digest>`. Any other held part is a record kept whole: one of another
/// kind, or one written before events were shared (it starts with the record's magic bytes, never `#`).
enum HeldPart: Sendable, Hashable {
    case whole([UInt8])
    case shared(digest: String, offset: Int, length: Int, stub: [UInt8])

    static let marker = UInt8(ascii: "#")
    /// A digest's length in hex digits.
    static let digestLength = 32

    /// The held part of `record` whose bytes at `range` are the shared copy of `digest`.
    static func encode(_ record: [UInt8], sharing range: Range<Int>, digest: String) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(record.count - range.count + digest.utf8.count + 24)
        out.append(marker)
        out.append(contentsOf: digest.utf8)
        out.append(UInt8(ascii: ":"))
        out.append(contentsOf: String(range.lowerBound).utf8)
        out.append(UInt8(ascii: ":"))
        out.append(contentsOf: String(range.count).utf8)
        out.append(UInt8(ascii: ":"))
        out.append(contentsOf: record[..<range.lowerBound])
        out.append(contentsOf: record[range.upperBound...])
        return out
    }

    /// Reads a stored held part. One that does not read as a shared one is taken as a whole record (which then does
    /// not decode, and is counted as invalid by the flush timer).
    init(_ bytes: [UInt8]) {
        guard bytes.first == Self.marker else {
            self = .whole(bytes)
            return
        }
        var colons: [Int] = []
        var i = 1
        // The prefix is at most `#`, the digest and two numbers with their colons.
        while colons.count < 3, i < min(bytes.count, 64) {
            if bytes[i] == UInt8(ascii: ":") { colons.append(i) }
            i += 1
        }
        func number(_ range: Range<Int>) -> Int? {
            range.count <= 18 ? Int(String(decoding: bytes[range], as: UTF8.self)) : nil
        }
        guard colons.count == 3, colons[0] - 1 == Self.digestLength,
            bytes[1..<colons[0]].allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }),
            let offset = number((colons[0] + 1)..<colons[1]), let length = number((colons[1] + 1)..<colons[2]),
            offset >= 0, length >= 0, offset <= bytes.count - colons[2] - 1
        else {
            self = .whole(bytes)
            return
        }
        self = .shared(
            digest: String(decoding: bytes[1..<colons[0]], as: UTF8.self), offset: offset, length: length,
            stub: Array(bytes[(colons[2] + 1)...]))
    }

    /// The first byte of a held part that carries a trace context (a record starts with its magic bytes or `{`, a
    /// shared part with `#`).
    static let traceMarker = UInt8(ascii: "^")

    /// `part` as a traced message holds it: `^<length>:<context>` (`HeldTrace.stored`, `<length>` its bytes) before
    /// it. An untraced message's part is `part` itself.
    static func traced(_ part: [UInt8], _ trace: HeldTrace?) -> [UInt8] {
        guard let trace else { return part }
        let stored = trace.stored
        var out: [UInt8] = [traceMarker]
        out.reserveCapacity(part.count + stored.count + 8)
        out.append(contentsOf: String(stored.count).utf8)
        out.append(UInt8(ascii: ":"))
        out.append(contentsOf: stored)
        out.append(contentsOf: part)
        return out
    }

    /// A stored held part's trace context (nil: none) and the part after it.
    static func untraced(_ bytes: [UInt8]) -> (HeldTrace?, [UInt8]) {
        guard bytes.first == traceMarker, let colon = bytes.prefix(12).firstIndex(of: UInt8(ascii: ":")),
            let length = Int(String(decoding: bytes[1..<colon], as: UTF8.self)), length >= 0,
            colon + 1 + length <= bytes.count
        else { return (nil, bytes) }
        let end = colon + 1 + length
        return (HeldTrace(stored: bytes[(colon + 1)..<end]), Array(bytes[end...]))
    }

    /// The record again: `shared` put back into `stub` at `offset`.
    static func splice(_ stub: [UInt8], at offset: Int, _ shared: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(stub.count + shared.count)
        out.append(contentsOf: stub[..<offset])
        out.append(contentsOf: shared)
        out.append(contentsOf: stub[offset...])
        return out
    }
}

/// The events a batch of messages shares: each distinct one once, with how many of the batch's messages refer to it,
/// and each message's held part. An event is shared when it has `minimumBytes` or more, or when more than one message
/// of the batch refers to it (the recipients of a group spread over suppress's batches: a large group's event comes
/// to each batch many times, a small group's once). A small event seen once stays in its burst's value: a copy
/// would cost two more Redis commands than the bytes it saves.
struct SharedEvents {
    /// Events at least this long are always shared.
    static let minimumBytes = 512

    struct Copy {
        var app: String
        var key = ""
        var digest = ""
        var bytes: ArraySlice<UInt8>
        var references: Int64 = 0
        var ttl: Int64 = 0
    }

    /// The copies to count, each distinct shared event once.
    var copies: [Copy] = []
    /// Per message: the copy its held part refers to; nil when its record is kept whole.
    var copyOf: [Int?] = []
    /// Per message: the held part its step stores if the message is held.
    var held: [[UInt8]] = []

    /// A cheap first look at an event: its app, length and first bytes (an event starts with its id). Events that
    /// look alike are compared byte for byte; each distinct one is hashed once.
    struct Probe: Hashable {
        var app: String
        var count: Int
        var head: UInt64
    }

    init(_ messages: [BurstMessage]) {
        // The distinct events and who refers to them.
        var events: [Copy] = []
        var eventOf: [(index: Int, range: Range<Int>)?] = []
        eventOf.reserveCapacity(messages.count)
        var seen: [Probe: [Int]] = [:]
        for m in messages {
            guard let range = m.sharedBytes else {
                eventOf.append(nil)
                continue
            }
            let bytes = m.record[range]
            let head = FNV1a.hash(bytes.prefix(64))
            let probe = Probe(app: m.appID, count: bytes.count, head: head)
            let index: Int
            if let known = seen[probe]?.first(where: { Self.same(events[$0].bytes, bytes) }) {
                index = known
            } else {
                events.append(Copy(app: m.appID, bytes: bytes))
                index = events.count - 1
                seen[probe, default: []].append(index)
            }
            events[index].references += 1
            events[index].ttl = max(events[index].ttl, StateStore.burstTTL(m.policy))
            eventOf.append((index, range))
        }
        // The shared ones, hashed once each.
        var copyIndex = [Int?](repeating: nil, count: events.count)
        for (index, var event) in events.enumerated()
        where event.references > 1 || event.bytes.count >= Self.minimumBytes {
            event.digest = String(SHA256.hex(Array(event.bytes)).prefix(HeldPart.digestLength))
            event.key = RedisKeys.burstEvent(app: event.app, digest: event.digest)
            copyIndex[index] = copies.count
            copies.append(event)
        }
        copyOf.reserveCapacity(messages.count)
        held.reserveCapacity(messages.count)
        for (m, event) in zip(messages, eventOf) {
            guard let event, let copy = copyIndex[event.index] else {
                copyOf.append(nil)
                held.append(HeldPart.traced(m.record, m.trace))
                continue
            }
            copyOf.append(copy)
            held.append(
                HeldPart.traced(
                    HeldPart.encode(m.record, sharing: event.range, digest: copies[copy].digest), m.trace))
        }
    }

    static func same(_ a: ArraySlice<UInt8>, _ b: ArraySlice<UInt8>) -> Bool {
        guard a.count == b.count else { return false }
        if a.isEmpty { return true }
        return a.withUnsafeBytes { x in b.withUnsafeBytes { y in memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0 }
        }
    }
}

/// References to shared burst events given back and not yet sent: they ride on the store's next burst round trip,
/// summed per copy. Lost (a failed round trip, a process that stops) they only keep their copies until the TTL.
final class BurstEventReleases: Sendable {
    private let pending = Mutex<[String: Int64]>([:])

    func add(_ key: String, _ count: Int64 = 1) {
        pending.withLock { $0[key, default: 0] += count }
    }

    /// Everything pending, by key; nothing is left pending.
    func take() -> [(key: String, count: Int64)] {
        pending.withLock { pending in
            defer { pending = [:] }
            return pending.sorted { $0.key < $1.key }.map { (key: $0.key, count: $0.value) }
        }
    }
}

/// Pipelines of burst script calls.
enum BurstPipeline {
    /// Sends `count` calls, call i written by `write(&batch, sha, i)` as one command (`sha` gives a script's SHA1),
    /// in one pipeline, and returns their replies in order. Calls a node answered NOSCRIPT (it lost its scripts) are
    /// sent once more, after the scripts are loaded again; calls that ran are never sent twice.
    static func run(
        _ scripts: [LoadedScript], count: Int, on connection: RedisConnection, what: String, capacity: Int,
        _ write: (inout RedisBatch, (LoadedScript) -> String, Int) -> Void
    ) async throws -> [RedisValue] {
        if count == 0 { return [] }
        var replies = [RedisValue](repeating: .null, count: count)
        var todo = Array(0..<count)
        for attempt in 0..<2 {
            var shas: [ObjectIdentifier: String] = [:]
            for script in scripts {
                shas[ObjectIdentifier(script)] = try await script.load(on: connection, again: attempt > 0)
            }
            var batch = RedisBatch(capacity: capacity)
            for i in todo { write(&batch, { shas[ObjectIdentifier($0)] ?? "" }, i) }
            let got = try await connection.pipeline(batch)
            guard got.count == todo.count else {
                throw RedisError(.unexpectedReply, "\(what): expected \(todo.count) replies, got \(got.count)")
            }
            var again: [Int] = []
            for (i, reply) in zip(todo, got) {
                if attempt == 0, case .error(let message) = reply, message.hasPrefix("NOSCRIPT") {
                    again.append(i)
                } else {
                    replies[i] = reply
                }
            }
            if again.isEmpty { break }
            todo = again
        }
        return replies
    }
}

/// The burst scripts. Each runs on one shard: KEYS[1] its hash of bursts, KEYS[2] its sorted set of due times.
/// They mirror `Coalescing.step`, `Coalescing.flush` and `Coalescing.flushed`. `share` and `release` count the
/// references to one shared event (KEYS[1], a `burst_event` hash).
enum BurstScripts {
    /// Reading and writing a burst's value, and its due time.
    static let common = """
        local function parse(v)
          if not v then return nil end
          local s, e, c, sh, sa, la, ln = string.find(v, '^(%d+):(%d+):(%-?%d+):(%-?%d+):(%a+)')
          if not s then return nil end
          local st = {count = tonumber(c), shown = tonumber(sh), shownAt = tonumber(sa), lastAt = tonumber(la), lane = ln}
          if #v > e + 1 then st.rec = string.sub(v, e + 2) end
          return st
        end
        local function encode(st)
          local v = string.format('%d:%d:%d:%d:%s', st.count, st.shown, st.shownAt, st.lastAt, st.lane)
          if st.rec then v = v .. ':' .. st.rec end
          return v
        end
        local function due(st, window, update)
          if st.rec then return st.shownAt + update end
          return st.lastAt + window
        end
        -- A user's flood guard is the field with an empty conversation; it is flushed and ended by the minute.
        local function isflood(f) return string.sub(f, -1) == ':' end
        -- A traced message's held part starts with its trace context, '^<length>:<context>' (HeldPart.traced): that
        -- prefix, '' for none.
        local function tracepart(rec)
          if rec == nil or string.byte(rec, 1) ~= 94 then return '' end
          local n, at = string.match(rec, '^%^(%d+):()')
          if not n then return '' end
          return string.sub(rec, 1, at + tonumber(n) - 1)
        end
        -- The held part a message held after `old` (the burst's pending part, nil for none) stores: its own, with the
        -- trace context of `old` when it has none itself (the latest traced message's context stays with the burst).
        local function hold(old, new)
          if string.byte(new, 1) == 94 then return new end
          return tracepart(old) .. new
        end
        -- The digest of the shared event a held part refers to ('#<digest>:...' after any trace context); '' for
        -- none (a record kept whole, such as one written before events were shared, starts with its magic bytes).
        local function shared(rec)
          if not rec then return '' end
          return string.match(rec, '^#(%x+):', #tracepart(rec) + 1) or ''
        end

        """

    /// ARGV: field, now (ms), window (ms), update interval (ms), keys' TTL (ms), lane, the message's held part.
    /// Returns {step, count, replaced}: step 0 first, 1 update, 2 held; replaced: the shared event of the held part
    /// this step dropped ('' for none).
    static let step = LoadedScript(
        common + """
            local now, window, update = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
            local p = parse(redis.call('HGET', KEYS[1], ARGV[1]))
            local st, step
            local waspending = p ~= nil and p.rec ~= nil
            -- A held part is only ever replaced (held again) or dropped (a new burst) by a step.
            local replaced = shared(p and p.rec)
            if p == nil or p.count == 0 or ((not waspending) and now - p.lastAt >= window) then
              st = {count = 1, shown = 1, shownAt = now, lastAt = now, lane = ARGV[6]}
              step = 0
            else
              st = p
              st.count = st.count + 1
              if now > st.lastAt then st.lastAt = now end
              if (not waspending) and now - st.shownAt >= update then
                st.shown = st.count
                st.shownAt = now
                step = 1
              else
                st.rec = hold(st.rec, ARGV[7])
                st.lane = ARGV[6]
                step = 2
              end
            end
            redis.call('HSET', KEYS[1], ARGV[1], encode(st))
            if not (step == 2 and waspending) then redis.call('ZADD', KEYS[2], due(st, window, update), ARGV[1]) end
            redis.call('PEXPIRE', KEYS[1], ARGV[5])
            redis.call('PEXPIRE', KEYS[2], ARGV[5])
            return {step, st.count, replaced}
            """)

    /// A user's flood guard. ARGV: field, now (ms), the minute (ms), the most visible pushes per minute, keys' TTL
    /// (ms), lane, the push's held part. Returns {step, count, replaced}: step 0 lets it go, 2 holds it (count: held
    /// pushes); replaced as for `step`.
    static let flood = LoadedScript(
        common + """
            local now, minute, limit = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
            local start = now - now % minute
            local st = parse(redis.call('HGET', KEYS[1], ARGV[1]))
            local waspending = st ~= nil and st.rec ~= nil
            -- Only a pending guard has a held part, and a pending guard holds the push: its part is replaced.
            local replaced = shared(st and st.rec)
            if st == nil or ((not waspending) and st.shownAt < start) then
              st = {count = 0, shown = 0, shownAt = start, lastAt = now, lane = ARGV[6]}
            end
            if now > st.lastAt then st.lastAt = now end
            local step
            if waspending or st.shown >= limit then
              st.count = st.count + 1
              st.rec = hold(st.rec, ARGV[7])
              st.lane = ARGV[6]
              step = 2
            else
              st.shown = st.shown + 1
              step = 0
            end
            redis.call('HSET', KEYS[1], ARGV[1], encode(st))
            if not waspending then redis.call('ZADD', KEYS[2], due(st, minute, minute), ARGV[1]) end
            redis.call('PEXPIRE', KEYS[1], ARGV[5])
            redis.call('PEXPIRE', KEYS[2], ARGV[5])
            return {step, st.count, replaced}
            """)

    /// ARGV: now (ms), window (ms), update interval (ms), lease (ms), most bursts to take, keys' TTL (ms).
    /// Returns a flat list of {field, count, lane, held part, last message ms} for each due flush, each leased until
    /// now + lease; ended bursts are deleted, others get their due time again.
    static let claim = LoadedScript(
        common + """
            local now, window, update = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
            local fields = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[5])
            local out = {}
            for _, f in ipairs(fields) do
              local window, update = window, update
              if isflood(f) then window, update = 60000, 60000 end
              local st = parse(redis.call('HGET', KEYS[1], f))
              if st == nil then
                redis.call('ZREM', KEYS[2], f)
              elseif st.rec and now >= st.shownAt + update then
                out[#out + 1] = f
                out[#out + 1] = st.count
                out[#out + 1] = st.lane
                out[#out + 1] = st.rec
                out[#out + 1] = st.lastAt
                redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), f)
              elseif (not st.rec) and now >= st.lastAt + window then
                redis.call('HDEL', KEYS[1], f)
                redis.call('ZREM', KEYS[2], f)
              else
                redis.call('ZADD', KEYS[2], due(st, window, update), f)
              end
            end
            if #fields > 0 and redis.call('EXISTS', KEYS[1]) == 1 then
              redis.call('PEXPIRE', KEYS[1], ARGV[6])
              redis.call('PEXPIRE', KEYS[2], ARGV[6])
            end
            return out
            """)

    /// ARGV: now (ms), window (ms), update interval (ms), keys' TTL (ms), then (field, count shown) pairs.
    /// A flush that showed more than the burst had shown becomes its last visible push; the held part is dropped
    /// unless messages were held after the flush was taken. Returns the shared events of the held parts dropped.
    static let confirm = LoadedScript(
        common + """
            local now, window, update = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
            local out = {}
            local function drop(st)
              local d = shared(st.rec)
              if d ~= '' then out[#out + 1] = d end
              st.rec = nil
            end
            for i = 5, #ARGV, 2 do
              local f, c = ARGV[i], tonumber(ARGV[i + 1])
              local st = parse(redis.call('HGET', KEYS[1], f))
              if st and isflood(f) then
                if st.rec and c > 0 and st.count >= c then
                  st.count = st.count - c
                  st.shown = 1
                  st.shownAt = now - now % 60000
                  if st.count == 0 then drop(st) end
                  redis.call('HSET', KEYS[1], f, encode(st))
                  redis.call('ZADD', KEYS[2], due(st, 60000, 60000), f)
                end
              elseif st and c > st.shown then
                st.shown = c
                st.shownAt = now
                if st.count <= c then drop(st) end
                redis.call('HSET', KEYS[1], f, encode(st))
                redis.call('ZADD', KEYS[2], due(st, window, update), f)
              end
            end
            redis.call('PEXPIRE', KEYS[1], ARGV[4])
            redis.call('PEXPIRE', KEYS[2], ARGV[4])
            return out
            """)

    /// KEYS[1]: a shared event. ARGV: its bytes, the references to count, its TTL (ms). Writes the bytes when the
    /// copy is not there yet, adds the references, renews the TTL; returns the references counted.
    static let share = LoadedScript(
        """
        if redis.call('HEXISTS', KEYS[1], 'e') == 0 then redis.call('HSET', KEYS[1], 'e', ARGV[1]) end
        local n = redis.call('HINCRBY', KEYS[1], 'n', ARGV[2])
        redis.call('PEXPIRE', KEYS[1], ARGV[3])
        return n
        """)

    /// KEYS[1]: a shared event. ARGV: references given back. The copy is deleted when none is left; one that is
    /// gone stays gone. Returns the references left.
    static let release = LoadedScript(
        """
        if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
        local n = redis.call('HINCRBY', KEYS[1], 'n', -tonumber(ARGV[1]))
        if n <= 0 then
          redis.call('DEL', KEYS[1])
          return 0
        end
        return n
        """)
}

extension BurstStep {
    fileprivate var isHeld: Bool {
        if case .held = self { return true }
        return false
    }
}
