// The registry API's head checks on their own, without a server: the failed-authentication budget per address.
import Foundation
import HeraldCore
import HeraldRedis
import HeraldRegistryAPI
import Logging
import Synchronization
import Testing

@Suite("Registry API head checks")
struct RegistryAPIHeadCheckTests {
    struct NoSink: RegistryRecordSink {
        func publish(_ record: RegistryRecord) async throws {}
    }

    final class Clock: Sendable {
        let now = Mutex<Duration>(.seconds(1000))
        func advance(_ by: Duration) { now.withLock { $0 += by } }
    }

    static func api(limiter: AuthFailureLimiter, apps: AppDirectory? = nil) throws -> RegistryAPI {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        // Never connected: the head checks do not touch Redis.
        let connection = RedisConnection(
            configuration: try RedisConfiguration(url: "redis://127.0.0.1:1"), logger: logger)
        let operations = RegistryOperations(
            sink: NoSink(), store: StateStore(connection: connection, logger: logger),
            explain: ExplainStore(connection: connection))
        return RegistryAPI(
            operations: operations,
            clients: [
                RegistryAPI.Client(name: "all", token: String(repeating: "a", count: 32)),
                RegistryAPI.Client(name: "two", token: String(repeating: "b", count: 32), apps: ["app2"]),
            ], logger: logger, apps: apps, limiter: limiter)
    }

    static func head(_ api: RegistryAPI, token: String?, app: String = "app1", from remote: String) -> Int? {
        var headers: [String: String] = [:]
        if let token { headers["authorization"] = "Bearer \(token)" }
        return api.checkHead(
            method: "GET", path: "/v1/apps/\(app)/users/u1/preferences", headers: headers, remote: remote)?.status
    }

    @Test("an address over its failed-authentication budget gets 429 for every request until the bucket refills")
    func failedAuthenticationBudget() throws {
        let clock = Clock()
        let limiter = AuthFailureLimiter(perMinute: 3, now: { clock.now.withLock { $0 } })
        let api = try Self.api(limiter: limiter)
        let good = String(repeating: "a", count: 32)
        for _ in 0..<3 { #expect(Self.head(api, token: "guess", from: "10.0.0.1") == 401) }
        #expect(Self.head(api, token: "guess", from: "10.0.0.1") == 429)
        // Blocked before the token is looked at: a right guess now gains nothing.
        #expect(Self.head(api, token: good, from: "10.0.0.1") == 429)
        let refusal = try #require(
            api.checkHead(
                method: "GET", path: "/v1/apps/app1/users/u1/preferences", headers: [:], remote: "10.0.0.1"))
        #expect(Int(refusal.headers["Retry-After"] ?? "") ?? 0 >= 1)
        // Another address is not affected.
        #expect(Self.head(api, token: good, from: "10.0.0.2") == nil)
        // 3 per minute: one failure comes back every 20 s.
        clock.advance(.seconds(21))
        #expect(Self.head(api, token: good, from: "10.0.0.1") == nil)
        #expect(Self.head(api, token: "guess", from: "10.0.0.1") == 401)
        #expect(Self.head(api, token: "guess", from: "10.0.0.1") == 429)
    }

    @Test(
        "an IPv6 client counts by its /64: its other addresses share the budget; a table full of clients stays bounded")
    func ipv6ClientsCountByNetwork() throws {
        #expect(AuthFailureLimiter.client("2001:db8:1:2::1") == "2001:db8:1:2::/64")
        #expect(AuthFailureLimiter.client("2001:db8:1:2:ffff:ffff:ffff:fffe") == "2001:db8:1:2::/64")
        #expect(AuthFailureLimiter.client("2001:db8:1:3::1") == "2001:db8:1:3::/64")
        #expect(AuthFailureLimiter.client("::ffff:10.0.0.7") == "10.0.0.7")
        #expect(AuthFailureLimiter.client("10.0.0.7") == "10.0.0.7")
        let clock = Clock()
        let limiter = AuthFailureLimiter(perMinute: 3, maxAddresses: 1000, now: { clock.now.withLock { $0 } })
        let api = try Self.api(limiter: limiter)
        // Three failures from three addresses of one /64 spend its budget: a fourth address of it is blocked.
        for host in 1...3 { #expect(Self.head(api, token: "guess", from: "2001:db8:1:2::\(host)") == 401) }
        #expect(Self.head(api, token: "guess", from: "2001:db8:1:2::99") == 429)
        #expect(Self.head(api, token: "guess", from: "2001:db8:1:3::1") == 401, "another /64 is another client")
        // 5,000 clients: the table never holds more than its bound.
        for n in 0..<5000 {
            limiter.recordFailure("10.\(n / 65536).\(n / 256 % 256).\(n % 256)")
            #expect(limiter.trackedClients <= 1000)
        }
    }

    @Test("scopes and unknown apps are refused at the head: 403 outside the client's apps, 404 for an unlisted app")
    func scopes() throws {
        let apps = AppDirectory(apps: ["app1": AppConfig(), "app2": AppConfig()], listedOnly: true)
        let api = try Self.api(limiter: AuthFailureLimiter(perMinute: 0), apps: apps)
        let all = String(repeating: "a", count: 32)
        let two = String(repeating: "b", count: 32)
        #expect(Self.head(api, token: two, app: "app2", from: "x") == nil)
        #expect(Self.head(api, token: two, app: "app1", from: "x") == 403)
        #expect(Self.head(api, token: two, app: "app9", from: "x") == 403)
        #expect(Self.head(api, token: all, app: "app9", from: "x") == 404)
        #expect(Self.head(api, token: all, app: "app1", from: "x") == nil)
        // No limit: failures never turn into 429.
        for _ in 0..<100 { #expect(Self.head(api, token: "guess", from: "x") == 401) }
    }
}
