// End-to-end Web Push: a browser's subscription (keys this test made) is registered; a group message reaches the
// stand-in's push service once, encrypted for the subscription: the test decrypts what the stand-in received and
// finds what `heraldctl simulate` predicts; a 410 removes the subscription. `heraldctl push --provider webpush`
// reaches it too. Runs in the shared "End to end" suite.
import Foundation
import HeraldCore
import HeraldPushProviders
import HeraldTestSupport
import Testing

extension EndToEndTests {
    /// A browser: its subscription's keys, handed to the stand-in through its key directory.
    struct Browser {
        let id: String
        let key: WebPushP256Key
        let auth: [UInt8]
        let endpoint: String

        /// `maxBody`: the largest body the push service takes for this subscription (413 above it).
        /// `port`: the push service's (default: herald-mock-fcm's).
        init(_ stack: E2EStack, id: String, maxBody: Int = 4096, port: Int? = nil) throws {
            self.id = id
            key = try WebPushP256Key.generate()
            auth = (0..<16).map { _ in UInt8.random(in: 0...255) }
            endpoint = "https://127.0.0.1:\(port ?? stack.fcmPort)/wp/\(id)"
            let file: [String: Any] = [
                "private_key": try key.privatePEM(), "auth": WebPushBase64URL.encode(auth), "max_body": maxBody,
            ]
            try JSONSerialization.data(withJSONObject: file).write(
                to: URL(fileURLWithPath: stack.runDir + "/webpush/\(id).json"))
        }

        var subscriptionJSON: String {
            #"{"endpoint":"\#(endpoint)","expirationTime":null,"keys":{"p256dh":"\#(WebPushBase64URL.encode(key.publicPoint))","auth":"\#(WebPushBase64URL.encode(auth))"}}"#
        }

        var token: String {
            WebPushSubscription(
                endpoint: endpoint, p256dh: WebPushBase64URL.encode(key.publicPoint),
                auth: WebPushBase64URL.encode(auth)
            ).token
        }
    }

    @Test(
        "a group message reaches a browser once, encrypted for its subscription, as simulate predicts; a 410 removes the subscription"
    )
    func webPushDelivered() async throws {
        let browser = try Browser(stack, id: Scenarios.id("wp-b"))
        try await register("wp-b", ["--subscription", browser.subscriptionJSON])
        let eventID = Scenarios.id("webpush")
        let event = Scenarios.message(
            eventID, app: "app4", sender: "wp-s", conversation: "wp-group", recipients: ["wp-b"],
            createdAt: Self.now())
        // heraldctl simulate's prediction for the same state.
        let state = #"{"users":{"wp-b":{"devices":[{"token":"\#(browser.token)","kind":"webpush"}]}}}"#
        let sim = try await stack.heraldctl([
            "simulate", "--event", try stack.write("wp-event.json", event),
            "--state", try stack.write("wp-state.json", state), "--pipeline", stack.pipelinePath,
        ])
        #expect(sim.status == 0, "simulate: \(sim.stderr)")
        let predicted = try #require(
            sim.lines.flatMap { $0["notifications"] as? [[String: Any]] ?? [] }.first {
                $0["provider"] as? String == "webpush"
            })
        let predictedPayload = try JSONSerialization.data(withJSONObject: try #require(predicted["payload"]))

        try await stack.publish([event])
        let mine: () -> [[String: Any]] = {
            self.providerAnswers("webpush").filter { $0["target"] as? String == browser.id }
        }
        let arrived = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            mine().contains { $0["status"] as? Int == 201 }
        }
        #expect(arrived, "the browser got nothing\n\(failureContext())")
        try await Task.sleep(for: .milliseconds(1500))  // a late duplicate would show
        let answers = mine()
        #expect(answers.count == 1, "Web Push requests: \(answers.count)")
        let got = try #require(answers.first)
        // What the push service received, decrypted here with the subscription's own keys.
        let received = try #require((got["received"] as? String).flatMap { Data(base64Encoded: $0) })
        let plaintext = try WebPushCrypto.decrypt([UInt8](received), uaPrivate: browser.key, authSecret: browser.auth)
        #expect(canonicalJSON(plaintext) == canonicalJSON([UInt8](predictedPayload)), "differs from simulate's")
        #expect((got["body"] as? String).map { Array($0.utf8) } == plaintext, "the stand-in decrypted the same")
        let message = try #require(try JSONSerialization.jsonObject(with: Data(plaintext)) as? [String: Any])
        #expect((message["data"] as? [String: Any])?["conversation_id"] as? String == "wp-group")
        #expect(message["tag"] as? String == "c-wp-group")
        let headers = got["headers"] as? [String: String] ?? [:]
        #expect(headers["content-encoding"] == "aes128gcm")
        #expect(headers["urgency"] == "normal")
        #expect((Int(headers["ttl"] ?? "") ?? 0) > 0)

        // heraldctl push reaches the same subscription with the app's VAPID key.
        let push = try await stack.heraldctl([
            "push", "--provider", "webpush", "--subscription", browser.subscriptionJSON, "--body", "Hello",
            "--pipeline", stack.pipelinePath, "--app", "app4", "--ca-file", stack.runDir + "/server-cert.pem",
        ])
        #expect(push.status == 0, "push webpush: \(push.stdout) \(push.stderr)")
        #expect(push.lines.first?["status"] as? Int == 201 && push.lines.first?["provider"] as? String == "webpush")

