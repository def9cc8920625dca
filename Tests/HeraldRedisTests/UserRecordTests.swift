import Foundation
import HeraldCore
import Testing

@testable import HeraldRedis

@Suite("The stored forms of a user's state hash")
struct UserRecordTests {
    /// The `o` field's rule, written the plain way: split into non-empty lines, an expiry of 1 to 18 digits before
    /// the first space, the rest of the line the token.
    static func onlineByRule(_ data: Data, now: Int64) -> [String] {
        var tokens: [String] = []
        for line in data.split(separator: 10) {
            guard let space = line.firstIndex(of: 32) else { continue }
            let digits = line[line.startIndex..<space]
            guard !digits.isEmpty, digits.count <= 18, digits.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { continue }
            let expiry = digits.reduce(Int64(0)) { $0 * 10 + Int64($1 - 48) }
            if expiry > now { tokens.append(String(decoding: line[(space + 1)...], as: UTF8.self)) }
        }
        return tokens
    }

    @Test("presence lines: live tokens in stored order; expired, malformed and empty lines left out")
    func onlineLines() {
        let now: Int64 = 1_732_000_000_000
        let lines = [
            "1732000000001 tok-live",
            "1732000000000 tok-expired-now",
            "x732000000001 tok-bad-digit",
            "",
            "1732000000005 ",
            "1732000000006",
            "no-space-at-all",
            "1732000000009 tok-second",
            "1000000000000000000 tok-19-digits",
            " tok-no-expiry",
            "1732000000003 tok with spaces",
        ]
        let field = Data(lines.joined(separator: "\n").utf8)
        #expect(
            UserRecord.decodeOnline(field, now: now) == ["tok-live", "", "tok-second", "tok with spaces"],
            "an expiry followed by a space and nothing else is an empty token; a line without a space, or with 19 digits, is not read"
        )
        #expect(UserRecord.decodeOnline(Data(), now: now).isEmpty)
        #expect(UserRecord.decodeOnline(Data("\n\n".utf8), now: now).isEmpty)
        #expect(UserRecord.decodeOnline(Data("99 a".utf8), now: 98) == ["a"], "no trailing newline")
    }

    @Test("presence lines: the same tokens as the plain reading, over random fields")
    func onlineMatchesRule() {
        var rng = SystemRandomNumberGenerator()
        // A small alphabet, so that newlines, spaces, digits and other bytes meet in every order.
        let alphabet: [UInt8] = Array("0123456789 \nab".utf8) + [0xC3, 0xA9]
        for _ in 0..<2_000 {
            let length = Int.random(in: 0..<60, using: &rng)
            let bytes = (0..<length).map { _ in alphabet.randomElement(using: &rng)! }
            let now = Int64.random(in: 0..<1_000, using: &rng)
            let data = Data(bytes)
            #expect(
                UserRecord.decodeOnline(data, now: now) == Self.onlineByRule(data, now: now),
                "field \(bytes), now \(now)")
        }
    }
}

@Suite("Send's pairs grouped by idempotency hash")
struct DeliveryGroupingTests {
    @Test("every pair in exactly one group, in pair order; groups in order of first appearance; one key per group")
    func groups() throws {
        // No command is sent: the store only groups.
        let store = StateStore(
            connection: RedisConnection(configuration: RedisConfiguration(port: 1)), deliveredShards: 4)
        let window: Int64 = 3_600_000
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<300 {
            let count = Int.random(in: 0..<40, using: &rng)
            // A few events, often one after another (as a batch's pairs come), with or without their time.
            let pairs = (0..<count).map { index -> DeliveryPair in
                let event = "e\(Int.random(in: 0..<(index % 3 == 0 ? 12 : 2), using: &rng))"
                let time: Int64? = Bool.random(using: &rng) ? nil : Int64.random(in: 0..<3, using: &rng) * window
                return DeliveryPair(eventID: event, token: "t\(index)", eventTime: time)
            }
            let groups = store.deliveryGroups(pairs, window: window)
            // The plain reading: a key per pair, groups by first appearance.
            var expected: [(key: DeliveryGroup.Key, indices: [Int])] = []
            for (index, pair) in pairs.enumerated() {
                let key = DeliveryGroup.Key(
                    shard: RedisKeys.deliveredShard(eventId: pair.eventID, of: 4),
                    filed: StateStore.filedWindow(pair, window: window))
                if let at = expected.firstIndex(where: { $0.key == key }) {
                    expected[at].indices.append(index)
                } else {
                    expected.append((key, [index]))
                }
            }
            try #require(groups.count == expected.count, "pairs \(pairs)")
            for (group, want) in zip(groups, expected) {
                #expect(DeliveryGroup.Key(shard: group.shard, filed: group.filed) == want.key)
                #expect(Array(group.indices) == want.indices)
                #expect(group.indices.enumerated().map(\.offset) == Array(0..<want.indices.count))
            }
        }
    }
}
