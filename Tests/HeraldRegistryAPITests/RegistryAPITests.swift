// The registry HTTP API over HTTP, against the real herald-registry executable, redis-server and Tansu: every
// write goes through herald.registry and herald-registry applies it; the tests read Redis to see the result.
// Needs `swift build` first (the executable), like the end-to-end suite.
import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldRegistryAPI
import HeraldTestSupport
import Logging
import Testing

/// Redis, Tansu and one herald-registry process with the API on, shared by the suite.
final class APIStack: Sendable {
    static let token = "backend-a-token-0123456789abcdef"
    static let otherToken = "backend-b-token-fedcba9876543210"
    static let scopedToken = "scoped-client-token-0123456789abcdef"
    /// The stack's preference caps, for heraldctl too.
    static let capEnvironment = [
        "HERALD_PREFERENCES_MAX_CONVERSATIONS": "60", "HERALD_PREFERENCES_MAX_BYTES": "8192",
    ]

    let redis: RedisServer
    let tansu: TansuBroker
    let registry: ChildProcess
    let apiPort: Int
    let metricsPort: Int
    let store: StateStore
    let connection: RedisConnection
    let dir: String

    init() async throws {
        redis = try await RedisServer.start()
        tansu = try await TansuBroker.start()
        try await tansu.createTopics([("herald.registry", 4), ("herald.token-feedback", 2), ("herald.dlq", 1)])
        dir = try temporaryDirectory("herald-api")
        let pipeline = """
            kafka:
              brokers: \(tansu.bootstrap)
            api:
              clients:
                backend-a: {token_env: API_TOKEN_BACKEND_A}
                scoped: {token_env: API_TOKEN_SCOPED, apps: [app2]}
            apps:
              app1:
                counts: true
              app2: {}
            """
        try pipeline.write(toFile: dir + "/pipeline.yaml", atomically: true, encoding: .utf8)
        apiPort = try freePort()
        metricsPort = try freePort()
        registry = ChildProcess(
            name: "herald-registry", executable: try Paths.executable("herald-registry"), arguments: [],
            environment: [
                "HERALD_PIPELINE": dir + "/pipeline.yaml",
                "HERALD_KAFKA_BROKERS": tansu.bootstrap,
                "HERALD_KAFKA_SESSION_TIMEOUT_MS": "3000",
                "HERALD_KAFKA_PROFILE": "local",
                "HERALD_BATCH_TIMEOUT_MS": "20",
                "HERALD_REDIS_URL": "redis://127.0.0.1:\(redis.port)",
                "HERALD_METRICS_PORT": "\(metricsPort)",
                "HERALD_API_PORT": "\(apiPort)",
                "HERALD_API_TOKENS": "backend-b=\(Self.otherToken)",
                "API_TOKEN_BACKEND_A": Self.token,
                "API_TOKEN_SCOPED": Self.scopedToken,
                "HERALD_LOG_LEVEL": "debug",
                // 1,000 connections at once in the limits suite; failures are not throttled here (the throttle
                // has its own test, RegistryAPIHeadCheckTests).
                "HERALD_HTTP_MAX_CONNECTIONS": "2000",
                "HERALD_API_AUTH_FAILURES_PER_MINUTE": "0",
            ].merging(Self.capEnvironment) { $1 }, logPath: dir + "/registry.log")
        HostileClients.raiseOpenFileLimit(to: 8192)
        try registry.start()
        let port = apiPort
        try await waitUntil("the registry API accepts connections", timeout: .seconds(120)) { [registry] in
            guard registry.isRunning else { throw TestSupportError("herald-registry exited: \(registry.logTail())") }
            return portAcceptsConnections(port)
        }
        var logger = Logger(label: "api-test")
        logger.logLevel = .critical
        connection = RedisConnection(
            configuration: try RedisConfiguration(url: "redis://127.0.0.1:\(redis.port)"), logger: logger)
        store = StateStore(connection: connection, logger: logger)
    }

    func call(
        _ method: String, _ path: String, body: String? = nil, token: String? = APIStack.token
    ) async throws -> TestHTTP.Answer {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer \(token)" }
        return try await TestHTTP.request(port: apiPort, method: method, path: path, headers: headers, body: body)
    }

    var redisURL: String { "redis://127.0.0.1:\(redis.port)" }

