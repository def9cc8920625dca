import Foundation
import HeraldCore
import Testing

@testable import HeraldRedis

/// The reconnect and resubscribe waits as `BackoffPolicy`s, and node addresses read through `ServiceEndpoint`.
@Suite("Redis backoff policies and node addresses")
struct RedisBackoffAndAddressTests {
    /// The reconnect wait as it was written out by hand: `initialBackoff` doubling (at most 20 times) to
    /// `maximumBackoff`, times a factor in [0.5, 1].
    static func handWrittenReconnect(_ c: RedisConfiguration, failures: Int, factor: Double) -> Duration {
        min(c.initialBackoff * (1 << min(failures - 1, 20)), c.maximumBackoff) * factor
    }

    /// The resubscribe wait as it was written out by hand: doubling at most 10 times, no jitter.
    static func handWrittenResubscribe(_ c: RedisConfiguration, rounds: Int) -> Duration {
        min(c.initialBackoff * (1 << min(rounds - 1, 10)), c.maximumBackoff)
    }

    static let configurations = [
        RedisConfiguration(),
        RedisConfiguration(initialBackoff: .milliseconds(10), maximumBackoff: .seconds(60)),
        RedisConfiguration(initialBackoff: .nanoseconds(1), maximumBackoff: .seconds(100)),
        RedisConfiguration(initialBackoff: .seconds(2), maximumBackoff: .seconds(1)),
    ]

    @Test("the reconnect policy waits what the hand-written backoff waited, at both ends of its jitter")
    func reconnect() {
        for c in Self.configurations {
            let policy = c.reconnectBackoff
            for failures in 1...30 {
                #expect(
                    policy.delay(afterAttempt: failures, unit: 0)
                        == Self.handWrittenReconnect(c, failures: failures, factor: 1))
                // The policy counts whole nanoseconds; half of a 1 ns wait is rounded to one.
                let half = policy.delay(afterAttempt: failures, unit: 1)
                let handWrittenHalf = Self.handWrittenReconnect(c, failures: failures, factor: 0.5)
                #expect(half - handWrittenHalf < .nanoseconds(1) && handWrittenHalf - half < .nanoseconds(1))
            }
        }
        // The defaults: 50 ms, 100 ms, 200 ms ... up to 5 s.
        let defaults = RedisConfiguration().reconnectBackoff
        #expect(defaults.delay(afterAttempt: 1, unit: 0) == .milliseconds(50))
        #expect(defaults.delay(afterAttempt: 3, unit: 0) == .milliseconds(200))
        #expect(defaults.delay(afterAttempt: 9, unit: 0) == .seconds(5))
        #expect(defaults.delay(afterAttempt: 9, unit: 1) == .milliseconds(2500))
    }

    @Test("the resubscribe policy waits what the hand-written backoff waited (the doubling stops after 10 steps)")
    func resubscribe() {
        for c in Self.configurations {
            for rounds in 1...30 {
                #expect(
                    c.resubscribeBackoff.delay(afterAttempt: rounds, unit: 0)
                        == Self.handWrittenResubscribe(c, rounds: rounds))
            }
        }
        let slow = RedisConfiguration(initialBackoff: .milliseconds(1), maximumBackoff: .seconds(100))
        #expect(slow.resubscribeBackoff.delay(afterAttempt: 25, unit: 0) == .milliseconds(1024))
        #expect(slow.resubscribeBackoff.delay(afterAttempt: 25, unit: 0.9) == .milliseconds(1024))
    }

    static let addressRows: [(String, String?, RedisNodeAddress?)] = [
        ("10.0.0.1:7000", nil, RedisNodeAddress(host: "10.0.0.1", port: 7000)),
        ("redis-a", nil, RedisNodeAddress(host: "redis-a", port: 6379)),
        ("[::1]:7002", nil, RedisNodeAddress(host: "::1", port: 7002)),
        ("[fe80::1]", nil, RedisNodeAddress(host: "fe80::1", port: 6379)),
        // Redis writes an IPv6 node without brackets in MOVED and ASK.
        ("::1:7003", nil, RedisNodeAddress(host: "::1", port: 7003)),
        ("2001:db8::7:6380", nil, RedisNodeAddress(host: "2001:db8::7", port: 6380)),
        // A node that does not know its own address writes an empty host: the answering node's stands in.
        (":7004", "10.0.0.9", RedisNodeAddress(host: "10.0.0.9", port: 7004)),
        (":7005", "::9", RedisNodeAddress(host: "::9", port: 7005)),
        ("10.0.0.2:7006", "10.0.0.9", RedisNodeAddress(host: "10.0.0.2", port: 7006)),
        (":7004", nil, nil),
        ("", nil, nil),
        ("host:", nil, nil),
        ("host:0", nil, nil),
        ("host:65536", nil, nil),
        ("host:port", nil, nil),
        ("[::1]:x", nil, nil),
    ]

    @Test(
        "node addresses: host:port, bare hosts, IPv6 with and without brackets, an empty host", arguments: addressRows)
    func addresses(text: String, defaultHost: String?, expected: RedisNodeAddress?) {
        let parsed = try? RedisNodeAddress(parsing: Substring(text), defaultHost: defaultHost)
        #expect(parsed == expected)
    }

    @Test("a node address is written as ServiceEndpoint writes it")
    func description() {
        #expect(RedisNodeAddress(host: "10.0.0.1", port: 7000).description == "10.0.0.1:7000")
        #expect(RedisNodeAddress(host: "::1", port: 7002).description == "[::1]:7002")
    }
}
