// Integration tests: the built herald-mock-apns binary on an ephemeral port with real TLS,
// driven by nghttp / h2load (Debian's nghttp2-client) and curl for /metrics.
import Foundation
import HeraldTestSupport
import Testing

private let token = String(repeating: "ab", count: 32)
private let devicePath = "/3/device/" + token
private let topic = "com.example.chat"
private let body = #"{"aps":{"alert":{"title":"Cindy","body":"Bye!"},"sound":"default"},"f":"u1"}"#
private let keyID = "ABC123DEFG"
private let teamID = "DEF123GHIJ"

@Suite(.serialized) struct MockServerTests {
    let pki: TestPKI

    init() async throws { pki = try await TestPKI.make() }

    private func now() -> Int { Int(Date().timeIntervalSince1970) }

    @Test func successAnswers200WithApnsIDAndEchoesTheRequestsOne() async throws {
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic])
        let t = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(t.answers.count == 1)
        #expect(t.answers.first?.status == 200)
        #expect(t.answers.first?.apnsID?.count == 36)
        let mine = "1f0e9c52-1b7c-4c8e-9d21-0c2a7e5b3f10"
        let t2 = try await nghttp(
            mock.url, paths: [devicePath], headers: ["apns-topic": topic, "apns-id": mine], body: body, pki: pki)
        #expect(t2.answers.first?.status == 200)
        #expect(t2.answers.first?.apnsID == mine)
        #expect(mock.stop() == 0)
    }

    @Test(
        "each check answers APNs's status and reason",
        arguments: [
            (["apns-topic": topic], "/3/device/" + token, "GET", body, 405, "MethodNotAllowed"),
            (["apns-topic": topic], "/3/devices/" + token, "POST", body, 404, "BadPath"),
            (["apns-topic": topic], "/3/device/nothex", "POST", body, 400, "BadDeviceToken"),
            (["apns-topic": topic], "/3/device/" + token + "0", "POST", body, 400, "BadDeviceToken"),
            ([:], devicePath, "POST", body, 400, "MissingTopic"),
            (["apns-topic": "com.other.app"], devicePath, "POST", body, 400, "TopicDisallowed"),
            (["apns-topic": topic, "apns-push-type": "voip"], devicePath, "POST", body, 400, "DeviceTokenNotForTopic"),
            (["apns-topic": topic, "apns-push-type": "loud"], devicePath, "POST", body, 400, "InvalidPushType"),
            (["apns-topic": topic, "apns-priority": "7"], devicePath, "POST", body, 400, "BadPriority"),
            (["apns-topic": topic, "apns-expiration": "tomorrow"], devicePath, "POST", body, 400, "BadExpirationDate"),
            (
                ["apns-topic": topic, "apns-collapse-id": String(repeating: "c", count: 65)], devicePath, "POST", body,
                400, "BadCollapseId"
            ),
            (["apns-topic": topic, "apns-id": "12345"], devicePath, "POST", body, 400, "BadMessageId"),
            (["apns-topic": topic], devicePath, "POST", "", 400, "PayloadEmpty"),
            (["apns-topic": topic], devicePath, "POST", "{not json", 400, "PayloadEmpty"),
            (["apns-topic": topic], devicePath, "POST", padded(4097), 413, "PayloadTooLarge"),
            (
                ["apns-topic": topic + ".voip", "apns-push-type": "voip"], devicePath, "POST", padded(5121), 413,
                "PayloadTooLarge"
            ),
        ])
    func checks(
        headers: [String: String], path: String, method: String, payload: String, status: Int, reason: String
    ) async throws {
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic])
        let t = try await nghttp(
            mock.url, paths: [path], headers: headers, body: method == "GET" ? nil : payload,
            method: method, pki: pki)
        #expect(t.answers.count == 1, "\(t.output.suffix(800))")
        #expect(t.answers.first?.status == status)
        #expect(t.answers.first?.reason == reason)
        #expect(t.answers.first?.apnsID?.count == 36)
        #expect(mock.stop() == 0)
    }

    @Test func voipPayloadsMayReach5120Bytes() async throws {
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic])
        let t = try await nghttp(
            mock.url, paths: [devicePath], headers: ["apns-topic": topic + ".voip", "apns-push-type": "voip"],
            body: padded(5120), pki: pki)
        #expect(t.answers.first?.status == 200)
        #expect(mock.stop() == 0)
    }

    @Test func providerTokensAreVerified() async throws {
        let mock = try await MockProcess.start(
            pki: pki, ["--topic", topic, "--auth-key", "\(keyID):\(teamID):\(pki.providerPublicKey)"])
        func send(_ authorization: String?) async throws -> H2Answer? {
            var h = ["apns-topic": topic]
            if let authorization { h["authorization"] = authorization }
            return try await nghttp(mock.url, paths: [devicePath], headers: h, body: body, pki: pki).answers.first
        }
        let good = try await pki.jwt(kid: keyID, iss: teamID, iat: now())
        #expect(try await send("bearer \(good)")?.status == 200)
        #expect(try await send(nil)?.reason == "MissingProviderToken")
        #expect(try await send(nil)?.status == 403)
        #expect(
            try await send(
                "bearer \(try await pki.jwt(key: pki.otherProviderKey, kid: keyID, iss: teamID, iat: now()))")?.reason
                == "InvalidProviderToken")
        #expect(
            try await send("bearer \(try await pki.jwt(kid: "UNKNOWNKID", iss: teamID, iat: now()))")?.reason
                == "InvalidProviderToken")
        #expect(
            try await send("bearer \(try await pki.jwt(kid: keyID, iss: "OTHERTEAM1", iat: now()))")?.reason
                == "InvalidProviderToken")
        let old = try await send("bearer \(try await pki.jwt(kid: keyID, iss: teamID, iat: now() - 3700))")
        #expect(old?.status == 403)
        #expect(old?.reason == "ExpiredProviderToken")
        #expect(
            try await send("bearer \(try await pki.jwt(kid: keyID, iss: teamID, iat: now() - 3000))")?.status == 200)
        // A token with one flipped signature character.
        var bad = Array(good)
        bad[bad.count - 3] = bad[bad.count - 3] == "A" ? "B" : "A"
        #expect(try await send("bearer \(String(bad))")?.reason == "InvalidProviderToken")
        #expect(try await send("basic \(good)")?.reason == "InvalidProviderToken")
        #expect(mock.stop() == 0)
    }

    @Test func tokenUpdatesMoreOftenThanAllowedAreRefused() async throws {
        let mock = try await MockProcess.start(
            pki: pki,
            [
                "--auth-key", "\(keyID):\(teamID):\(pki.providerPublicKey)",
                "--min-token-update-interval", "1200",
            ])
        func send(iat: Int) async throws -> H2Answer? {
            let jwt = try await pki.jwt(kid: keyID, iss: teamID, iat: iat)
            return try await nghttp(
                mock.url, paths: [devicePath], headers: ["apns-topic": topic, "authorization": "bearer \(jwt)"],
                body: body, pki: pki
            ).answers.first
        }
        let t0 = now() - 3000
        #expect(try await send(iat: t0)?.status == 200)
        let churn = try await send(iat: t0 + 600)
        #expect(churn?.status == 429)
        #expect(churn?.reason == "TooManyProviderTokenUpdates")
        #expect(try await send(iat: t0)?.status == 200, "the current token stays usable")
        #expect(try await send(iat: t0 + 1300)?.status == 200, "a renewal after 20 minutes is accepted")
        #expect(try await send(iat: t0 + 1400)?.status == 429)
        #expect(mock.stop() == 0)
    }

    @Test func tokenConnectionsStartAtOneStreamAndAreRaisedAfterTheFirstSuccess() async throws {
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic, "--max-streams", "500"])
        let paths = (0..<4).map { "/3/device/" + String(repeating: "ab", count: 31) + "0\($0)" }
        // `-M 1`: like a well-behaved APNs client, nghttp opens one stream until the server's SETTINGS say
        // otherwise (without it nghttp may open all four before reading SETTINGS and get three refused).
        let t = try await nghttp(
            mock.url, paths: paths, headers: ["apns-topic": topic], body: body, extra: ["-M", "1"], pki: pki)
        #expect(t.serverMaxConcurrentStreams == [1, 500])
        #expect(t.answers.map(\.status) == [200, 200, 200, 200])
        // The raise comes after the first 200 and before the other answers.
        let out = t.output
        let firstAnswer = try #require(out.range(of: ":status: 200")).lowerBound
        let raise = try #require(out.range(of: "SETTINGS_MAX_CONCURRENT_STREAMS(0x03):500")).lowerBound
        #expect(firstAnswer < raise)
        // A failure does not raise it.
        let t2 = try await nghttp(
            mock.url, paths: [devicePath], headers: ["apns-topic": "wrong.topic"], body: body, pki: pki)
        #expect(t2.serverMaxConcurrentStreams == [1])
        #expect(mock.stop() == 0)
    }

    @Test func aRejectedProviderTokenDoesNotRaiseTheLimitAndASuccessDoes() async throws {
        let mock = try await MockProcess.start(
            pki: pki,
            [
                "--topic", topic, "--max-streams", "500", "--metrics-port", "0",
                "--auth-key", "\(keyID):\(teamID):\(pki.providerPublicKey)",
            ])
        let paths = (0..<2).map { "/3/device/" + String(repeating: "ab", count: 31) + "0\($0)" }
        let badJWT = try await pki.jwt(key: pki.otherProviderKey, kid: keyID, iss: teamID, iat: now())
        let bad = try await nghttp(
            mock.url, paths: paths, headers: ["apns-topic": topic, "authorization": "bearer \(badJWT)"],
            body: body, extra: ["-M", "1"], pki: pki)
        #expect(bad.answers.map(\.status) == [403, 403])
        #expect(bad.answers.map(\.reason) == ["InvalidProviderToken", "InvalidProviderToken"])
        // Already at the initial limit: neither a raise nor a (no-op) lowering is sent.
        #expect(bad.serverMaxConcurrentStreams == [1])
        let goodJWT = try await pki.jwt(kid: keyID, iss: teamID, iat: now())
        let good = try await nghttp(
            mock.url, paths: paths, headers: ["apns-topic": topic, "authorization": "bearer \(goodJWT)"],
            body: body, extra: ["-M", "1"], pki: pki)
        #expect(good.answers.map(\.status) == [200, 200])
        #expect(good.serverMaxConcurrentStreams == [1, 500])
        let m = try await mock.metrics()
        #expect(metricValue(m, "herald_mock_apns_max_streams_raised_total") == 1)
        #expect(metricValue(m, "herald_mock_apns_max_streams_lowered_total") == 0)
        #expect(metricValue(m, "herald_mock_apns_streams_over_limit_total") == 0)
        #expect(mock.stop() == 0)
    }

    @Test func aProviderTokenRejectionAfterASuccessLowersTheLimitAgain() async throws {
        // Every 2nd valid request on a token connection is answered 403 InvalidProviderToken.
        let mock = try await MockProcess.start(
            pki: pki,
            [
                "--topic", topic, "--max-streams", "500", "--metrics-port", "0",
                "--auth-key", "\(keyID):\(teamID):\(pki.providerPublicKey)",
                "--reject-token-every", "2",
            ])
        let jwt = try await pki.jwt(kid: keyID, iss: teamID, iat: now())
        let paths = (0..<2).map { "/3/device/" + String(repeating: "ab", count: 31) + "0\($0)" }
        // `-M 1`: the second request is only sent once the raise arrived, so it is answered after the first.
        let t = try await nghttp(
            mock.url, paths: paths, headers: ["apns-topic": topic, "authorization": "bearer \(jwt)"],
            body: body, extra: ["-M", "1"], pki: pki)
        #expect(t.answers.map(\.status) == [200, 403])
        #expect(t.answers.last?.reason == "InvalidProviderToken")
        #expect(t.serverMaxConcurrentStreams == [1, 500, 1])
        // On the wire: 200, raise, 403, lowering.
        let out = t.output
        let success = try #require(out.range(of: ":status: 200")).lowerBound
        let raise = try #require(out.range(of: "SETTINGS_MAX_CONCURRENT_STREAMS(0x03):500")).lowerBound
        let rejection = try #require(out.range(of: ":status: 403")).lowerBound
        let lowering = try #require(out.range(of: "SETTINGS_MAX_CONCURRENT_STREAMS(0x03):1]", options: .backwards))
            .lowerBound
        #expect(success < raise)
        #expect(raise < rejection)
        #expect(rejection < lowering)
        // A new connection: its first request (the 3rd valid one) succeeds and raises, the next is
        // rejected and lowers again.
        let t2 = try await nghttp(
            mock.url, paths: paths, headers: ["apns-topic": topic, "authorization": "bearer \(jwt)"],
            body: body, extra: ["-M", "1"], pki: pki)
        #expect(t2.answers.map(\.status) == [200, 403])
        #expect(t2.serverMaxConcurrentStreams == [1, 500, 1])
        let m = try await mock.metrics()
        #expect(metricValue(m, "herald_mock_apns_max_streams_raised_total") == 2)
        #expect(metricValue(m, "herald_mock_apns_max_streams_lowered_total") == 2)
        #expect(metricValue(m, #"herald_mock_apns_faults_injected_total{reason="InvalidProviderToken"}"#) == 2)
        #expect(metricValue(m, "herald_mock_apns_streams_over_limit_total") == 0)
        #expect(mock.stop() == 0)
    }

    @Test func streamsBeyondTheLimitAreRefusedBeforeItsAcknowledgementAndCountedAfter() async throws {
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic, "--metrics-port", "0"])
        // Before the client acknowledged SETTINGS_MAX_CONCURRENT_STREAMS = 1 it could not know:
        // nghttp2 refuses the second stream with REFUSED_STREAM; nothing is counted over the limit.
        let early = try await twoStreamsAtOnce(port: mock.port, path: devicePath, acknowledgeSettings: false, pki: pki)
        #expect(early.resets[3] == 7, "REFUSED_STREAM")
        #expect(early.goaway == nil)
        var m = try await mock.metrics()
        #expect(metricValue(m, "herald_mock_apns_refused_streams_total") == 1)
        #expect(metricValue(m, "herald_mock_apns_streams_over_limit_total") == 0)
        // After acknowledging it, a second stream is a client bug: counted, and nghttp2 1.52 ends the
        // connection with GOAWAY PROTOCOL_ERROR (it does not use REFUSED_STREAM there).
        let late = try await twoStreamsAtOnce(port: mock.port, path: devicePath, acknowledgeSettings: true, pki: pki)
        #expect(late.goaway == 1, "PROTOCOL_ERROR")
        m = try await mock.metrics()
        #expect(metricValue(m, "herald_mock_apns_streams_over_limit_total") == 1)
        #expect(metricValue(m, "herald_mock_apns_streams_over_limit_max") == 1)
        #expect(metricValue(m, "herald_mock_apns_refused_streams_total") == 1)
        #expect(mock.stop() == 0)
    }

    @Test func certificateAuthNeedsNoJWTAndStartsAtMaxStreams() async throws {
        let mock = try await MockProcess.start(
            pki: pki,
            [
                "--topic", topic, "--client-ca", pki.caCert, "--max-streams", "300", "--metrics-port", "0",
                "--auth-key", "\(keyID):\(teamID):\(pki.providerPublicKey)",
            ])
        let withCert = try await nghttp(
            mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body,
            extra: ["--cert", pki.clientCert, "--key", pki.clientKey], pki: pki)
        #expect(withCert.answers.first?.status == 200)
        #expect(withCert.serverMaxConcurrentStreams == [300])
        // One configured topic: a certificate connection may leave apns-topic out.
        let noTopic = try await nghttp(
            mock.url, paths: [devicePath], body: body,
            extra: ["--cert", pki.clientCert, "--key", pki.clientKey], pki: pki)
        #expect(noTopic.answers.first?.status == 200)
        let without = try await nghttp(
            mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(without.answers.first?.status == 403)
        #expect(without.answers.first?.reason == "MissingProviderToken")
        #expect(without.serverMaxConcurrentStreams == [1])
        #expect(metricValue(try await mock.metrics(), "herald_mock_apns_connections_certificate_auth_total") == 2)
        #expect(mock.stop() == 0)
    }

    @Test func deadTokensAnswer410WithTheirTimestamp() async throws {
        let other = String(repeating: "cd", count: 32)
        let mock = try await MockProcess.start(
            pki: pki, ["--dead-token", "\(token):1700000000123", "--dead-token", other])
        let t = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(t.answers.first?.status == 410)
        #expect(t.answers.first?.reason == "Unregistered")
        #expect(t.answers.first?.timestamp == 1_700_000_000_123)
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        let t2 = try await nghttp(
            mock.url, paths: ["/3/device/" + other], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(t2.answers.first?.status == 410)
        let stamp = try #require(t2.answers.first?.timestamp)
        #expect(stamp >= before - 1000 && stamp <= before + 10_000)
        #expect(mock.stop() == 0)
    }

    @Test func faultRatesAreRoughlyHonouredAndSeeded() async throws {
        let bodyFile = try pki.write("fault-body.json", body)
        var runs: [String] = []
        for _ in 0..<2 {
            let mock = try await MockProcess.start(
                pki: pki,
                [
                    "--seed", "7", "--rate-429", "0.10", "--rate-503", "0.05",
                    "--rate-410", "0.05", "--rate-bad-token", "0.02", "--metrics-port", "0",
                ])
            let r = try await h2load(
                mock.url + devicePath, n: 4000, m: 1, headers: ["apns-topic": topic], bodyFile: bodyFile)
            #expect(r.ok + r.c4 + r.c5 == 4000)
            #expect(abs(r.ok - 3120) < 150, "\(r.output)")
            let m = try await mock.metrics()
            let c429 = metricValue(m, #"herald_mock_apns_requests_total{status="429",reason="TooManyRequests"}"#)
            let c503 = metricValue(m, #"herald_mock_apns_requests_total{status="503",reason="ServiceUnavailable"}"#)
            let c410 = metricValue(m, #"herald_mock_apns_requests_total{status="410",reason="Unregistered"}"#)
            let c400 = metricValue(m, #"herald_mock_apns_requests_total{status="400",reason="BadDeviceToken"}"#)
            #expect(abs(c429 - 400) < 80)
            #expect(abs(c503 - 200) < 60)
            #expect(abs(c410 - 200) < 60)
            #expect(abs(c400 - 80) < 40)
            #expect(c429 + c503 + c410 + c400 + r.ok == 4000)
            runs.append("\(c429) \(c503) \(c410) \(c400) \(r.ok)")
            #expect(mock.stop() == 0)
        }
        #expect(runs[0] == runs[1], "the same seed gives the same faults")
    }

    @Test func goawayEveryNStreams() async throws {
        let mock = try await MockProcess.start(
            pki: pki, ["--goaway-every", "3", "--initial-streams", "100", "--metrics-port", "0"])
        let paths = (0..<6).map { "/3/device/" + String(repeating: "ab", count: 31) + "0\($0)" }
        let t = try await nghttp(mock.url, paths: paths, headers: ["apns-topic": topic], body: body, pki: pki)
        let answered = t.answers.filter { $0.status == 200 }.map(\.streamID).sorted()
        #expect(answered.count == 3)
        let last = try #require(t.goawayLastStreamID)
        #expect(answered.last == last, "the last answered stream is the GOAWAY's last-stream-id")
        #expect(t.refusedStreams.count == 3)
        #expect(t.refusedStreams.allSatisfy { $0 > last })
        #expect(metricValue(try await mock.metrics(), "herald_mock_apns_refused_streams_total") == 3)
        #expect(metricValue(try await mock.metrics(), "herald_mock_apns_goaways_total") == 1)
        #expect(mock.stop() == 0)
    }

    @Test func resetEveryNStreamsDropsTheConnection() async throws {
        let bodyFile = try pki.write("reset-body.json", body)
        let mock = try await MockProcess.start(pki: pki, ["--reset-every", "5", "--metrics-port", "0"])
        let r = try await h2load(mock.url + devicePath, n: 20, m: 1, headers: ["apns-topic": topic], bodyFile: bodyFile)
        #expect(r.ok == 4, "\(r.output)")
        #expect(metricValue(try await mock.metrics(), "herald_mock_apns_resets_total") == 1)
        #expect(mock.stop() == 0)
    }

    @Test func resetRateDropsConnectionsAtRoughlyThatRate() async throws {
        let bodyFile = try pki.write("rate-reset-body.json", body)
        let mock = try await MockProcess.start(
            pki: pki, ["--rate-reset", "0.5", "--initial-streams", "100", "--metrics-port", "0"])
        // One request per connection (h2load -n 200 -c 200 would need 200 clients): 40 single-request
        // connections in turn; about half are dropped before their answer.
        var ok = 0
        for _ in 0..<40 {
            ok += try await h2load(
                mock.url + devicePath, n: 1, m: 1, headers: ["apns-topic": topic], bodyFile: bodyFile
            ).ok
        }
        let resets = metricValue(try await mock.metrics(), "herald_mock_apns_random_resets_total")
        #expect(ok + resets == 40, "every stream is answered or reset: \(ok) + \(resets)")
        #expect(resets >= 8 && resets <= 32, "\(resets) resets of 40 at rate 0.5")
        #expect(mock.stop() == 0)
    }

    @Test func pauseHoldsAnswersUntilResumeAndTheyFollowInOrder() async throws {
        let record = pki.dir + "/pause-record.jsonl"
        let mock = try await MockProcess.start(
            pki: pki, ["--metrics-port", "0", "--record", record, "--initial-streams", "100"])
        let mp = try #require(mock.metricsPort)
        #expect(
            try await runProcess("curl", ["-fs", "-X", "POST", "http://127.0.0.1:\(mp)/pause?ms=60000"]).output
                .contains("paused"))
        #expect(metricValue(try await mock.metrics(), "herald_mock_apns_paused") == 1)
        // A request sent while paused is not answered until the resume.
        let client = try SpawnedProcess(
            "nghttp",
            [
                "-n", "-t", "30", "-H", "apns-topic: \(topic)", "-d", try pki.write("pause-body.json", body),
                mock.url + devicePath,
            ], stdout: .discard, stderr: .discard)
        var held = 0
        for _ in 0..<50 where held == 0 {
            try await Task.sleep(for: .milliseconds(100))
            held = metricValue(try await mock.metrics(), "herald_mock_apns_held_answers")
        }
        #expect(held == 1)
        try await Task.sleep(for: .milliseconds(500))
        #expect(client.isRunning, "no answer during the pause")
        #expect((try? String(contentsOfFile: record, encoding: .utf8))?.isEmpty ?? true)
        let resumedAt = Date()
        _ = try await runProcess("curl", ["-fs", "-X", "POST", "http://127.0.0.1:\(mp)/resume"])
        while client.isRunning { try await Task.sleep(for: .milliseconds(20)) }
        #expect(Date().timeIntervalSince(resumedAt) < 5)
        #expect(client.waitForExit() == 0)
        let m = try await mock.metrics()
        #expect(metricValue(m, "herald_mock_apns_paused") == 0)
        #expect(metricValue(m, "herald_mock_apns_pauses_total") == 1)
        #expect(metricValue(m, #"herald_mock_apns_requests_total{status="200",reason=""}"#) == 1)
        // A timed pause ends by itself.
        _ = try await runProcess("curl", ["-fs", "-X", "POST", "http://127.0.0.1:\(mp)/pause?ms=300"])
        let t0 = Date()
        let t = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(t.answers.first?.status == 200)
        #expect(Date().timeIntervalSince(t0) >= 0.2)
        #expect(
            try await runProcess(
                "curl",
                [
                    "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                    "http://127.0.0.1:\(mp)/pause?ms=x",
                ]
            ).output == "400")
        #expect(mock.stop() == 0)
    }

    @Test func latencyIsAddedWithoutBlockingOtherStreams() async throws {
        let bodyFile = try pki.write("lat-body.json", body)
        // h2load opens its 100 streams before it has read the server's SETTINGS: start at 100 so
        // none is refused (with the APNs default of 1, nghttp2 refuses the other 99, as APNs would).
        let mock = try await MockProcess.start(pki: pki, ["--latency-ms", "100", "--initial-streams", "100"])
        let start = Date()
        let one = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(one.answers.first?.status == 200)
        #expect(Date().timeIntervalSince(start) >= 0.1)
        // 1000 requests, 100 in flight: about 10 round trips of 100 ms, not 1000.
        let t0 = Date()
        let r = try await h2load(
            mock.url + devicePath, n: 1000, m: 100, headers: ["apns-topic": topic], bodyFile: bodyFile)
        let elapsed = Date().timeIntervalSince(t0)
        #expect(r.ok == 1000)
        #expect(elapsed >= 1.0 && elapsed < 50.0, "\(elapsed) s (one stream at a time would take 100 s)")
        #expect(mock.stop() == 0)
    }

    @Test func recordFileHoldsOneLinePerAnswer() async throws {
        let record = pki.dir + "/record.jsonl"
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic, "--record", record])
        let id = "0d4b2b5e-5a57-4f2e-9b8a-2f0d2d8f1c11"
        _ = try await nghttp(
            mock.url, paths: [devicePath],
            headers: [
                "apns-topic": topic, "apns-id": id, "apns-priority": "5",
                "apns-push-type": "background", "apns-collapse-id": "c1", "apns-expiration": "1700000000",
            ],
            body: "{\"aps\":{\"content-available\":1},\n \"x\":\"é\"}", pki: pki)
        _ = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": "com.other"], body: body, pki: pki)
        // Written while the server runs, not only at exit.
        let written = await eventually(timeout: .seconds(2)) {
            ((try? String(contentsOfFile: record, encoding: .utf8)) ?? "").split(separator: "\n").count == 2
        }
        #expect(written, "the record file holds both answers while the stand-in still runs")
        #expect(mock.stop() == 0)
        let lines = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 2)
        let first = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        #expect(first["token"] as? String == token)
        #expect(first["topic"] as? String == topic)
        #expect(first["push_type"] as? String == "background")
        #expect(first["priority"] as? Int == 5)
        #expect(first["apns_id"] as? String == id)
        #expect(first["collapse_id"] as? String == "c1")
        #expect(first["expiration"] as? Int == 1_700_000_000)
        #expect(first["status"] as? Int == 200)
        #expect(first["reason"] is NSNull)
        let payload = try #require(first["payload"] as? [String: Any])
        #expect(payload["x"] as? String == "é")
        #expect((payload["aps"] as? [String: Any])?["content-available"] as? Int == 1)
        let at = try #require(first["at"] as? Int64)
        #expect(abs(at - Int64(Date().timeIntervalSince1970 * 1000)) < 60_000)
        let second = try #require(try JSONSerialization.jsonObject(with: Data(lines[1].utf8)) as? [String: Any])
        #expect(second["status"] as? Int == 400)
        #expect(second["reason"] as? String == "TopicDisallowed")
        #expect(second["push_type"] is NSNull)
    }

    @Test func metricsCountAnswersConnectionsAndStreams() async throws {
        let mock = try await MockProcess.start(pki: pki, ["--topic", topic, "--metrics-port", "0"])
        _ = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        _ = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": "nope"], body: body, pki: pki)
        let m = try await mock.metrics()
        #expect(metricValue(m, #"herald_mock_apns_requests_total{status="200",reason=""}"#) == 1)
        #expect(metricValue(m, #"herald_mock_apns_requests_total{status="400",reason="TopicDisallowed"}"#) == 1)
        #expect(metricValue(m, "herald_mock_apns_connections_total") == 2)
        #expect(metricValue(m, "herald_mock_apns_streams_total") == 2)
        #expect(m.contains("# TYPE herald_mock_apns_requests_total counter"))
        #expect(mock.stop() == 0)
    }

    /// One loop serves every connection, a share of input each per pass: a client that keeps a thousand large
    /// requests coming on one connection spends its budget again and again, and every request is still answered.
    @Test func aFloodingConnectionIsReadInShares() async throws {
        // At the full stream limit from the start: h2load opens its 1,000 streams before a limit could be raised.
        let mock = try await MockProcess.start(
            pki: pki, ["--topic", topic, "--metrics-port", "0", "--initial-streams", "1000"])
        let large = #"{"aps":{"alert":"\#(String(repeating: "x", count: 3_500))"}}"#
        let r = try await h2load(
            mock.url + devicePath, n: 6000, m: 1000, headers: ["apns-topic": topic],
            bodyFile: try pki.write("large-body.json", large))
        #expect(r.ok == 6000, "\(r.output)")
        let m = try await mock.metrics()
        #expect(metricValue(m, #"herald_mock_apns_requests_total{status="200",reason=""}"#) == 6000)
        #expect(metricValue(m, "herald_mock_apns_read_budget_spent_total") > 0)
        #expect(mock.stop() == 0)
    }

    @Test func survivesClientsThatDoNotSpeakH2OverTLS() async throws {
        let mock = try await MockProcess.start(pki: pki, ["--metrics-port", "0"])
        let http1 = try await runProcess(
            "curl", ["-sk", "--http1.1", "-o", "/dev/null", "-w", "%{http_code}", mock.url + devicePath])
        #expect(http1.output != "200")
        let cleartext = try await runProcess(
            "curl",
            [
                "-s", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}",
                "http://127.0.0.1:\(mock.port)" + devicePath,
            ])
        #expect(cleartext.output != "200")
        let t = try await nghttp(mock.url, paths: [devicePath], headers: ["apns-topic": topic], body: body, pki: pki)
        #expect(t.answers.first?.status == 200)
        #expect(metricValue(try await mock.metrics(), "herald_mock_apns_handshake_failures_total") == 2)
        #expect(mock.stop() == 0)
    }

    @Test func sigtermDrainsRequestsInFlightAfterGoaway() async throws {
        // The answer is held back long enough that SIGTERM lands while the request is in flight even on a loaded
        // host (with 400 ms, a busy test run signalled after the answer had gone, and no GOAWAY preceded it).
        let mock = try await MockProcess.start(pki: pki, ["--latency-ms", "8000", "--metrics-port", "0"])
        let client = try SpawnedProcess(
            "nghttp",
            ["-v", "-H", "apns-topic: \(topic)", "-d", try pki.write("drain.json", body), mock.url + devicePath],
            stdout: .pipe, stderr: .discard)
        // SIGTERM once the request is in (its answer is held back 8 s).
        let received = await eventually(timeout: .seconds(5)) {
            metricValue((try? await mock.metrics()) ?? "", "herald_mock_apns_streams_total") >= 1
        }
        #expect(received)
        // The mock drains for up to 9 s: wait for it on a thread of its own, not on one of the test pool's.
        #expect(try await offPool { mock.stop() } == 0)
        let out = String(decoding: try await offPool { client.readToEnd().stdout }, as: UTF8.self)
        client.waitForExit()
        let t = parseNghttp(out)
        #expect(t.answers.first?.status == 200, "the request received before SIGTERM is answered")
        #expect(out.contains(#"opaque_data(21)=[{"reason":"Shutdown"}]"#))
        #expect(t.goawayLastStreamID == t.answers.first?.streamID)
    }

    @Test func refusesToStartWithBadOptions() async throws {
        let exe = Paths.binDirectory + "/herald-mock-apns"
        let r = try await runProcess(exe, ["--cert", pki.serverCert, "--key", pki.serverKey, "--rate-429", "1.5"])
        #expect(r.status != 0)
        #expect(r.output.contains("--rate-429"))
        let r2 = try await runProcess(exe, ["--cert", "/nonexistent.pem", "--key", pki.serverKey])
        #expect(r2.status != 0)
        #expect(r2.output.contains("certificate"))
    }
}
