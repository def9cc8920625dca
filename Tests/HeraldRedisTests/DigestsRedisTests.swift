import Foundation
import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

/// The digest scripts (docs/behaviour.md §6d, docs/redis-keys.md "Digests"): each (event, user) counted once, per
/// conversation with its name, bounded; scheduled at the window's end; a `mark_read` takes its conversation out;
/// a claim leases; a confirmation forgets; every key of a user's digest is in the user's slot.
@Suite("Digests in Redis")
struct DigestsRedisTests {
    static let end: Int64 = 1_800_000_000_000

    static func count(
        _ user: String, _ event: String, _ conversation: String, _ name: String = "", end: Int64 = end,
        window: DigestSummary.Window = .dnd
    ) -> DigestCount {
        DigestCount(
            appID: "a", user: user, eventID: event, conversation: conversation, name: name, window: window,
            end: end, deadlineMilliseconds: 3_600_000)
    }

    @Test("counting, replays, mark_read, claim with a lease and confirmation")
    func lifecycle() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let now = Self.end - 60_000
        let first = [
            Self.count("u1", "e1", "c1", "Hiking"), Self.count("u1", "e2", "c1", "Hiking"),
            Self.count("u1", "e3", "c2", "Work"), Self.count("}odd", "e1", "c1", "Hiking"),
        ]
        #expect(try await store.countDigests(first, now: now) == [true, true, true, true])
        // A replay of the batch counts nothing again.
        #expect(try await store.countDigests(first, now: now) == [false, false, false, false])
        #expect(try await store.countDigests([Self.count("u1", "e4", "c2", "Work")], now: now) == [true])
        // Nothing is due before the window's end.
        #expect(try await store.claimDueDigests(app: "a", now: Self.end - 1).isEmpty)
        // The user read c1 meanwhile: its part is gone; the odd id's digest is untouched.
        try await store.markRead(app: "a", user: "u1", conversation: "c1")
        let due = try await store.claimDueDigests(app: "a", now: Self.end)
        #expect(due.map(\.user).sorted() == ["u1", "}odd"])
        let u1 = try #require(due.first { $0.user == "u1" })
        #expect(u1.messages == 2 && u1.end == Self.end && u1.window == .dnd && u1.other == 0)
        #expect(u1.conversations == [DueDigest.Conversation(id: "c2", name: "Work", count: 2)])
        let odd = try #require(due.first { $0.user == "}odd" })
        #expect(odd.messages == 1 && odd.conversations.map(\.name) == ["Hiking"])
        // Leased: not taken again until the lease passes.
        #expect(try await store.claimDueDigests(app: "a", now: Self.end + 1_000).isEmpty)
        let again = try await store.claimDueDigests(
            app: "a", now: Self.end + StateStore.digestLeaseMilliseconds + 1)
        #expect(again.map(\.user).sorted() == ["u1", "}odd"])
        for digest in again { try await store.confirmDigest(app: "a", digest) }
        #expect(
            try await store.claimDueDigests(app: "a", now: Self.end + 10 * StateStore.digestLeaseMilliseconds)
                .isEmpty)
        // Only the schedule's shards are left, no user's digest.
        let keys = (try await redis.send("KEYS", "*").array ?? []).compactMap(\.text)
        #expect(keys.allSatisfy { $0.contains(":digest_due:{g") }, "\(keys)")
    }

    @Test("a user's digest is in the user's slot, bounded, and expires")
    func boundedAndTagged() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let now = Self.end - 60_000
        let counts = (0..<300).map { i in
            Self.count("u1", "e\(i)", "c\(i)", "Conversation \(i)")
        }
        #expect(try await store.countDigests(counts, now: now).allSatisfy { $0 })
        let key = RedisKeys.digest(app: "a", user: "u1")
        #expect(key.hasPrefix(RedisKeys.userPrefix(app: "a", user: "u1")))
        #expect(RedisKeys.digest(app: "a", user: "}x").hasPrefix("herald:a:user:hex{0x"))
        let fields = try await redis.send("HLEN", key).int ?? 0
        // c: fields, end, w, total, n, other, s.
        #expect(fields == Int64(Digest.maxConversations) + 6)
        let pttl = try await redis.send("PTTL", key).int ?? -1
        #expect(pttl > 3_600_000 && pttl <= 60_000 + 3_600_000 + 3_600_000)
        // The bound of docs/capacity.md: a user's digest at its largest (100 conversations by name, the fingerprints
        // of 256 events), and a usual one (a few messages in two conversations).
        let largest = try await redis.send("MEMORY", "USAGE", key).int ?? 0
        #expect(largest > 0 && largest < 9_000, "MEMORY USAGE \(largest)")
        _ = try await store.countDigests(
            [Self.count("u9", "e1", "c1", "Hiking"), Self.count("u9", "e2", "c2", "Work")], now: now)
        let usual = try await redis.send("MEMORY", "USAGE", RedisKeys.digest(app: "a", user: "u9")).int ?? 0
        #expect(usual > 0 && usual < 300, "MEMORY USAGE \(usual)")
        print("digest MEMORY USAGE: largest \(largest), usual \(usual)")
        let seen = try await redis.send("HSTRLEN", key, "s").int ?? 0
        #expect(seen == Int64(Digest.seenEvents * 8))
        let due = try await store.claimDueDigests(app: "a", now: Self.end)
        let big = try #require(due.first { $0.user == "u1" })
        #expect(due.count == 2 && big.messages == counts.count && big.other == 200)
        #expect(big.conversations.count == Digest.maxConversations)
        // A mark_read of everything leaves nothing to send (and keeps what was counted, so a replay stays out).
        try await store.markRead(app: "a", user: "u1", conversation: nil)
        #expect(try await store.countDigests([counts.last!], now: now) == [false])
        let after = try await store.claimDueDigests(
            app: "a", now: Self.end + StateStore.digestLeaseMilliseconds + 1)
        let emptied = try #require(after.first { $0.user == "u1" })
        #expect(emptied.messages == 0 && emptied.conversations.isEmpty)
    }

    @Test("a later window moves the schedule; a reschedule moves it; confirming an older window keeps a newer one")
    func reschedule() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = StateStore(connection: redis)
        let now = Self.end - 60_000
        _ = try await store.countDigests([Self.count("u1", "e1", "c1", "Hiking")], now: now)
        _ = try await store.countDigests(
            [Self.count("u1", "e2", "c1", "Hiking", end: Self.end + 60_000, window: .snooze)], now: now)
        #expect(try await store.claimDueDigests(app: "a", now: Self.end).isEmpty)
        let due = try await store.claimDueDigests(app: "a", now: Self.end + 60_000)
        #expect(due.count == 1 && due[0].window == .snooze && due[0].messages == 2)
        try await store.rescheduleDigest(
            app: "a", due[0], window: .dnd, end: Self.end + 120_000, deadlineMilliseconds: 3_600_000,
            now: Self.end + 60_000)
        #expect(try await store.claimDueDigests(app: "a", now: Self.end + 119_999).isEmpty)
        let moved = try await store.claimDueDigests(app: "a", now: Self.end + 120_000)
        #expect(moved.count == 1 && moved[0].end == Self.end + 120_000 && moved[0].window == .dnd)
        // Confirming the claim of the older window (a process that was slow) does not forget the newer one.
        try await store.confirmDigest(app: "a", due[0])
        #expect(try await redis.send("EXISTS", RedisKeys.digest(app: "a", user: "u1")).int == 1)
        try await store.confirmDigest(app: "a", moved[0])
        #expect(try await redis.send("EXISTS", RedisKeys.digest(app: "a", user: "u1")).int == 0)
    }
}