    /// Publishes a record straight to herald.registry, past the API's checks (what a chat back end's own
    /// producer may do).
    func publishRaw(_ record: RegistryRecord) async throws {
        let producer = try KafkaProducer(
            configuration: KafkaProducerConfiguration(
                client: KafkaClientConfiguration(brokers: [tansu.bootstrap], clientID: "api-test")),
            logger: Logger(label: "api-test"))
        try await KafkaRegistrySink(producer: producer, topic: "herald.registry").publish(record)
        try await producer.shutdown(timeout: .seconds(10))
    }

    /// `calls` of one command in Redis's INFO commandstats (0 when never called).
    func commandCalls(_ command: String) async throws -> Int {
        let info = try await connection.send(RedisCommand("INFO", "commandstats")).data ?? Data()
        let text = String(decoding: info, as: UTF8.self)
        let lines = text.split(whereSeparator: { $0 == "\r" || $0 == "\n" })
        guard let line = lines.first(where: { $0.hasPrefix("cmdstat_\(command):") }),
            let calls = line.split(separator: ",").first?.split(separator: "=").last
        else { return 0 }
        return Int(calls) ?? 0
    }

    func stop() async {
        _ = await registry.stop(grace: .seconds(8))
        connection.close()
        tansu.stop()
        redis.kill()
    }

    static func hex(_ seed: Int) -> String {
        String(repeating: String(format: "%02x", seed % 256), count: 32)
    }
}

struct APIStackTrait: SuiteTrait, TestScoping {
    var isRecursive: Bool { false }

    func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        let stack = try await APIStack()
        do {
            try await APIStackHolder.$current.withValue(stack) { try await function() }
        } catch {
            Issue.record("herald-registry log:\n\(stack.registry.logTail(30))")
            await stack.stop()
            throw error
        }
        await stack.stop()
    }
}

enum APIStackHolder {
    @TaskLocal static var current: APIStack?
    static func stack() throws -> APIStack {
        guard let current else { throw TestSupportError("the suite needs the API stack trait") }
        return current
    }
}

