import HeraldCore
import HeraldRedis
import HeraldTestSupport
import Testing

@Suite("The explain trail in a real redis-server")
struct ExplainStoreTests {
    static let hour: Int64 = 3_600_000
    static let t0: Int64 = 1_732_000_000_000

    @Test(
        "why a user was not notified is kept per event, with a TTL; routine entries are not; users get a last decision")
    func compactTrail() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let ttl: Int64 = 86_400_000
        let store = ExplainStore(connection: redis, ttlMilliseconds: ttl)
        let t = Self.t0
        let before = try await redis.send("DBSIZE").int ?? -1
        try await store.record([
            ExplainEntry(appID: "app1", eventID: "a", stage: "resolve", decision: "fanned_out", at: t + 1, count: 2),
            ExplainEntry(appID: "app1", eventID: "a", user: "u1", stage: "suppress", decision: "deliver", at: t + 2),
            ExplainEntry(
                appID: "app1", eventID: "b", user: "u1", stage: "suppress", decision: "suppress", reason: "muted",
                at: t + 3),
            ExplainEntry(appID: "app2", eventID: "a", user: "u9", stage: "render", decision: "error", at: t + 4),
            ExplainEntry(
                appID: "app1", eventID: "a", user: "u2", stage: "suppress", decision: "suppress", reason: "dnd",
                at: t + 5),
            ExplainEntry(
                appID: "app1", eventID: "a", user: "u1", token: "t1", stage: "send", decision: "delivered", at: t + 6,
                status: 200, attempt: 1),
            ExplainEntry(
                appID: "app1", eventID: "a", user: "u3", token: "t3", stage: "send", decision: "retry",
                reason: "TooManyRequests", at: t + 7, status: 429, attempt: 1),
        ])
        // A device retried, then delivered on a later attempt: the latest entry wins (in the next hour).
        try await store.record([
            ExplainEntry(
                appID: "app1", eventID: "a", user: "u3", token: "t3", stage: "send", decision: "delivered",
                at: t + Self.hour, status: 200, attempt: 2)
        ])
        let now = t + Self.hour + 10
        let a = try await store.trail(app: "app1", eventID: "a", now: now)
        #expect(a.map(\.at) == [t + 5, t + Self.hour], "the dnd suppression, then u3's delivery on attempt 2: \(a)")
        #expect(try await store.trail(app: "app1", eventID: "b", now: now).map(\.reason) == ["muted"])
        #expect(try await store.trail(app: "app2", eventID: "a", now: now).map(\.at) == [t + 4], "another app")
        // Four keys for all of it: two hourly logs of app1 (a and b may share a shard), one of app2, and the
        // last-decision shards; every log expires.
        let keys = (try await redis.send("KEYS", "*").array ?? []).compactMap(\.text)
        #expect(Int64(keys.count) - before <= 7, "\(keys)")
        for key in keys where key.contains(":explain:") {
            let pttl = try await redis.send(RedisCommand("PTTL", key)).int ?? -3
            #expect(pttl > 0 && pttl <= ttl + Self.hour, "\(key) expires (PTTL \(pttl))")
        }
        // u1's last user-level entry was event b's (the device entry does not count), with that event's trail.
        let last = try await store.lastDecision(app: "app1", user: "u1", now: now)
        #expect(last?.decision.eventID == "b")
        #expect(last?.decision.decision == "suppress")
        #expect(last?.trail.map(\.reason) == ["muted"])
        #expect(try await store.lastDecision(app: "app1", user: "u2", now: now)?.decision.reason == "dnd")
        #expect(try await store.lastDecision(app: "app2", user: "u9", now: now)?.decision.decision == "error")
        #expect(try await store.lastDecision(app: "app1", user: "nobody", now: now) == nil)
        // Past the retention, the trail is no longer read.
        #expect(try await store.trail(app: "app1", eventID: "a", now: t + ttl + 3 * Self.hour).isEmpty)
    }

    @Test("with more shards each user's decision and each event's log lines are in the keys of that count")
    func shardCounts() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let wide = ExplainStore(connection: redis, lastDecisionShards: 100_000, logShards: 4096)
        let t = Self.t0
        let users = (0..<30).map { "user-\($0)" }
        try await wide.record(
            users.map {
                ExplainEntry(
                    appID: "app1", eventID: "e-\($0)", user: $0, stage: "suppress", decision: "suppress",
                    reason: "dnd", at: t)
            })
        var logs = Set<UInt64>()
        for user in users {
            let event = "e-\(user)"
            #expect(try await wide.trail(app: "app1", eventID: event, now: t + 10).map(\.user) == [user])
            let shard = RedisKeys.explainShard(eventId: event, of: 4096)
            logs.insert(shard)
            let log = RedisKeys.explainLog(app: "app1", shard: shard, hour: t / Self.hour)
            #expect(try await redis.send("LLEN", log).int ?? 0 >= 1, "\(event) in \(log)")
        }
        #expect(logs.count > 25, "30 events over 4,096 log shards: \(logs.count)")
        var shards = Set<UInt64>()
        for user in users {
            #expect(try await wide.lastDecision(app: "app1", user: user, now: t + 10)?.decision.reason == "dnd")
            let shard = RedisKeys.lastDecisionShard(user: user, of: 100_000)
            shards.insert(shard)
            let stored = try await redis.send("HGET", RedisKeys.lastDecisions(app: "app1", shard: shard), user)
            #expect(stored.data != nil, "\(user) in shard \(shard)")
        }
        #expect(shards.count > 25, "30 users over 100,000 shards land in nearly as many hashes: \(shards.count)")
        // A store with the default counts looks in other keys.
        let narrow = ExplainStore(connection: redis)
        var found = 0
        for user in users where try await narrow.lastDecision(app: "app1", user: user, now: t + 10) != nil {
            found += 1
        }
        #expect(found < users.count)
        var traced = 0
        for user in users where try await !narrow.trail(app: "app1", eventID: "e-\(user)", now: t + 10).isEmpty {
            traced += 1
        }
        #expect(traced < users.count)
    }

    @Test("keeps says whether record writes anything of an entry")
    func keepsAgreesWithTheCommands() async throws {
        let server = try await RedisServer.start()
        let t = Self.t0
        let entries = [
            // A first-attempt delivery (routine, about a device): nothing is written.
            ExplainEntry(
                appID: "app1", eventID: "e1", user: "u1", token: "tok", stage: "send", decision: "delivered", at: t,
                status: 200, attempt: 1),
            // A delivery after a retry: a log line.
            ExplainEntry(
                appID: "app1", eventID: "e1", user: "u1", token: "tok", stage: "send", decision: "delivered", at: t,
                status: 200, attempt: 2),
            // The fan-out (routine, about the event): nothing.
            ExplainEntry(appID: "app1", eventID: "e1", stage: "resolve", decision: "fanned_out", at: t, count: 5),
            // A decision to deliver (routine, about a user): the user's latest decision.
            ExplainEntry(appID: "app1", eventID: "e1", user: "u1", stage: "suppress", decision: "deliver", at: t),
            // A suppression: a log line and the latest decision.
            ExplainEntry(
                appID: "app1", eventID: "e1", user: "u1", stage: "suppress", decision: "suppress", reason: "dnd",
                at: t),
            // A routine entry of a user the full trail lists.
            ExplainEntry(
                appID: "app1", eventID: "e1", user: "vip", token: "tok", stage: "send", decision: "delivered", at: t,
                status: 200, attempt: 1),
        ]
        let policy = FullTrailPolicy(users: ["vip"])
        let store = ExplainStore(connection: RedisConnection(configuration: server.configuration), fullTrail: policy)
        defer { store.connection.close() }
        #expect(entries.map(store.keeps) == [false, true, false, true, true, true])
        for entry in entries {
            let written = !ExplainStore.batch([entry], ttlMilliseconds: 1000, fullTrail: policy).isEmpty
            #expect(store.keeps(entry) == written, "\(entry)")
        }
    }

    @Test("the full trail keeps routine entries of listed users, listed apps and sampled events")
    func fullTrail() async throws {
        let server = try await RedisServer.start()
        let redis = RedisConnection(configuration: server.configuration)
        defer { redis.close() }
        let store = ExplainStore(
            connection: redis, fullTrail: FullTrailPolicy(users: ["vip"], apps: ["app3"], sample: 0))
        let t = Self.t0
        func deliver(_ app: String, _ event: String, _ user: String) -> [ExplainEntry] {
            [
                ExplainEntry(appID: app, eventID: event, user: user, stage: "suppress", decision: "deliver", at: t),
                ExplainEntry(
                    appID: app, eventID: event, user: user, token: "tok-\(user)", stage: "send",
                    decision: "delivered", at: t + 1, status: 200, attempt: 1),
            ]
        }
        try await store.record(
            deliver("app1", "e1", "vip") + deliver("app1", "e1", "plain") + deliver("app3", "e2", "x"))
        let e1 = try await store.trail(app: "app1", eventID: "e1", now: t + 5)
        #expect(e1.map(\.decision) == ["deliver", "delivered"] && e1.allSatisfy { $0.user == "vip" }, "\(e1)")
        #expect(try await store.trail(app: "app3", eventID: "e2", now: t + 5).count == 2)

        // A sampled share picks whole events, the same in every stage.
        let sampled = ExplainStore(connection: redis, fullTrail: FullTrailPolicy(sample: 0.5))
        var kept = 0
        for i in 0..<200 { kept += sampled.fullTrail.wantsAll(deliver("app1", "s\(i)", "u")[0]) ? 1 : 0 }
        #expect(kept > 60 && kept < 140, "about half of 200 events: \(kept)")
        for i in 0..<200 {
            let pair = deliver("app1", "s\(i)", "u")
            #expect(sampled.fullTrail.wantsAll(pair[0]) == sampled.fullTrail.wantsAll(pair[1]))
        }
    }

    @Test("a line reads back as the entry it was written from, whatever the ids hold")
    func lineRoundTrip() throws {
        let entries = [
            ExplainEntry(
                appID: "a", eventID: "e\t1\\n", user: "u\n2", token: "t", stage: "send", decision: "dlq",
                reason: "Bad\\Token", at: 12, status: 410, attempt: 3, count: nil),
            ExplainEntry(appID: "a", eventID: "ü", stage: "ingest", decision: "drop", at: -1, count: 7),
        ]
        for e in entries {
            var line: [UInt8] = []
            e.writeLine(into: &line)
            #expect(line.last == 10 && line.filter { $0 == 10 }.count == 1)
            #expect(try ExplainEntry(line: line, appID: "a") == e)
            #expect(try ExplainEntry(line: line.dropLast(), appID: "a") == e)
        }
        #expect(throws: StageRecordError.self) { try ExplainEntry(line: Array("x\ty".utf8), appID: "a") }
        // Numbers are written digit by digit: zero, a ten, the extremes.
        for (at, text) in [
            (Int64(0), "0"), (10, "10"), (Int64.max, "9223372036854775807"), (Int64.min, "-9223372036854775808"),
        ] {
            var line: [UInt8] = []
            ExplainEntry(appID: "a", eventID: "e", stage: "send", decision: "retry", at: at, attempt: 10).writeLine(
                into: &line)
            #expect(String(decoding: line, as: UTF8.self) == "e\t\t\td\tr\t\t\(text)\t\t10\n")
        }
        // In an hourly log the time counts from the hour's start (7 digits, not 13); a line written with an
        // absolute time reads the same.
        let hourStart: Int64 = 1_732_006_800_000
        let e = ExplainEntry(
            appID: "a", eventID: "e", user: "u", stage: "suppress", decision: "suppress", reason: "dnd",
            at: hourStart + 1_234_567)
        var relative: [UInt8] = []
        e.writeLine(into: &relative, base: hourStart)
        #expect(String(decoding: relative, as: UTF8.self) == "e\tu\t\ts\ts\tdnd\t1234567\n")
        #expect(try ExplainEntry(line: relative, appID: "a", base: hourStart) == e)
        var absolute: [UInt8] = []
        e.writeLine(into: &absolute)
        #expect(try ExplainEntry(line: absolute, appID: "a", base: hourStart) == e)
    }

    @Test("stages and decisions are stored as one-letter codes; lines in the spelled-out form still read")
    func lineCodes() throws {
        let stages = ["ingest", "resolve", "suppress", "render", "send", "registry"]
        let decisions = [
            "classified", "drop", "fanned_out", "deliver", "suppress", "error", "delivered", "duplicate", "retry",
            "token_dead", "dlq", ReadSync.explainDecision,
        ]
        var codes: Set<String> = []
        for stage in stages {
            for decision in decisions {
                let e = ExplainEntry(
                    appID: "a", eventID: "e", user: "u", stage: stage, decision: decision, reason: "r", at: 5)
                var line: [UInt8] = []
                e.writeLine(into: &line)
                let fields = line.dropLast().split(separator: 9, omittingEmptySubsequences: false)
                #expect(fields.count == 7, "nothing after `at`: \(fields.count) fields")
                #expect(fields[3].count == 1 && fields[4].count == 1, "\(stage) / \(decision)")
                codes.insert(String(decoding: fields[3] + [UInt8(ascii: "/")] + fields[4], as: UTF8.self))
                #expect(try ExplainEntry(line: line, appID: "a") == e)
            }
        }
        #expect(codes.count == stages.count * decisions.count, "every pair stored apart")
        // The form written before the codes: names spelled out, all ten fields.
        let old = Array("e\tu\t\tsuppress\tsuppress\tdnd\t1234567\t\t\t".utf8)
        #expect(
            try ExplainEntry(line: old, appID: "a", base: 1_000_000_000)
                == ExplainEntry(
                    appID: "a", eventID: "e", user: "u", stage: "suppress", decision: "suppress", reason: "dnd",
                    at: 1_001_234_567))
        let oldDevice = Array("e\tu\tt\tsend\tretry\tUnavailable\t7\t503\t2\t\n".utf8)
        #expect(
            try ExplainEntry(line: oldDevice, appID: "a")
                == ExplainEntry(
                    appID: "a", eventID: "e", user: "u", token: "t", stage: "send", decision: "retry",
                    reason: "Unavailable", at: 7, status: 503, attempt: 2))
        // A one-letter value that is not a code keeps its letter; a code this build does not know reads as itself.
        let letters = ExplainEntry(appID: "a", eventID: "e", stage: "s", decision: "\\", at: 1, count: 2)
        var line: [UInt8] = []
        letters.writeLine(into: &line)
        #expect(try ExplainEntry(line: line, appID: "a") == letters)
        let unknown = try ExplainEntry(line: Array("e\t\t\tz\tw\t\t1".utf8), appID: "a")
        #expect(unknown.stage == "z" && unknown.decision == "w")
        // Too few fields (no `at`) or too many are refused.
        #expect(throws: StageRecordError.self) { try ExplainEntry(line: Array("e\tu\t\ts\ts\tdnd".utf8), appID: "a") }
        #expect(throws: StageRecordError.self) {
            try ExplainEntry(line: Array("e\tu\t\ts\ts\tdnd\t1\t2\t3\t4\t5".utf8), appID: "a")
        }
    }
}
