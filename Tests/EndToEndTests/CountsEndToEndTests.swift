// End to end: Herald-kept counts and token ownership through the registry API (docs/behaviour.md §12, §3).
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@Suite("End to end: registry API, counts, token ownership, reloading", .serialized, .e2eStack, .timeLimit(.minutes(10)))
struct CountsEndToEndTests {
    let stack: E2EStack
    init() throws { stack = try E2EStack.shared() }

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
    static let token = String(repeating: "5a", count: 32)

    /// The pushes the stand-in answered 200 for `eventID` on `token`.
    func delivered(_ eventID: String, token: String = token) -> [RecordedRequest] {
        let id = APNsID.derive(eventID: eventID, token: token).lowercased()
        return stack.recorded().filter { $0.token == token && $0.apnsID == id && $0.status == 200 }
    }

    /// Publishes one message from `cu1` to `recipient` in `cc1`, and waits until it was delivered to `token`.
    func sendAndAwait(
        _ eventID: String, to recipient: String = "cu2", mentions: [String] = []
    ) async throws -> [String: Any] {
        try await stack.publish([
            Scenarios.message(
                eventID, app: "app5", sender: "cu1", conversation: "cc1",
                recipients: [recipient], mentions: mentions, createdAt: Self.now())
        ])
        try await waitUntil("\(eventID) delivered to the device\n\(context())", timeout: .seconds(60)) {
            !delivered(eventID).isEmpty
        }
        let payload = try #require(delivered(eventID).first?.payload)
        return try #require(try JSONSerialization.jsonObject(with: payload) as? [String: Any])
    }

    func context() -> String {
        ["resolve", "registry"].map { "--- \($0):\n" + (stack.stageProcesses[$0]?.logTail(6) ?? "") }.joined(
            separator: "\n")
    }

    func badge(_ payload: [String: Any]) -> Int? { (payload["aps"] as? [String: Any])?["badge"] as? Int }
    func sendbird(_ payload: [String: Any]) -> [String: Any] { payload["sendbird"] as? [String: Any] ?? [:] }

    @Test(
        "the badge rises with each message and resets on mark_read; a replayed event does not count twice; a moved token no longer gets the first user's pushes"
    )
    func countsAndOwnership() async throws {
        // The device, registered through the API (herald.registry -> herald-registry).
        let register = try await stack.api(
            "POST", "/v1/apps/app5/users/cu2/devices",
            body: #"{"token": "\#(Self.token)", "bundle_id": "com.example.chat"}"#)
        #expect(register.status == 202, "\(register.body)")
        try await waitUntil("the device is registered") {
            try await stack.store.loadUser(app: "app5", user: "cu2", now: Self.now()).devices.map(\.token) == [
                Self.token
            ]
        }

        // Three messages: badge 1, 2, 3; Sendbird's counts follow; the mention is counted apart.
        let run = Scenarios.id("counts")
        var p = try await sendAndAwait("\(run)-1")
        #expect(badge(p) == 1)
        p = try await sendAndAwait("\(run)-2", mentions: ["cu2"])
        #expect(badge(p) == 2)
        #expect(sendbird(p)["unread_message_count"] as? Int == 2)
        #expect(sendbird(p)["channel_unread_count"] as? Int == 2)
        let mentioned = sendbird(p)["mentioned_users"] as? [String: Any]
        #expect(mentioned?["total_unread_mention_count"] as? Int == 1)
        #expect(mentioned?["channel_unread_mention_count"] as? Int == 1)
        p = try await sendAndAwait("\(run)-3")
        #expect(badge(p) == 3)

        // mark_read through the API: the counts are 0 again, and the next message shows 1.
        #expect(
            try await stack.api("POST", "/v1/apps/app5/users/cu2/read", body: #"{"conversation": "cc1"}"#).status == 202
        )
        try await waitUntil("the counts were reset") {
            let c = try await stack.api("GET", "/v1/apps/app5/users/cu2/counts").json
            return (c?["unread"] as? [String: Any])?["total"] as? Int == 0
        }
        p = try await sendAndAwait("\(run)-4")
        #expect(badge(p) == 1)

        // A replay of event 4 (the chat back end publishes it again): counted once, delivered once.
        try await stack.publish([
            Scenarios.message(
                "\(run)-4", app: "app5", sender: "cu1", conversation: "cc1",
                recipients: ["cu2"], createdAt: Self.now())
        ])
        p = try await sendAndAwait("\(run)-5")
        #expect(badge(p) == 2, "the replayed event was counted again")
        #expect(await stack.awaitIdle(), "the pipeline did not become idle\n\(context())")
        #expect(delivered("\(run)-4").count == 1)
        let counts = try await stack.api("GET", "/v1/apps/app5/users/cu2/counts").json
        #expect((counts?["unread"] as? [String: Any])?["total"] as? Int == 2)

        // The phone switches accounts: the token registered for cu3 moves away from cu2.
        #expect(
            try await stack.api(
                "POST", "/v1/apps/app5/users/cu3/devices",
                body: #"{"token": "\#(Self.token)", "bundle_id": "com.example.chat"}"#
            ).status == 202)
        try await waitUntil("the token moved to cu3") {
            let gone = try await stack.store.loadUser(app: "app5", user: "cu2", now: Self.now()).devices.isEmpty
            let owner = try await stack.store.owner(app: "app5", token: Self.token)
            return gone && owner == "cu3"
        }
        // A message to cu2 now reaches no device: the explain (through the API) says so.
        try await stack.publish([
            Scenarios.message(
                "\(run)-6", app: "app5", sender: "cu1", conversation: "cc1",
                recipients: ["cu2"], createdAt: Self.now())
        ])
        try await waitUntil("cu2's decision for \(run)-6 is no_devices\n\(context())", timeout: .seconds(60)) {
            let e = try await stack.api("GET", "/v1/apps/app5/users/cu2/explain").json
            return e?["event"] as? String == "\(run)-6" && e?["reason"] as? String == "no_devices"
        }
        // cu3's message reaches the phone; cu2's never did.
        _ = try await sendAndAwait("\(run)-7", to: "cu3")
        #expect(await stack.awaitIdle(), "the pipeline did not become idle\n\(context())")
        #expect(delivered("\(run)-6").isEmpty, "the first user's push reached the moved token")
        #expect(try await stack.api("GET", "/v1/apps/app5/users/cu3/explain").json?["decision"] as? String == "deliver")
    }