@Suite("Registry API over HTTP (herald-registry, Redis, Tansu)", .serialized, APIStackTrait())
struct RegistryAPITests {
    @Test("no token or an unknown token is 401; an unknown route 404; a known route with another method 405")
    func authenticationAndRoutes() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/users/u1/preferences"
        let none = try await s.call("GET", path, token: nil)
        #expect(none.status == 401)
        #expect(none.json?["field"] as? String == "Authorization")
        #expect(try await s.call("GET", path, token: "backend-a-token-0123456789abcdeX").status == 401)
        #expect(try await s.call("GET", path, token: String(APIStack.token.dropLast())).status == 401)
        #expect(try await s.call("GET", path).status == 200)
        // The second client (from HERALD_API_TOKENS) is accepted too.
        #expect(try await s.call("GET", path, token: APIStack.otherToken).status == 200)
        #expect(try await s.call("GET", "/v1/apps/app1/users/u1/nothing").status == 404)
        #expect(try await s.call("GET", "/v2/apps/app1/users/u1/preferences").status == 404)
        #expect(try await s.call("DELETE", path).status == 405)
        // /healthz stays open (probes carry no token).
        #expect(try await s.call("GET", "/healthz", token: nil).status == 200)
        // Tokens are never logged (the debug log has a line per request).
        let log = try String(contentsOfFile: s.dir + "/registry.log", encoding: .utf8)
        #expect(log.contains("registry api request"))
        #expect(!log.contains(APIStack.token) && !log.contains(APIStack.otherToken) && !log.contains("0123456789abcde"))
        // Counted by route template, status and client name.
        let metrics = try await TestHTTP.request(port: s.metricsPort, method: "GET", path: "/metrics").body
        #expect(
            metrics.contains(
                #"herald_api_requests_total{stage="registry",route="unauthenticated",status="401",client="-"} 3"#),
            "\(metrics)")
        #expect(
            metrics.contains(
                #"herald_api_requests_total{stage="registry",route="GET /v1/apps/{app}/users/{user}/preferences",status="200",client="backend-b"} 1"#
            ))
        #expect(metrics.contains(#"route="method_not_allowed",status="405",client="backend-a"} 1"#))
    }

    @Test("bad bodies are 400 with a JSON error naming the field; nothing is written")
    func badRequests() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/users/u-bad/preferences"
        let cases: [(String, String)] = [
            (#"{"trigger": "sometimes"}"#, "trigger"),
            (#"{"dnd": {"start": "25:00", "end": "08:00"}}"#, "dnd.start"),
            (#"{"dnd": {"start": "22:00", "end": "08:00", "timezone": "Mars/Olympus"}}"#, "dnd.timezone"),
            (#"{"conversations": {"c1": {"muted": "yes"}}}"#, "conversations.c1.muted"),
            (#"{"languages": ["fr", "de", "es", "it", "ja"]}"#, "languages"),
            (#"{"colour": "blue"}"#, "colour"),
            (#"{"badge": 1}"#, "badge"),
            (#"{}"#, "(body)"),
            ("not json", "(body)"),
        ]
        for (body, field) in cases {
            let answer = try await s.call("PATCH", path, body: body)
            #expect(answer.status == 400, "\(body)")
            #expect(answer.json?["field"] as? String == field, "\(body): \(answer.body)")
            #expect((answer.json?["error"] as? String)?.isEmpty == false)
        }
        let device = try await s.call(
            "POST", "/v1/apps/app1/users/u-bad/devices", body: #"{"token": "not-hex", "kind": "apns"}"#)
        #expect(device.status == 400)
        #expect(device.json?["field"] as? String == "token")
        let presence = try await s.call("PUT", "/v1/apps/app1/users/u-bad/presence", body: #"{"online": "abc"}"#)
        #expect(presence.json?["field"] as? String == "online")
        // Numbers and sizes outside their InputRanges range: 400 naming the field (the limits herald-registry
        // applies to the same records from herald.registry).
        let outside: [(String, String, String)] = [
            ("PUT", "presence", #"{"online": [], "ttl_ms": 9223372036854775807}"#),
            ("PUT", "presence", #"{"online": [], "ttl_ms": 0}"#),
            ("PUT", "presence", #"{"online": [""]}"#),
            ("PUT", "presence", #"{"online": ["\#(String(repeating: "a", count: 4097))"]}"#),
            (
                "POST", "devices",
                #"{"token": "\#(APIStack.hex(20))", "bundle_id": "\#(String(repeating: "b", count: 257))"}"#
            ),
            (
                "POST", "devices",
                #"{"token": "t1", "kind": "fcm", "provider_id": "\#(String(repeating: "p", count: 257))"}"#
            ),
        ]
        for ((method, route, body), field) in zip(
            outside, ["ttl_ms", "ttl_ms", "online[0]", "online[0]", "bundle_id", "provider_id"])
        {
            let answer = try await s.call(method, "/v1/apps/app1/users/u-bad/\(route)", body: body)
            #expect(answer.status == 400, "\(route): \(answer.body)")
            #expect(answer.json?["field"] as? String == field, "\(route): \(answer.body)")
        }
        // Still the defaults: nothing reached Redis.
        let prefs = try await s.call("GET", path)
        #expect(prefs.json?["trigger"] as? String == "all")
        #expect(try await s.store.loadUser(app: "app1", user: "u-bad", now: 0).devices.isEmpty)
    }

    @Test("register (with unique), unregister one and all: applied by herald-registry in order")
    func devices() async throws {
        let s = try APIStackHolder.stack()
        let base = "/v1/apps/app1/users/u-dev/devices"
        for seed in 1...3 {
            let answer = try await s.call(
                "POST", base,
                body: #"{"token": "\#(APIStack.hex(seed))", "kind": "apns", "bundle_id": "com.example.chat"}"#)
            #expect(answer.status == 202, "\(answer.body)")
            #expect(answer.json?["op"] as? String == "register_device")
        }
        try await waitUntil("three devices registered") {
            try await s.store.loadUser(app: "app1", user: "u-dev", now: 0).devices.count == 3
        }
        // unique: this token becomes the user's only apns token.
        #expect(
            try await s.call("POST", base, body: #"{"token": "\#(APIStack.hex(9))", "unique": true}"#).status == 202)
        try await waitUntil("unique registration leaves one device") {
            try await s.store.loadUser(app: "app1", user: "u-dev", now: 0).devices.map(\.token) == [APIStack.hex(9)]
        }
        #expect(
            try await s.call("POST", base, body: #"{"token": "\#(APIStack.hex(10))", "kind": "voip"}"#).status == 202)
        #expect(try await s.call("DELETE", base + "/" + APIStack.hex(9)).status == 202)
        try await waitUntil("the apns token removed, the voip token kept") {
            try await s.store.loadUser(app: "app1", user: "u-dev", now: 0).devices.map(\.token) == [APIStack.hex(10)]
        }
        #expect(try await s.call("DELETE", base).status == 202)
        try await waitUntil("every device removed") {
            try await s.store.loadUser(app: "app1", user: "u-dev", now: 0).devices.isEmpty
        }
        // The registry releases the tokens' owner records in a round trip after the removal: waited for, not raced.
        try await waitUntil("the voip token's owner record released") {
            try await s.store.owner(app: "app1", token: APIStack.hex(10)) == nil
        }
    }

    @Test("two concurrent PATCHes of different fields both survive; a later GET shows both")
    func concurrentPatches() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/users/u-patch/preferences"
        // A starting point with fields neither patch touches, which must survive too.
        #expect(try await s.call("PATCH", path, body: #"{"languages": ["fr"], "display_name": "Cindy"}"#).status == 202)
        try await waitUntil("the first patch applied") {
            try await s.store.preferences(app: "app1", user: "u-patch").displayName == "Cindy"
        }
        async let a = s.call(
            "PATCH", path,
            body: #"{"trigger": "mention_only", "dnd": {"start": "22:00", "end": "08:00", "timezone": "Asia/Seoul"}}"#)
        async let b = s.call(
            "PATCH", path,
            body: #"{"conversations": {"c1": {"muted": true}, "c2": {"trigger": "off"}}, "badge": false}"#)
        let (ra, rb) = try await (a, b)
        #expect(ra.status == 202 && rb.status == 202, "\(ra.body) \(rb.body)")
        try await waitUntil("both patches applied") {
            let p = try await s.store.preferences(app: "app1", user: "u-patch")
            return p.trigger == .mentionOnly && p.conversations["c1"]?.muted == true
        }
        let got = try await s.call("GET", path)
        #expect(got.status == 200)
        let p = try Preferences.fromJSON(Array(got.body.utf8))
        #expect(p.trigger == .mentionOnly)
        #expect(p.dnd == DoNotDisturb(start: ClockTime(hour: 22), end: ClockTime(hour: 8), timezone: "Asia/Seoul"))
        #expect(p.conversation("c1") == ConversationPreference(trigger: .default, muted: true))
        #expect(p.conversation("c2") == ConversationPreference(trigger: .off, muted: false))
        #expect(p.badge == false)
        #expect(p.languages == ["fr"])
        #expect(p.displayName == "Cindy")

        // null clears a field; a conversation set to null loses its settings.
        #expect(
            try await s.call(
                "PATCH", path, body: #"{"dnd": null, "conversations": {"c2": null}, "display_name": null}"#
            ).status == 202)
        try await waitUntil("the clearing patch applied") {
            let p = try await s.store.preferences(app: "app1", user: "u-patch")
            return p.dnd == nil && p.conversations["c2"] == nil && p.displayName == nil
        }
        let after = try await s.store.preferences(app: "app1", user: "u-patch")
        #expect(after.trigger == .mentionOnly && after.conversations["c1"]?.muted == true && after.languages == ["fr"])
    }

    @Test("50 patches of different conversations from 10 connections at once: Redis keeps all 50 (the Lua script)")
    func patchesRaceInRedis() async throws {
        let s = try APIStackHolder.stack()
        let url = "redis://127.0.0.1:\(s.redis.port)"
        let stores = try (0..<10).map { _ in
            StateStore(connection: RedisConnection(configuration: try RedisConfiguration(url: url)))
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<50 {
                let store = stores[i % stores.count]
                group.addTask {
                    let patch = PreferencePatch(conversations: ["c\(i)": .init(muted: true)])
                    try await store.patchPreferences(app: "app1", user: "u-race", patch: patch)
                }
            }
            try await group.waitForAll()
        }
        let p = try await s.store.preferences(app: "app1", user: "u-race")
        #expect(p.conversations.count == 50)
        #expect(p.conversations.values.allSatisfy { $0.muted })
        for store in stores { store.connection.close() }
    }

    @Test("presence: PUT marks the listed tokens online")
    func presence() async throws {
        let s = try APIStackHolder.stack()
        #expect(
            try await s.call("POST", "/v1/apps/app1/users/u-pres/devices", body: #"{"token": "\#(APIStack.hex(20))"}"#)
                .status == 202)
        let answer = try await s.call(
            "PUT", "/v1/apps/app1/users/u-pres/presence",
            body: #"{"online": ["\#(APIStack.hex(20))"], "ttl_ms": 60000}"#)
        #expect(answer.status == 202)
        try await waitUntil("the device is online") {
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            return try await s.store.loadUser(app: "app1", user: "u-pres", now: now).online == [APIStack.hex(20)]
        }
    }

    @Test("counts: GET shows the Herald-kept counts; POST read resets one conversation or all")
    func countsAndMarkRead() async throws {
        let s = try APIStackHolder.stack()
        let keys = [
            CountKey(user: "u-count", eventID: "e1", conversation: "c1", mentioned: true),
            CountKey(user: "u-count", eventID: "e2", conversation: "c1", mentioned: false),
            CountKey(user: "u-count", eventID: "e3", conversation: "c2", mentioned: false),
        ]
        _ = try await s.store.countMessages(app: "app1", keys, markerTTLMilliseconds: 60_000)
        let counts = try await s.call("GET", "/v1/apps/app1/users/u-count/counts")
        #expect(counts.status == 200)
        let unread = counts.json?["unread"] as? [String: Any]
        #expect(unread?["total"] as? Int == 3)
        #expect((unread?["conversations"] as? [String: Int]) == ["c1": 2, "c2": 1])
        #expect((counts.json?["mentions"] as? [String: Any])?["total"] as? Int == 1)

        #expect(
            try await s.call("POST", "/v1/apps/app1/users/u-count/read", body: #"{"conversation": "c1"}"#).status == 202
        )
        try await waitUntil("c1 marked read") {
            let state = try await s.store.loadUser(app: "app1", user: "u-count", now: 0)
            return state.unread == Unread(total: 1, conversations: ["c2": 1])
        }
        #expect(try await s.store.withMentionCounts(app: "app1", user: "u-count", unread: Unread()).mentionTotal == 0)
        #expect(try await s.call("POST", "/v1/apps/app1/users/u-count/read").status == 202)
        try await waitUntil("everything marked read") {
            try await s.store.loadUser(app: "app1", user: "u-count", now: 0).unread == Unread()
        }
        #expect(
            try await s.call("POST", "/v1/apps/app1/users/u-count/read", body: #"{"conversation": 5}"#).json?["field"]
                as? String == "conversation")
        // The device that read is named by its token (docs/behaviour.md §6c); an empty one is refused.
        let named = try await s.call(
            "POST", "/v1/apps/app1/users/u-count/read",
            body: #"{"conversation": "c2", "token": "\#(String(repeating: "ab", count: 32))"}"#)
        #expect(named.status == 202, "\(named.body)")
        let empty = try await s.call(
            "POST", "/v1/apps/app1/users/u-count/read", body: #"{"conversation": "c2", "token": ""}"#)
        #expect(empty.status == 400 && empty.json?["field"] as? String == "token")
    }

    @Test("explain: 404 before any decision; then the user's latest decision with its devices")
    func explain() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/users/u-exp/explain"
        #expect(try await s.call("GET", path).status == 404)
        let explain = ExplainStore(connection: s.connection)
        let t = Int64(Date().timeIntervalSince1970 * 1000)
        try await explain.record([
            ExplainEntry(appID: "app1", eventID: "ev-1", stage: "resolve", decision: "fanned_out", at: t, count: 2),
            ExplainEntry(
                appID: "app1", eventID: "ev-1", user: "u-exp", stage: "suppress", decision: "suppress", reason: "dnd",
                at: t + 1),
        ])
        // Delivered on a second attempt: kept in the compact trail (a first-attempt delivery is not).
        try await explain.record([
            ExplainEntry(
                appID: "app1", eventID: "ev-2", user: "u-exp", stage: "suppress", decision: "deliver", at: t + 2,
                count: 1),
            ExplainEntry(
                appID: "app1", eventID: "ev-2", user: "u-exp", token: APIStack.hex(30), stage: "send",
                decision: "delivered", at: t + 3, status: 200, attempt: 2),
        ])
        let answer = try await s.call("GET", path)
        #expect(answer.status == 200, "\(answer.body)")
        let o = try #require(answer.json)
        #expect(o["event"] as? String == "ev-2")
        #expect(o["decision"] as? String == "deliver")
        let devices = o["devices"] as? [[String: Any]]
        #expect(devices?.count == 1)
        #expect(devices?.first?["decision"] as? String == "delivered")
    }
}

@Suite("Registry API limits (herald-registry, Redis, Tansu)", .serialized, APIStackTrait())
struct RegistryAPILimitsTests {
    @Test("a token used for an app outside its client's apps is 403; an app the pipeline does not list is 404")
    func scopesAndUnknownApps() async throws {
        let s = try APIStackHolder.stack()
        // The scoped client may use app2 only.
        let mine = try await s.call("GET", "/v1/apps/app2/users/u1/preferences", token: APIStack.scopedToken)
        #expect(mine.status == 200, "\(mine.body)")
        for (method, body) in [("GET", nil), ("PATCH", #"{"trigger": "off"}"#)] as [(String, String?)] {
            let other = try await s.call(
                method, "/v1/apps/app1/users/u1/preferences", body: body, token: APIStack.scopedToken)
            #expect(other.status == 403, "\(method): \(other.body)")
            #expect(other.json?["field"] as? String == "app")
            let unknown = try await s.call(method, "/v1/apps/nosuchapp/users/u1/preferences", body: body)
            #expect(unknown.status == 404, "\(method): \(unknown.body)")
            #expect(unknown.json?["field"] as? String == "app")
        }
        let metrics = try await TestHTTP.request(port: s.metricsPort, method: "GET", path: "/metrics").body
        #expect(metrics.contains(#"route="forbidden",status="403""#), "\(metrics)")
        #expect(metrics.contains(#"route="unknown_app",status="404""#))
    }

    @Test("1,000 unauthenticated 1 MiB POSTs are each answered 401 and raise the process's RSS by less than 64 MB")
    func unauthenticatedFlood() async throws {
        let s = try APIStackHolder.stack()
        HostileClients.raiseOpenFileLimit(to: 4096)
        let pid = try #require(s.registry.pid)
        let before = try #require(HostileClients.memory(pid: pid))
        let body = 1 << 20
        let head =
            "POST /v1/apps/app1/users/u1/devices HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong-token-0123456789abcdef0123\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(body)\r\n\r\n"
        let result = try await HostileClients.flood(port: s.apiPort, count: 1000, head: head, bodyBytes: body)
        let after = try #require(HostileClients.memory(pid: pid))
        let answered401 = result.statuses.filter { $0 == 401 }.count
        #expect(
            answered401 == 1000,
            "statuses: \(Dictionary(grouping: result.statuses.map { $0 ?? 0 }, by: { $0 }).mapValues(\.count))")
        let grown = after.peak - before.rss
        print(
            "RegistryAPILimitsTests: 1,000 x 1 MiB unauthenticated POSTs: RSS \(before.rss >> 20) MiB before, peak \(after.peak >> 20) MiB; \(result.bodyBytesSent >> 20) MiB of body sent"
        )
        #expect(grown < 64 << 20, "RSS grew by \(grown >> 20) MiB")
        // The API still serves the right token.
        #expect(try await s.call("GET", "/v1/apps/app1/users/u1/preferences").status == 200)
    }

    @Test("members: PUT sets, POST adds, DELETE removes one, GET reads; bad member lists are 400")
    func members() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/conversations/c-m/members"
        #expect(try await s.call("PUT", path, body: #"{"members": ["u1", "u2", "u3"]}"#).status == 202)
        #expect(try await s.call("POST", path, body: #"{"members": ["u4"]}"#).status == 202)
        #expect(try await s.call("DELETE", path + "/u2").status == 202)
        try await waitUntil("herald-registry applied the member changes") {
            try await s.store.members(app: "app1", conversation: "c-m") == ["u1", "u3", "u4"]
        }
        let read = try await s.call("GET", path)
        #expect(read.status == 200)
        #expect(read.json?["members"] as? [String] == ["u1", "u3", "u4"])
        #expect(read.json?["conversation"] as? String == "c-m")
        let long = String(repeating: "x", count: 300)
        for body in [#"{"members": "u1"}"#, #"{"members": [1]}"#, #"{"members": ["\#(long)"]}"#, #"{"users": []}"#] {
            let bad = try await s.call("POST", path, body: body)
            #expect(bad.status == 400, "\(body)")
        }
        #expect(try await s.call("POST", path, body: #"{"members": []}"#).status == 400)
        #expect(try await s.call("PATCH", path, body: "{}").status == 405)
    }

    @Test("GET devices lists the user's devices with whole tokens")
    func devices() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/users/u-dev-list/devices"
        let empty = try await s.call("GET", path)
        #expect(empty.status == 200)
        #expect((empty.json?["devices"] as? [Any])?.isEmpty == true)
        #expect(try await s.call("POST", path, body: #"{"token": "\#(APIStack.hex(71))"}"#).status == 202)
        #expect(
            try await s.call("POST", path, body: #"{"token": "fcm-token:abc", "kind": "fcm"}"#).status == 202)
        try await waitUntil("both devices are registered") {
            try await s.store.loadUser(app: "app1", user: "u-dev-list", now: 0).devices.count == 2
        }
        let list = try await s.call("GET", path)
        let devices = try #require(list.json?["devices"] as? [[String: Any]])
        #expect(Set(devices.compactMap { $0["token"] as? String }) == [APIStack.hex(71), "fcm-token:abc"])
        #expect(Set(devices.compactMap { $0["kind"] as? String }) == ["apns", "fcm"])
    }

    @Test("explain?event=E answers the decision about that event, with the field names heraldctl prints")
    func explainChosenEvent() async throws {
        let s = try APIStackHolder.stack()
        let explain = ExplainStore(connection: s.connection)
        // The trail is kept in hourly logs within the retention before now: the entries are a second old.
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try await explain.record([
            ExplainEntry(
                appID: "app1", eventID: "ev-a", user: "u-ev", stage: "suppress", decision: "suppress", reason: "dnd",
                at: now - 2000)
        ])
        try await explain.record([
            ExplainEntry(
                appID: "app1", eventID: "ev-b", user: "u-ev", stage: "suppress", decision: "deliver", at: now - 1000)
        ])
        let path = "/v1/apps/app1/users/u-ev/explain"
        let latest = try #require(try await s.call("GET", path).json)
        #expect(latest["event"] as? String == "ev-b")
        let chosen = try await s.call("GET", path + "?event=ev-a")
        #expect(chosen.status == 200, "\(chosen.body)")
        let o = try #require(chosen.json)
        #expect(o["app"] as? String == "app1")
        #expect(o["event"] as? String == "ev-a")
        #expect(o["user"] as? String == "u-ev")
        #expect(o["decision"] as? String == "suppress")
        #expect(o["reason"] as? String == "dnd")
        #expect(o["app_id"] == nil && o["event_id"] == nil)
        #expect(try await s.call("GET", path + "?event=ev-none").status == 404)
        // heraldctl explain --user prints the same object.
        let ctl = try await Heraldctl.run(
            ["explain", "--app", "app1", "--event", "ev-a", "--user", "u-ev", "--redis", s.redisURL])
        #expect(ctl.status == 0, "\(ctl.output)")
        let printed = try #require(
            try JSONSerialization.jsonObject(with: Data(ctl.output.utf8)) as? [String: Any])
        #expect(Set(printed.keys) == Set(o.keys), "heraldctl: \(printed.keys.sorted()), API: \(o.keys.sorted())")
    }

    @Test("the preference caps hold through the API, heraldctl and a raw herald.registry record")
    func preferenceCaps() async throws {
        let s = try APIStackHolder.stack()
        let path = "/v1/apps/app1/users/u-cap/preferences"
        func conversations(_ range: Range<Int>) -> String {
            "{\"conversations\": {" + range.map { "\"c\($0)\": {\"muted\": true}" }.joined(separator: ", ") + "}}"
        }
        // 40 conversations fit (the stack allows 60).
        #expect(try await s.call("PATCH", path, body: conversations(0..<40)).status == 202)
        try await waitUntil("the first patch is applied") {
            try await s.store.preferences(app: "app1", user: "u-cap").conversations.count == 40
        }
        // 40 + 30 would be 70: the API refuses it.
        let over = try await s.call("PATCH", path, body: conversations(40..<70))
        #expect(over.status == 400, "\(over.body)")
        #expect(over.json?["field"] as? String == "conversations")
        // heraldctl: 20 more fit, the 21st does not.
        for i in 40..<60 {
            let ok = try await Heraldctl.run(
                [
                    "prefs", "set", "--app", "app1", "--user", "u-cap", "--conversation", "c\(i)", "--mute", "--redis",
                    s.redisURL,
                ], environment: APIStack.capEnvironment)
            #expect(ok.status == 0, "\(ok.output)")
        }
        let refused = try await Heraldctl.run(
            [
                "prefs", "set", "--app", "app1", "--user", "u-cap", "--conversation", "c60", "--mute", "--redis",
                s.redisURL,
            ], environment: APIStack.capEnvironment)
        #expect(refused.status == 2, "\(refused.output)")
        #expect(refused.output.contains("at most 60"), "\(refused.output)")
        // A raw record past the cap is dead-lettered over_limit by herald-registry; nothing changes.
        let record = RegistryRecord(
            op: .patchPreferences, appID: "app1", user: "u-cap",
            patch: PreferencePatch(conversations: ["c-raw": PreferencePatch.ConversationFields(muted: true)]))
        try await s.publishRaw(record)
        try await waitUntil("herald-registry dead-letters the record over_limit") {
            let metrics = try await TestHTTP.request(port: s.metricsPort, method: "GET", path: "/metrics").body
            return metrics.contains(#"herald_dlq_total{stage="registry",reason="over_limit"} 1"#)
        }
        let stored = try await s.store.preferences(app: "app1", user: "u-cap")
        #expect(stored.conversations.count == 60)
        #expect(stored.conversations["c-raw"] == nil)
        // The bytes cap: long conversation ids pass the count but not the size.
        let long =
            "{\"conversations\": {"
            + (0..<40).map {
                "\"\(String(repeating: "z", count: 250))\($0)\": {\"muted\": true}"
            }.joined(separator: ", ") + "}}"
        let big = try await s.call("PATCH", "/v1/apps/app1/users/u-cap-bytes/preferences", body: long)
        #expect(big.status == 400, "\(big.body)")
        #expect((big.json?["error"] as? String)?.contains("bytes") == true, "\(big.body)")
    }
}

@Suite("Readiness of herald-registry (Redis, Tansu)", .serialized, APIStackTrait())
struct RegistryReadinessTests {
    @Test("/readyz and /metrics under 200 requests per second add no Redis command per request")
    func readinessIsCached() async throws {
        let s = try APIStackHolder.stack()
        try await waitUntil("herald-registry is ready", timeout: .seconds(60)) {
            (try? await TestHTTP.request(port: s.metricsPort, method: "GET", path: "/readyz"))?.status == 200
        }
        let before = try await s.commandCalls("ping")
        let started = ContinuousClock.now
        var answered = 0
        for second in 1...3 {
            answered += await withTaskGroup(of: Int.self) { group in
                for worker in 0..<10 {
                    group.addTask {
                        var ok = 0
                        for i in 0..<20 {
                            let path = (worker + i) % 10 == 0 ? "/metrics" : "/readyz"
                            let status = try? await TestHTTP.request(port: s.metricsPort, method: "GET", path: path)
                                .status
                            if status == 200 { ok += 1 }
                        }
                        return ok
                    }
                }
                return await group.reduce(0, +)
            }
            // At most 200 a second: wait for the second to end when the requests were faster.
            try await Task.sleep(until: started + .seconds(second), clock: .continuous)
        }
        let elapsed = ContinuousClock.now - started
        let pings = try await s.commandCalls("ping") - before
        print(
            "RegistryReadinessTests: \(answered) of 600 scrapes answered 200 in \(elapsed); \(pings) Redis PINGs meanwhile"
        )
        #expect(answered == 600)
        // The probe runs at most once per 5 s (plus one in flight at either end), whatever the request rate.
        let allowed = Int(elapsed / .seconds(5)) + 2
        #expect(pings <= allowed, "\(pings) PINGs for 600 scrapes in \(elapsed) (at most \(allowed) expected)")
    }
}

/// heraldctl, run to completion against the stack.
enum Heraldctl {
    static func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> ToolResult {
        try await runToolAsync(try Paths.executable("heraldctl"), arguments, environment: environment)
    }
}
