import Foundation
import HeraldCore
import HeraldPipeline
import HeraldRedis
import HeraldStage
import HeraldTestSupport
import Testing

// resolve's Redis side of the paged fan-out, against a real redis-server: SSCAN pages and the saved cursor.

@Suite(.serialized) struct RedisFanOutTests {
    @Test func pagesCoverEveryMemberAndSmallSetsComeWhole() async throws {
        let server = try await RedisServer.start()
        let connection = RedisConnection(configuration: RedisConfiguration(host: "127.0.0.1", port: server.port))
        defer { connection.close() }
        let members = (0..<5000).map { "user-\($0)" }
        var start = 0
        while start < members.count {
            let piece = Array(members[start..<min(members.count, start + 1000)])
            _ = try await connection.send(
                RedisCommand("SADD", [RedisKeys.members(app: "a", conversation: "big")] + piece))
            start += 1000
        }
        _ = try await connection.send(
            RedisCommand("SADD", RedisKeys.members(app: "a", conversation: "small"), "u1", "u2", "u3"))
        let reader = RedisStateReader(store: StateStore(connection: connection))
        let big = ConversationRef(appID: "a", conversation: "big")
        let small = ConversationRef(appID: "a", conversation: "small")

        let first = try await reader.memberPages([big, small], cursors: ["0", "0"], count: 500)
        #expect(first[1] == MemberPage(members: ["u1", "u2", "u3"], next: "0"))
        #expect(first[0].next != "0")
        #expect(first[0].members.count < 5000)
        var seen = Set(first[0].members)
        var cursor = first[0].next
        var pages = 1
        while cursor != "0" {
            let page = try #require(try await reader.memberPages([big], cursors: [cursor], count: 500).first)
            seen.formUnion(page.members)
            cursor = page.next
            pages += 1
        }
        #expect(seen == Set(members))
        #expect(pages > 2)
        #expect(try await reader.memberCount(big) == 5000)

        let progress = RedisFanOutProgress(connection: connection)
        #expect(try await progress.fanOutCursor(app: "a", eventID: "e1") == nil)
        try await progress.saveFanOutCursor(app: "a", eventID: "e1", cursor: "1234")
        #expect(try await progress.fanOutCursor(app: "a", eventID: "e1") == "1234")
        try await progress.saveFanOutCursor(app: "a", eventID: "e1", cursor: "done")
        #expect(try await progress.fanOutCursor(app: "a", eventID: "e1") == "done")
        let ttl = try await connection.send(RedisCommand("PTTL", RedisKeys.fanOut(app: "a", eventId: "e1")))
        #expect((ttl.int ?? 0) > 0)
    }
}

// resolve's read of its recipients' state, against a real redis-server: a user with counts in many conversations.
@Suite(.serialized) struct RedisResolveReadTests {
    @Test func aRecipientsUnreadCountsAreReadForItsBatchsConversationsOnly() async throws {
        let server = try await RedisServer.start()
        let connection = RedisConnection(configuration: RedisConfiguration(host: "127.0.0.1", port: server.port))
        defer { connection.close() }
        let store = StateStore(connection: connection)
        // u2 has unread counts in 200 conversations; the batch notifies them in two of them.
        var conversations: [String: Int] = [:]
        for k in 0..<200 { conversations["c\(k)"] = k % 7 + 1 }
        let u2 = UserState(
            devices: [Device(token: String(repeating: "ab", count: 32), kind: .apns, registeredAt: 1)],
            unread: Unread(total: conversations.values.reduce(0, +), conversations: conversations))
        try await store.loadFixture(
            app: "a",
            fixture: StateFixture(
                users: ["u1": UserState(), "u2": u2],
                conversations: [
                    "c3": ConversationState(members: ["u1", "u2"]), "c5": ConversationState(members: ["u1", "u2"]),
                ]),
            presenceTTLMilliseconds: 60_000, now: 1_732_000_000_000)
        let resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: RedisStateReader(store: store), pageSize: 100,
            progress: RedisFanOutProgress(connection: connection))
        func input(_ id: String, _ conversation: String) throws -> StageInput {
            let json = """
                {"event_id": "\(id)", "app_id": "a", "kind": "message", "created_at": 1732000000000,
                 "sender": {"id": "u1", "name": "U"}, "conversation": {"id": "\(conversation)", "type": "group"},
                 "message": {"id": "m-\(id)", "type": "text", "text": "Hi"}}
                """
            return StageInput(
                topic: "herald.ingested",
                value: StageCodec.encode(
                    IngestedRecord(event: try ChatEvent.decode(Array(json.utf8)), ingestedAt: 0)))
        }
        _ = try await connection.send(RedisCommand("CONFIG", "RESETSTAT"))
        let results = await resolve.process(
            [try input("e1", "c3"), try input("e2", "c5")],
            context: BatchContext(now: { Date(timeIntervalSince1970: 1_732_000_000.5) }))
        let stats = try await connection.send(RedisCommand("INFO", "commandstats")).text ?? ""
        func calls(_ command: String) -> Int {
            for line in stats.split(whereSeparator: \.isNewline) where line.hasPrefix("cmdstat_\(command):") {
                let value = line.split(separator: ",")[0].split(separator: "=")[1]
                return Int(value) ?? -1
            }
            return 0
        }
        // One HMGET of u2's state hash (devices, presence, preferences, the total and the two conversations' counts)
        // and one HGET of the sender's preferences; never every count.
        #expect(calls("hmget") == 1)
        #expect(calls("hget") == 1)
        #expect(calls("hgetall") == 0)
        // All of it in one hash: devices, preferences, the total and the 200 conversations' counts.
        let hlen = try await connection.send(RedisCommand("HLEN", RedisKeys.userState(app: "a", user: "u2")))
        #expect(hlen.int == Int64(3 + 200))

        #expect(results.count == 2)
        let records = try results.map { result in
            try StageCodec.decode(ResolvedRecord.self, from: try #require(result.outputs.first).value)
        }
        #expect(results.map(\.outputs.count) == [1, 1])
        #expect(records.map(\.recipient) == ["u2", "u2"])
        #expect(records[0].state.unread == Unread(total: u2.unread.total, conversations: ["c3": 4]))
        #expect(records[1].state.unread == Unread(total: u2.unread.total, conversations: ["c5": 6]))

        // The registry's read sync reads the total and the read conversation's count the same way.
        let readSync = RedisReadSyncStore(store: store)
        let read = try await readSync.userState(app: "a", user: "u2", conversation: "c3", now: 1_732_000_000_500)
        #expect(read.unread == Unread(total: u2.unread.total, conversations: ["c3": 4]))
        #expect(read.devices == u2.devices)
        let all = try await readSync.userState(app: "a", user: "u2", conversation: nil, now: 1_732_000_000_500)
        #expect(all.unread == Unread(total: u2.unread.total))
    }
}
