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