    // MARK: Reloading

    /// A stage's `herald_config_reloads_total{outcome}`.
    func reloads(_ outcome: String, stage: String = "render") -> Int {
        guard let port = stack.stagePorts[stage], let text = httpBody(port: port, path: "/metrics") else { return 0 }
        let prefix = #"herald_config_reloads_total{stage="\#(stage)",outcome="\#(outcome)"} "#
        for line in text.split(separator: "\n") where line.hasPrefix(prefix) {
            return Int(Double(line.dropFirst(prefix.count)) ?? 0)
        }
        return 0
    }

    /// SIGHUP to a stage (render reloads only on SIGHUP in this stack; send also watches the file).
    func hangUp(_ stage: String) throws {
        guard let pid = stack.stageProcesses[stage]?.pid else { throw HarnessError("herald-\(stage) is not running") }
        kill(pid, SIGHUP)
    }

    func body(_ r: RecordedRequest) -> String? {
        guard let payload = r.payload, let o = try? JSONSerialization.jsonObject(with: payload) as? [String: Any] else {
            return nil
        }
        return ((o["aps"] as? [String: Any])?["alert"] as? [String: Any])?["body"] as? String
    }

    @Test(
        "a template changed while events flow (SIGHUP): nothing lost or doubled, new pushes carry the new text; a bad file is refused and the old configuration keeps running"
    )
    func templateReload() async throws {
        let token = String(repeating: "6b", count: 32)
        try await stack.store.registerDevice(
            app: "app6", user: "ru2",
            device: Device(token: token, bundleID: "com.example.chat", registeredAt: Self.now()))
        let original = try String(contentsOfFile: stack.pipelinePath, encoding: .utf8)
        #expect(original.contains("REL-V1 {message}"))
        let run = Scenarios.id("reload")
        func events(_ range: Range<Int>) -> [String] {
            range.map {
                Scenarios.message(
                    "\(run)-\($0)", app: "app6", sender: "ru1", conversation: "rc1", recipients: ["ru2"],
                    createdAt: Self.now())
            }
        }
        func deliveredBodies(_ range: Range<Int>) -> [Int: [String]] {
            var out: [Int: [String]] = [:]
            let byID = Dictionary(
                grouping: stack.recorded().filter { $0.token == token && $0.status == 200 }, by: \.apnsID)
            for i in range {
                let id = APNsID.derive(eventID: "\(run)-\(i)", token: token).lowercased()
                out[i] = (byID[id] ?? []).compactMap(body)
            }
            return out
        }
        let appliedBefore = reloads("applied")

        // Events flow while the file changes: the first 100 in chunks, the template edited after the second.
        for chunk in 0..<5 {
            try await stack.publish(events((chunk * 20)..<(chunk * 20 + 20)))
            if chunk == 1 {
                try original.replacingOccurrences(of: "REL-V1 {message}", with: "REL-V2 {message}")
                    .write(toFile: stack.pipelinePath, atomically: true, encoding: .utf8)
                try hangUp("render")
            }
        }
        try await waitUntil("render reloaded the file\n\(stack.stageProcesses["render"]?.logTail(5) ?? "")") {
            reloads("applied") > appliedBefore
        }
        // Published after the reload was seen: these must carry the new text.
        try await stack.publish(events(100..<130))
        try await waitUntil("all 130 events delivered", timeout: .seconds(90)) {
            deliveredBodies(0..<130).values.allSatisfy { !$0.isEmpty }
        }
        #expect(await stack.awaitIdle(), "the pipeline did not become idle")
        let bodies = deliveredBodies(0..<130)
        #expect(bodies.values.allSatisfy { $0.count == 1 }, "an event was delivered twice")
        #expect(bodies.values.allSatisfy { $0.first == "REL-V1 Bye!" || $0.first == "REL-V2 Bye!" })
        #expect((100..<130).allSatisfy { bodies[$0]?.first == "REL-V2 Bye!" })

        // A bad file is refused with a clear error; render keeps the last good configuration.
        let refusedBefore = reloads("refused")
        try "apps:\n  app6:\n    templates: [unclosed\n".write(
            toFile: stack.pipelinePath, atomically: true, encoding: .utf8)
        try hangUp("render")
        try await waitUntil("render refused the bad file") { reloads("refused") > refusedBefore }
        // The counter can move before the log line reaches the file: wait for the line too.
        try await waitUntil("render logged the refusal") {
            (try? String(contentsOfFile: stack.runDir + "/render.log", encoding: .utf8))?
                .contains("pipeline file refused") == true
        }
        try await stack.publish(events(130..<140))
        try await waitUntil("10 more events delivered after the bad file", timeout: .seconds(60)) {
            deliveredBodies(130..<140).values.allSatisfy { !$0.isEmpty }
        }
        #expect((130..<140).allSatisfy { deliveredBodies(130..<140)[$0] == ["REL-V2 Bye!"] })
        #expect(stack.stageProcesses["render"]?.isRunning == true)

        // The original file back (other tests of the suite use it).
        let appliedNow = reloads("applied")
        try original.write(toFile: stack.pipelinePath, atomically: true, encoding: .utf8)
        try hangUp("render")
        try await waitUntil("render reloaded the original file") { reloads("applied") > appliedNow }
    }

