import Foundation
import Testing

@testable import HeraldRedis

/// The parts of the cluster client that need no server: URLs, slots of known keys, cutting a batch into units.
@Suite("Redis Cluster routing without a server")
struct RedisClusterRoutingTests {
    @Test("redis+cluster:// names the seed nodes; credentials and options apply to every node")
    func clusterURL() throws {
        let configuration = try RedisConfiguration(
            url: "redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2,[::1]:7002")
        #expect(configuration.isCluster)
        #expect(
            configuration.clusterSeeds == [
                RedisNodeAddress(host: "10.0.0.1", port: 7000), RedisNodeAddress(host: "10.0.0.2", port: 6379),
                RedisNodeAddress(host: "::1", port: 7002),
            ])
        #expect(configuration.username == "app")
        #expect(configuration.password == "s@cret")
        #expect(configuration.host == "10.0.0.1" && configuration.port == 7000)
        let node = configuration.node(RedisNodeAddress(host: "10.0.0.9", port: 7009))
        #expect(node.host == "10.0.0.9" && node.port == 7009 && !node.isCluster)
        #expect(node.username == "app" && node.password == "s@cret")
        #expect(!configuration.description.contains("cret"))
        #expect(configuration.description == "redis+cluster://app:***@10.0.0.1:7000,10.0.0.2:6379,[::1]:7002")
        #expect(
            RedisConfiguration.redacted("redis+cluster://app:pw@h1:1,h2:2") == "redis+cluster://app:***@h1:1,h2:2")
        #expect(RedisConfiguration.redacted("redis+cluster://h1:1,h2:2") == "redis+cluster://h1:1,h2:2")

        #expect(!(try RedisConfiguration(url: "redis://127.0.0.1:6379")).isCluster)
        #expect(throws: RedisError.self) { try RedisConfiguration(url: "redis+cluster://h1:1,,h2:2") }
        #expect(throws: RedisError.self) { try RedisConfiguration(url: "redis+cluster://h1:1,h2:99999") }
        #expect(throws: RedisError.self) { try RedisConfiguration(url: "redis+cluster://h1:1/3") }
        #expect(throws: RedisError.self) { try RedisConfiguration(url: "redis+cluster://") }
    }

    @Test("slots of the keys the cluster specification gives, and hash tags")
    func slots() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT` (the cluster test checks many more).
        #expect(RedisSlot.of("123456789") == 0x31C3 & 16383)
        #expect(RedisSlot.of("foo") == 12182)
        #expect(RedisSlot.of("{user1000}.following") == RedisSlot.of("{user1000}.followers"))
        #expect(RedisSlot.of("{user1000}.following") == RedisSlot.of("user1000"))
        #expect(RedisSlot.of("foo{}{bar}") != RedisSlot.of("bar"))  // empty first tag: the whole key is hashed
        #expect(RedisSlot.of("foo{{bar}}zap") == RedisSlot.of("{bar"))
        #expect(RedisSlot.of("foo{bar}{zap}") == RedisSlot.of("bar"))
        #expect(
            RedisSlot.of(RedisKeys.userState(app: "a", user: "u1"))
                == RedisSlot.of(RedisKeys.mentions(app: "a", user: "u1")))
    }

    @Test("a batch is cut into units: one per command, one per MULTI..EXEC, keyed by the first key")
    func units() throws {
        let commands = [
            RedisCommand("GET", "{u1}:a"),
            RedisCommand("MULTI"),
            RedisCommand("DEL", "{u2}:a", "{u2}:b"),
            RedisCommand("HSET", "{u2}:c", "f", "v"),
            RedisCommand("EXEC"),
            RedisCommand("PING"),
            RedisCommand("EVAL", "return 1", 1, "{u3}:x", "arg"),
            RedisCommand("EVAL", "return 1", 0),
            RedisCommand("MULTI"),
            RedisCommand("SET", "{u4}:a", "1"),
            RedisCommand("DISCARD"),
        ]
        var bytes: [UInt8] = []
        for command in commands { bytes += command.encoded }
        let units = try RedisClusterBatch.units(of: bytes, count: commands.count)
        #expect(units.map(\.firstCommand) == [0, 1, 5, 6, 7, 8])
        #expect(units.map(\.commands) == [1, 4, 1, 1, 1, 3])
        #expect(
            units.map(\.slot) == [
                RedisSlot.of("u1"), RedisSlot.of("u2"), nil, RedisSlot.of("u3"), nil, RedisSlot.of("u4"),
            ])
        // Each unit's bytes are exactly its commands.
        #expect(Array(bytes[units[1].bytes]) == commands[1...4].flatMap(\.encoded))
        #expect(units.last?.bytes.upperBound == bytes.count)

        // A RedisBatch written piece by piece cuts the same way.
        let batch = StateStore.loadBatch(
            app: "a", users: ["u1", "u2", "u1"], unreadOf: [["c"], ["c"], []], preferencesOnly: ["u3"])
        let batchUnits = try RedisClusterBatch.units(of: batch.bytes, count: batch.count)
        #expect(batchUnits.map(\.slot) == ["u1", "u2", "u1", "u3"].map { RedisSlot.of($0) })

        #expect(throws: RedisError.self) { try RedisClusterBatch.units(of: Array("*1\r\n$3\r\nGE".utf8), count: 1) }
        #expect(throws: RedisError.self) { try RedisClusterBatch.units(of: commands[0].encoded, count: 2) }
    }
}