        // The subscription expires at the push service: the next message is answered 410 and the device removed.
        try #require(
            FileManager.default.createFile(atPath: stack.runDir + "/webpush/\(browser.id).gone", contents: Data()))
        try await stack.publish([
            Scenarios.message(
                Scenarios.id("webpush-gone"), app: "app4", sender: "wp-s", conversation: "wp-group",
                recipients: ["wp-b"], createdAt: Self.now())
        ])
        var devices: [Device] = []
        let removed = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            devices = (try? await stack.store.loadUser(app: "app4", user: "wp-b", now: Self.now()))?.devices ?? []
            return !devices.contains { $0.kind == .webpush }
        }
        #expect(removed, "the gone subscription is still registered\n\(failureContext())")
        #expect(mine().contains { $0["status"] as? Int == 410 })
    }

    @Test("a push service that refuses a message as too large (413) gets it once more, shrunk to half the size")
    func webPushShrunkAfter413() async throws {
        let browser = try Browser(stack, id: Scenarios.id("wp-small"), maxBody: 1200)
        try await register("wp-m", ["--subscription", browser.subscriptionJSON])
        let text = String(repeating: "a long line of chat ", count: 90)  // 1,800 bytes
        try await stack.publish([
            Scenarios.message(
                Scenarios.id("webpush-413"), app: "app4", sender: "wp-s", conversation: "wp-long", type: "direct",
                text: text, recipients: ["wp-m"], createdAt: Self.now())
        ])
        let mine: () -> [[String: Any]] = {
            self.providerAnswers("webpush").filter { $0["target"] as? String == browser.id }
        }
        let delivered = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            mine().contains { $0["status"] as? Int == 201 }
        }
        #expect(delivered, "never delivered: \(mine().map { $0["status"] ?? "" })\n\(failureContext())")
        try await Task.sleep(for: .milliseconds(1500))
        let answers = mine()
        #expect(answers.compactMap { $0["status"] as? Int } == [413, 201])
        let first = try #require((answers.first?["received"] as? String).flatMap { Data(base64Encoded: $0) })
        let last = try #require((answers.last?["received"] as? String).flatMap { Data(base64Encoded: $0) })
        #expect(last.count <= first.count / 2, "\(last.count) bytes after \(first.count)")
        let plaintext = try WebPushCrypto.decrypt([UInt8](last), uaPrivate: browser.key, authSecret: browser.auth)
        let message = try #require(try JSONSerialization.jsonObject(with: Data(plaintext)) as? [String: Any])
        #expect((message["body"] as? String)?.hasSuffix("\u{2026}") == true)
        #expect((message["data"] as? [String: Any])?["conversation_id"] as? String == "wp-long")
    }

    @Test("a push service without HTTP/2 is reached over HTTP/1.1, from its first message on")
    func webPushHTTP1Fallback() async throws {
        let record = stack.runDir + "/webpush-h1.jsonl"
        let service = ChildProcess(
            name: "herald-mock-fcm-h1", executable: stack.binDir + "/herald-mock-fcm",
            arguments: [
                "--port", "\(stack.webpushHTTP1Port)", "--cert", stack.runDir + "/server-cert.pem",
                "--key", stack.runDir + "/server-key.pem", "--project", E2EStack.fcmProject,
                "--client-email", E2EStack.fcmClientEmail, "--service-public-key", stack.runDir + "/fcm-sa.key",
                "--webpush-keys", stack.runDir + "/webpush", "--no-http2", "--record", record,
            ], logPath: stack.runDir + "/mock-fcm-h1.log")
        try service.start()
        defer { service.stopNow() }
        let browser = try Browser(stack, id: Scenarios.id("wp-h1"), port: stack.webpushHTTP1Port)
        try await register("wp-h", ["--subscription", browser.subscriptionJSON])
        func answers() -> [[String: Any]] {
            guard let text = try? String(contentsOfFile: record, encoding: .utf8) else { return [] }
            return text.split(separator: "\n").compactMap {
                try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }.filter { $0["target"] as? String == browser.id }
        }
        for n in 1...2 {
            try await stack.publish([
                Scenarios.message(
                    Scenarios.id("webpush-h1-\(n)"), app: "app4", sender: "wp-s", conversation: "wp-h1",
                    type: "direct", text: "over HTTP/1.1 \(n)", recipients: ["wp-h"], createdAt: Self.now())
            ])
            let delivered = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
                answers().filter { $0["status"] as? Int == 201 }.count == n
            }
            #expect(delivered, "message \(n) not delivered: \(answers())\n\(failureContext())")
        }
        let got = answers()
        #expect(got.count == 2, "each message once: \(got.count)")
        let last = try #require((got.last?["received"] as? String).flatMap { Data(base64Encoded: $0) })
        let plaintext = try WebPushCrypto.decrypt([UInt8](last), uaPrivate: browser.key, authSecret: browser.auth)
        let message = try #require(try JSONSerialization.jsonObject(with: Data(plaintext)) as? [String: Any])
        #expect((message["body"] as? String)?.contains("over HTTP/1.1 2") == true)
    }
}
