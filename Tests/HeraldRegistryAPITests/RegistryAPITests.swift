// The registry HTTP API over HTTP, against the real herald-registry executable, redis-server and Tansu: every
// write goes through herald.registry and herald-registry applies it; the tests read Redis to see the result.
// Needs `swift build` first (the executable), like the end-to-end suite.
import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldTestSupport
import Logging
import Testing

/// Redis, Tansu and one herald-registry process with the API on, shared by the suite.
final class APIStack: Sendable {
    static let token = "backend-a-token-0123456789abcdef"
    static let otherToken = "backend-b-token-fedcba9876543210"

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
            apps:
              app1:
                counts: true
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
                "HERALD_BATCH_TIMEOUT_MS": "20",
                "HERALD_REDIS_URL": "redis://127.0.0.1:\(redis.port)",
                "HERALD_METRICS_PORT": "\(metricsPort)",
                "HERALD_API_PORT": "\(apiPort)",
                "HERALD_API_TOKENS": "backend-b=\(Self.otherToken)",
                "API_TOKEN_BACKEND_A": Self.token,
                "HERALD_LOG_LEVEL": "debug",
            ], logPath: dir + "/registry.log")
        try registry.start()
        let port = apiPort
        try await waitUntil("the registry API accepts connections", timeout: .seconds(30)) { [registry] in
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
        #expect(try await s.store.owner(app: "app1", token: APIStack.hex(10)) == nil)
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
        #expect(o["event_id"] as? String == "ev-2")
        #expect(o["decision"] as? String == "deliver")
        let devices = o["devices"] as? [[String: Any]]
        #expect(devices?.count == 1)
        #expect(devices?.first?["decision"] as? String == "delivered")
    }
}
