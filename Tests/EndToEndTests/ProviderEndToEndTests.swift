// End-to-end with every provider: one group message reaches an iPhone (APNs), an Android phone (FCM)
// and a webhook user, each exactly once with the payload `simulate` predicts; an FCM 404 UNREGISTERED
// removes the token; a webhook 503 is retried to delivery. Runs in the shared "End to end" suite.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldTestSupport
import Testing

/// An FCM registration token in FCM's alphabet.
func fcmTok(_ n: Int) -> String { "e2e\(n):APA91b" + String(repeating: "Fx_-", count: 30) + String(n) }

extension EndToEndTests {
    /// Answers herald-mock-fcm recorded for an endpoint.
    func providerAnswers(_ endpoint: String) -> [[String: Any]] {
        stack.recordedProviders().filter { $0["endpoint"] as? String == endpoint }
    }

    func register(_ user: String, _ arguments: [String]) async throws {
        let r = try await stack.heraldctl(["device", "register", "--app", "app4", "--user", user] + arguments)
        #expect(r.status == 0, "device register \(user): \(r.stderr)")
    }

    @Test(
        "one group message reaches an iPhone (APNs), an Android phone (FCM) and a webhook user, each once with its own payload"
    )
    func everyProviderOnce() async throws {
        let ios = tok(901), android = fcmTok(901), hook = "hook-pv-w"
        try await register("pv-i", ["--token", ios, "--bundle-id", "com.example.calls"])
        try await register(
            "pv-a", ["--token", android, "--platform", "FCM_ANDROID", "--provider-id", "fcm-provider-1"])
        try await register("pv-w", ["--token", hook, "--kind", "webhook", "--provider-id", "custom-1"])
        let eventID = Scenarios.id("providers")
        let event = Scenarios.message(
            eventID, app: "app4", sender: "pv-s", conversation: "pv-group",
            recipients: ["pv-i", "pv-a", "pv-w"], createdAt: Self.now())
        // What simulate predicts for the same state.
        var fixture = StateFixture()
        for user in ["pv-i", "pv-a", "pv-w"] {
            fixture.users[user] = try await stack.store.loadUser(app: "app4", user: user, now: Self.now())
        }
        let lines = try Simulator.simulate(
            eventBytes: Array(event.utf8), fixture: fixture, apps: stack.apps, at: nil, now: Date())
        let predicted = lines.flatMap(\.notifications)
        #expect(predicted.map(\.provider).sorted { $0.rawValue < $1.rawValue } == [.apns, .fcm, .webhook])

        let tokensBefore = providerAnswers("token").count
        try await stack.publish([event])
        let apnsPair = ios + "/" + (predicted.first { $0.provider == .apns }?.apnsID.lowercased() ?? "")
        let arrived = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            stack.deliveredCounts()[apnsPair] != nil
                && providerAnswers("send").contains {
                    $0["target"] as? String == android && $0["status"] as? Int == 200
                }
                && providerAnswers("webhook").contains {
                    ($0["body"] as? String)?.contains(#""uid":"pv-w""#) == true && $0["status"] as? Int == 200
                }
        }
        #expect(arrived, "not every provider got its notification\n\(failureContext())")
        try await Task.sleep(for: .milliseconds(1500))  // a late duplicate would show

        #expect(stack.deliveredCounts()[apnsPair] == 1, "APNs deliveries: \(stack.deliveredCounts()[apnsPair] ?? 0)")
        let fcm = providerAnswers("send").filter { $0["target"] as? String == android && $0["status"] as? Int == 200 }
        #expect(fcm.count == 1, "FCM deliveries: \(fcm.count)")
        let hooks = providerAnswers("webhook").filter {
            ($0["body"] as? String)?.contains(#""uid":"pv-w""#) == true && $0["status"] as? Int == 200
        }
        #expect(hooks.count == 1, "webhook deliveries: \(hooks.count)")
        if let f = fcm.first, let body = f["body"] as? String,
            let want = predicted.first(where: { $0.provider == .fcm })
        {
            #expect(
                canonicalJSON(Array(body.utf8)) == canonicalJSON(want.payload), "FCM payload differs from simulate's")
        }
        if let h = hooks.first, let body = h["body"] as? String,
            let want = predicted.first(where: { $0.provider == .webhook })
        {
            #expect(
                canonicalJSON(Array(body.utf8)) == canonicalJSON(want.payload),
                "webhook payload differs from simulate's")
        }
        // The running send already holds its access token: at most one fetch (a send restarted by an earlier
        // test may still be fetching its first), never one per request.
        #expect(providerAnswers("token").count - tokensBefore <= 1)
        #expect(providerAnswers("token").allSatisfy { $0["status"] as? Int == 200 })
    }

    @Test("an FCM 404 UNREGISTERED removes the token from Redis; the user's other device stays")
    func fcmUnregisteredRemoved() async throws {
        try await register("pv-d", ["--token", E2EStack.fcmDeadToken, "--kind", "fcm"])
        try await register("pv-d", ["--token", tok(902), "--bundle-id", "com.example.calls"])
        try await stack.publish([
            Scenarios.message(
                Scenarios.id("fcm-dead"), app: "app4", sender: "pv-s", conversation: "pv-dd",
                type: "direct", recipients: ["pv-d"], createdAt: Self.now())
        ])
        var devices: [String] = []
        let removed = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            devices = ((try? await stack.store.loadUser(app: "app4", user: "pv-d", now: Self.now()))?.devices ?? [])
                .map(\.token)
            return !devices.contains(E2EStack.fcmDeadToken)
        }
        #expect(removed, "the dead FCM token is still registered\n\(failureContext())")
        #expect(devices == [tok(902)])
        #expect(
            providerAnswers("send").contains {
                $0["target"] as? String == E2EStack.fcmDeadToken && $0["status"] as? Int == 404
                    && $0["reason"] as? String == "UNREGISTERED"
            })
    }

    @Test("a webhook 503 is retried (herald.retry) until delivered, once")
    func webhook503Retried() async throws {
        try await register("pv-f", ["--token", "hook-pv-f", "--kind", "webhook", "--provider-id", "flaky"])
        try await stack.publish([
            Scenarios.message(
                Scenarios.id("flaky"), app: "app4", sender: "pv-s", conversation: "pv-fd",
                type: "direct", recipients: ["pv-f"], createdAt: Self.now())
        ])
        var statuses: [Int] = []
        let delivered = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            statuses = providerAnswers("webhook").filter { ($0["body"] as? String)?.contains(#""uid":"pv-f""#) == true }
                .compactMap { $0["status"] as? Int }
            return statuses.contains(200)
        }
        #expect(delivered, "never delivered: \(statuses)\n\(failureContext())")
        try await Task.sleep(for: .milliseconds(1500))
        statuses = providerAnswers("webhook").filter { ($0["body"] as? String)?.contains(#""uid":"pv-f""#) == true }
            .compactMap { $0["status"] as? Int }
        #expect(statuses == [503, 503, 200])
    }
}

extension EndToEndTests {
    @Test("heraldctl push reaches an FCM token and a webhook; simulate lists their requests")
    func heraldctlPushAndSimulateProviders() async throws {
        let ca = stack.runDir + "/server-cert.pem"
        var r = try await stack.heraldctl([
            "push", "--provider", "fcm", "--device-token", fcmTok(903), "--body", "Hello",
            "--pipeline", stack.pipelinePath, "--app", "app4",
            "--host", "127.0.0.1:\(stack.fcmPort)", "--ca-file", ca,
        ])
        #expect(r.status == 0, "push fcm: \(r.stdout) \(r.stderr)")
        #expect(r.lines.first?["status"] as? Int == 200 && r.lines.first?["provider"] as? String == "fcm")
        #expect(
            providerAnswers("send").contains { $0["target"] as? String == fcmTok(903) && $0["status"] as? Int == 200 })

        r = try await stack.heraldctl([
            "push", "--provider", "fcm", "--device-token", E2EStack.fcmDeadToken, "--body", "Hello",
            "--pipeline", stack.pipelinePath, "--app", "app4",
            "--host", "127.0.0.1:\(stack.fcmPort)", "--ca-file", ca,
        ])
        #expect(r.status == 1)
        #expect(
            r.lines.first?["reason"] as? String == "UNREGISTERED"
                && r.lines.first?["disposition"] as? String == "token_dead")

        r = try await stack.heraldctl([
            "push", "--provider", "webhook", "--device-token", "pv-ctl", "--body", "Hello",
            "--url", "https://127.0.0.1:\(stack.fcmPort)/webhook/custom-1",
            "--user", E2EStack.webhookUser, "--password", E2EStack.webhookPassword, "--ca-file", ca,
        ])
        #expect(r.status == 0, "push webhook: \(r.stdout) \(r.stderr)")
        #expect(r.lines.first?["status"] as? Int == 200)
        r = try await stack.heraldctl([
            "push", "--provider", "webhook", "--device-token", "pv-ctl", "--body", "Hello",
            "--url", "https://127.0.0.1:\(stack.fcmPort)/webhook/custom-1",
            "--user", E2EStack.webhookUser, "--password", "wrong", "--ca-file", ca,
        ])
        #expect(r.status == 1 && r.lines.first?["status"] as? Int == 401)

        // simulate: the FCM and webhook requests with their provider and complete body.
        let state =
            #"{"users":{"pv-a":{"devices":[{"token":"\#(fcmTok(904))","platform":"FCM_ANDROID"}]},"pv-w":{"devices":[{"token":"h","kind":"webhook","provider_id":"custom-1"}]}}}"#
        let event = Scenarios.message(
            Scenarios.id("sim-providers"), app: "app4", sender: "pv-s", conversation: "pv-sim",
            recipients: ["pv-a", "pv-w"], createdAt: Self.now())
        r = try await stack.heraldctl([
            "simulate", "--event", try stack.write("sim-p-event.json", event),
            "--state", try stack.write("sim-p-state.json", state), "--pipeline", stack.pipelinePath,
        ])
        #expect(r.status == 0, "simulate: \(r.stderr)")
        let notifications = r.lines.flatMap { $0["notifications"] as? [[String: Any]] ?? [] }
        #expect(notifications.compactMap { $0["provider"] as? String }.sorted() == ["fcm", "webhook"])
        let fcm = notifications.first { $0["provider"] as? String == "fcm" }
        #expect(((fcm?["payload"] as? [String: Any])?["message"] as? [String: Any])?["token"] as? String == fcmTok(904))
        #expect(fcm?["provider_id"] as? String == "fcm-provider-1")
    }
}