    @Test(
        "an APNs key rotated while events flow (file watch): nothing lost or doubled; new connections sign with the new key"
    )
    func keyRotation() async throws {
        let token = String(repeating: "7c", count: 32)
        try await stack.store.registerDevice(
            app: "app6", user: "ku2",
            device: Device(token: token, bundleID: "com.example.chat", registeredAt: Self.now()))
        let original = try String(contentsOfFile: stack.pipelinePath, encoding: .utf8)
        let key1 = "key_id: \(E2EStack.keyID), key_file: \(stack.runDir)/auth.p8}"
        #expect(original.contains("environment: production, " + key1))
        func rotated(_ keyID: String, _ file: String) -> String {
            original.replacingOccurrences(
                of: "environment: production, " + key1,
                with: "environment: production, key_id: \(keyID), key_file: \(stack.runDir)/\(file)}")
        }
        let run = Scenarios.id("rotate")
        func events(_ range: Range<Int>) -> [String] {
            range.map {
                Scenarios.message(
                    "\(run)-\($0)", app: "app6", sender: "ku1", conversation: "kc1", recipients: ["ku2"],
                    createdAt: Self.now())
            }
        }
        func answers(_ i: Int) -> [RecordedRequest] {
            let id = APNsID.derive(eventID: "\(run)-\(i)", token: token).lowercased()
            return stack.recorded().filter { $0.token == token && $0.apnsID == id }
        }
        let appliedBefore = reloads("applied", stage: "send")
        for chunk in 0..<4 {
            try await stack.publish(events((chunk * 20)..<(chunk * 20 + 20)))
            if chunk == 1 {
                try rotated(E2EStack.keyID2, "auth2.p8").write(
                    toFile: stack.pipelinePath, atomically: true, encoding: .utf8)
            }
        }
        try await waitUntil("send reloaded its credentials\n\(stack.stageProcesses["send"]?.logTail(5) ?? "")") {
            reloads("applied", stage: "send") > appliedBefore
        }
        try await stack.publish(events(80..<100))
        try await waitUntil("all 100 events delivered", timeout: .seconds(90)) {
            (0..<100).allSatisfy { i in answers(i).contains { $0.status == 200 } }
        }
        #expect(await stack.awaitIdle(), "the pipeline did not become idle")
        #expect(
            (0..<100).allSatisfy { i in answers(i).filter { $0.status == 200 }.count == 1 },
            "an event was delivered twice")

        // A key the stand-in does not know: the next push is refused with 403, so new connections sign with it.
        let appliedNow = reloads("applied", stage: "send")
        try rotated("E2EKEY0003", "auth3.p8").write(toFile: stack.pipelinePath, atomically: true, encoding: .utf8)
        try await waitUntil("send reloaded the third key") { reloads("applied", stage: "send") > appliedNow }
        try await stack.publish(events(100..<101))
        try await waitUntil("the stand-in refused the push signed with the unknown key", timeout: .seconds(60)) {
            answers(100).contains { $0.status == 403 }
        }
        // The original file back; the refused push may then go through on a retry.
        let appliedLast = reloads("applied", stage: "send")
        try original.write(toFile: stack.pipelinePath, atomically: true, encoding: .utf8)
        try await waitUntil("send reloaded the original file") { reloads("applied", stage: "send") > appliedLast }
    }
}
