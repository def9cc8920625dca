// FCM HTTP v1 over the nghttp2 client against the stand-in over real TLS: the OAuth2 token
// exchange (RS256 assertion), renewal, every error answer and its disposition, GOAWAY.

import Foundation
import HeraldCore
import HeraldMockProviders
import HeraldPushProviders
import Testing

@Suite("FCM client against the stand-in", .serialized)
struct FCMClientTests {
    @Test("token exchange: a signed assertion buys an access token; messages:send accepts it")
    func tokenExchange() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server)
        let r = await client.send(try fcmDelivery(regToken(1)))
        await client.shutdown()
        #expect(r.status == 200 && r.disposition == .delivered)
        let token = try #require(server.recorded(.token).first)
        #expect(token.status == 200)
        #expect(
            String(decoding: token.body, as: UTF8.self).contains(
                "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"))
        let send = try #require(server.recorded(.send).first)
        #expect(send.status == 200 && send.target == regToken(1))
        #expect(send.authorization?.hasPrefix("Bearer ya29.mock-") == true)
        #expect(client.tokens.renewalCount == 1)
    }

    @Test("an assertion signed with another key is refused (invalid_grant); nothing is sent without a token")
    func wrongKey() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server, account: pki.serviceAccount(port: server.port, key: pki.otherKey))
        let r = await client.send(try fcmDelivery(regToken(1), timeout: .milliseconds(1500)))
        // The exchange runs on its own; on a loaded machine the send's deadline can pass before its answer is read.
        #expect(await eventually { client.tokens.lastFailure?.contains("400") == true })
        await client.shutdown()
        #expect(r.transportFailure == .deadlineExceeded)
        #expect(server.recorded(.token).allSatisfy { $0.status == 400 && $0.reason == "invalid_grant" })
        #expect(server.recorded(.send).isEmpty)
    }

    @Test("the access token is renewed before it expires, not per request")
    func renewal() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki, tokenLifetime: 3)
        defer { server.stop() }
        let client = try fcmClient(pki, server, renewBefore: .seconds(2))
        var delivered = 0
        let started = ContinuousClock.now
        for i in 0..<40 {
            let r = await client.send(try fcmDelivery(regToken(i)))
            if r.disposition == .delivered { delivered += 1 }
        }
        let elapsed = Int((ContinuousClock.now - started).components.seconds)
        #expect(delivered == 40)
        // About one renewal a second at most (a starved test process may take seconds for the 40 sends), never one
        // per request.
        #expect(
            client.tokens.renewalCount <= 2 + elapsed && client.tokens.renewalCount < 40,
            "renewed per request: \(client.tokens.renewalCount) renewals in \(elapsed) s")
        // Lifetime 3 s, renewed 2 s early: about one renewal a second.
        #expect(await eventually { client.tokens.renewalCount >= 4 })
        let r = await client.send(try fcmDelivery(regToken(99)))
        await client.shutdown()
        #expect(r.disposition == .delivered)
        #expect(server.recorded(.send).allSatisfy { $0.status == 200 })
    }

    struct ErrorRow: CustomTestStringConvertible, Sendable {
        let name: String
        let fault: MockFault?
        let token: String
        let status: Int
        let reason: String
        let answer: PushAnswerClass
        var testDescription: String { name }
    }

    static let errorRows: [ErrorRow] = [
        ErrorRow(
            name: "404 UNREGISTERED: token dead", fault: nil, token: "dead" + regToken(7), status: 404,
            reason: "UNREGISTERED", answer: .tokenDead(unregisteredAt: nil)),
        ErrorRow(
            name: "400 INVALID_ARGUMENT about the token: token dead", fault: nil, token: "not a token!", status: 400,
            reason: "INVALID_ARGUMENT", answer: .tokenDead(unregisteredAt: nil)),
        ErrorRow(
            name: "403 SENDER_ID_MISMATCH: permanent", fault: nil, token: "foreign" + regToken(8), status: 403,
            reason: "SENDER_ID_MISMATCH", answer: .permanent),
        ErrorRow(
            name: "429 QUOTA_EXCEEDED: retry",
            fault: MockFault(status: 429, errorCode: "QUOTA_EXCEEDED", retryAfter: 7),
            token: regToken(9), status: 429, reason: "QUOTA_EXCEEDED", answer: .retryable),
        ErrorRow(
            name: "503 UNAVAILABLE: retry", fault: MockFault(status: 503, errorCode: "UNAVAILABLE"),
            token: regToken(10), status: 503, reason: "UNAVAILABLE", answer: .retryable),
        ErrorRow(
            name: "500 INTERNAL: retry", fault: MockFault(status: 500, errorCode: "INTERNAL"),
            token: regToken(11), status: 500, reason: "INTERNAL", answer: .retryable),
    ]

    @Test("every FCM error answer and its disposition", arguments: errorRows)
    func errorAnswers(_ row: ErrorRow) async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki, unregistered: ["dead" + regToken(7)], foreign: ["foreign" + regToken(8)])
        defer { server.stop() }
        let client = try fcmClient(pki, server)
        // The token endpoint first, so an injected fault meets messages:send.
        #expect(await client.tokens.waitForToken(timeout: .seconds(60)))
        if let fault = row.fault { server.injectSendFaults([fault]) }
        let r = await client.send(try fcmDelivery(row.token))
        await client.shutdown()
        #expect(r.status == row.status)
        #expect(r.reasonText == row.reason)
        #expect(r.answer == row.answer)
        switch row.answer {
        case .tokenDead: #expect(r.disposition == .tokenDead(unregisteredAt: nil))
        case .permanent, .retryable:
            if case .permanentFailure = r.disposition {} else { Issue.record("\(r.disposition)") }
        default: Issue.record("unexpected row")
        }
        if row.status == 429 { #expect(r.retryAfter == .seconds(7)) }
    }

    @Test("429 with Retry-After is retried no sooner than it asks; 503 and 500 are retried to delivery")
    func retriesHonourRetryAfter() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server, maxAttempts: 4)
        #expect(await client.tokens.waitForToken(timeout: .seconds(60)))
        server.injectSendFaults([
            MockFault(status: 429, errorCode: "QUOTA_EXCEEDED", retryAfter: 1),
            MockFault(status: 503, errorCode: "UNAVAILABLE"), MockFault(status: 500, errorCode: "INTERNAL"),
        ])
        let start = ContinuousClock.now
        let r = await client.send(try fcmDelivery(regToken(1)))
        let took = ContinuousClock.now - start
        await client.shutdown()
        #expect(r.disposition == .delivered && r.attempts == 4)
        #expect(took >= .seconds(1))
        #expect(server.recorded(.send).map(\.status) == [429, 503, 500, 200])
    }

    @Test("401 UNAUTHENTICATED renews the access token once and succeeds; a second 401 is permanent")
    func unauthenticated() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server)
        #expect(await client.tokens.waitForToken(timeout: .seconds(60)))
        server.revokeAccessTokens()
        let r = await client.send(try fcmDelivery(regToken(1)))
        #expect(r.disposition == .delivered && r.attempts == 1)
        #expect(server.recorded(.send).map(\.status) == [401, 200])
        #expect(server.accessTokensIssued == 2)
        server.injectSendFaults([MockFault(status: 401), MockFault(status: 401)])
        let again = await client.send(try fcmDelivery(regToken(2)))
        await client.shutdown()
        #expect(again.status == 401 && again.answer == .renewCredentials)
        if case .permanentFailure(let why) = again.disposition {
            #expect(why.contains("UNAUTHENTICATED"))
        } else {
            Issue.record("\(again.disposition)")
        }
    }

    @Test("a token for another project is refused (403 PERMISSION_DENIED): permanent")
    func foreignAccessToken() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server, account: pki.serviceAccount(port: server.port, project: "someone-else"))
        let r = await client.send(try fcmDelivery(regToken(1)))
        await client.shutdown()
        #expect(r.status == 403 && r.answer == .permanent)
    }

    @Test("schema: a non-string data value is INVALID_ARGUMENT, permanent (not token dead)")
    func schema() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server)
        var d = try fcmDelivery(regToken(1))
        d.payload = Array(#"{"message":{"token":"\#(regToken(1))","data":{"n":1}}}"#.utf8)
        let r = await client.send(d)
        await client.shutdown()
        #expect(r.status == 400 && r.answer == .permanent)
        #expect(server.recorded(.send).first?.reason == "INVALID_ARGUMENT")
    }

    @Test("GOAWAY: new streams go to a new connection, every message is delivered exactly once")
    func goaway() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki, goawayAfter: 5)
        defer { server.stop() }
        let client = try fcmClient(pki, server, maxAttempts: 2)
        let requests = try (0..<30).map { try fcmDelivery(regToken($0), tag: UInt64($0)) }
        var delivered: Set<UInt64> = []
        for await r in client.responses(for: requests) where r.disposition == .delivered { delivered.insert(r.tag) }
        let stats = client.stats
        await client.shutdown()
        #expect(delivered.count == 30)
        #expect(stats.goawaysReceived >= 1)
        #expect(server.connections >= 2)
        let sent = server.recorded(.send).filter { $0.status == 200 }.map(\.target)
        #expect(sent.count == 30 && Set(sent).count == 30)
    }

    @Test("prioritized messages (Android calls, DMs) go on the connection kept for them; bulk ones never do")
    func priorityConnection() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server, priorityConnections: 1, priorityReserve: 0.2, maxInFlight: 50)
        // Both connections up and their settings in (a prioritized request takes a shared connection while its own
        // is not up yet): one message of each kind first.
        #expect(await eventually { client.stats.connectionsOpened == 2 })
        var warm = try fcmDelivery(regToken(998))
        warm.prioritized = true
        #expect(await client.send(warm).disposition == .delivered)
        #expect(await client.send(try fcmDelivery(regToken(999))).disposition == .delivered)
        // A batch that mixes them (the send stage's lanes never do, a caller may): 2 prioritized among 120 bulk,
        // more than the in-flight bound, so the bulk ones go through the gate in several runs.
        var requests = try (0..<120).map { try fcmDelivery(regToken($0), tag: UInt64($0)) }
        for i in [40, 90] { requests[i].prioritized = true }
        var delivered: Set<UInt64> = []
        for await r in client.responses(for: requests) where r.disposition == .delivered { delivered.insert(r.tag) }
        let stats = client.stats
        await client.shutdown()
        #expect(delivered.count == 120)
        #expect(stats.connectionsOpened == 2, "one shared connection and one for prioritized requests")
        #expect(
            stats.streamsOnPriorityConnections == 3,
            "\(stats.streamsOnPriorityConnections) streams on the prioritized connection; only the 3 prioritized may be"
        )
        #expect(stats.streamsOpened == 122)
        // The token exchange's HTTP/1.1 connection and the two HTTP/2 ones: no connection beyond the configured.
        #expect(server.connections == 3)
        let sent = server.recorded(.send).filter { $0.status == 200 }.map(\.target)
        #expect(sent.count == 122 && Set(sent).count == 122)
    }
}
