// End to end, fewer and better notifications: a burst of group messages wakes each device once and keeps one
// notification up to date; an urgent call and a passive broadcast reach the same user side by side with their own
// interruption levels. Runs in the shared "End to end" suite.
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

extension EndToEndTests {
    /// The 200-answered pushes of `tokens`, in the order the stand-in answered them.
    func answered(_ tokens: Set<String>) -> [RecordedRequest] {
        stack.recorded().filter { tokens.contains($0.token) && $0.status == 200 }.sorted { $0.at < $1.at }
    }

    func aps(_ r: RecordedRequest) -> [String: Any] {
        guard let data = r.payload, let o = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            return [:]
        }
        return o["aps"] as? [String: Any] ?? [:]
    }

    @Test("a burst of 20 group messages: each device gets 1 sound, at most 3 pushes, one collapse id, the right count")
    func burstToGroup() async throws {
        let devices = [
            (user: "bu-1", token: tok(701)), (user: "bu-1", token: tok(702)), (user: "bu-2", token: tok(703)),
        ]
        for d in devices {
            let r = try await stack.heraldctl([
                "device", "register", "--app", "app7", "--user", d.user, "--token", d.token,
                "--bundle-id", "com.example.chat",
            ])
            #expect(r.status == 0, "device register: \(r.stderr)")
        }
        let conversation = Scenarios.id("hiking")
        let start = Self.now()
        let events = (0..<20).map { n in
            Scenarios.message(
                Scenarios.id("burst-\(n)"), app: "app7", sender: "bu-s", conversation: conversation,
                text: "message \(n)", recipients: ["bu-1", "bu-2"], createdAt: start + Int64(n) * 500)
        }
        try await stack.publish(events)
        let tokens = Set(devices.map(\.token))
        func body(_ r: RecordedRequest) -> String {
            (aps(r)["alert"] as? [String: Any])?["body"] as? String ?? ""
        }
        // The held messages are flushed once the update interval (4 s) has passed: the last push says 20.
        let arrived = await eventually(timeout: .seconds(90), interval: .milliseconds(200)) {
            let got = answered(tokens)
            return devices.allSatisfy { d in
                got.contains { $0.token == d.token && body($0) == "20 new messages in Hiking" }
            }
        }
        #expect(arrived, "the burst's last update did not arrive\n\(failureContext())")
        #expect(await stack.awaitIdle(), "the pipeline did not go idle")
        for d in devices {
            let pushes = answered(tokens).filter { $0.token == d.token }
            let sounds = pushes.filter { aps($0)["sound"] != nil }
            #expect(sounds.count == 1, "\(d.token.suffix(4)): \(sounds.count) pushes with a sound")
            #expect(pushes.count >= 2 && pushes.count <= 3, "\(d.token.suffix(4)): \(pushes.count) visible pushes")
            #expect(
                Set(pushes.map(\.collapseID)) == ["b-" + conversation], "collapse ids \(pushes.map(\.collapseID))")
            #expect(
                aps(pushes[0])["sound"] != nil && !body(pushes[0]).contains("new messages"), "first \(body(pushes[0]))")
            #expect(pushes.last.map(body) == "20 new messages in Hiking", "bodies \(pushes.map(body))")
        }
        // The trail says which messages were held back, and the counter counts them.
        var line: [String: Any] = [:]
        let explained = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let r = try? await stack.heraldctl([
                "explain", "--app", "app7", "--event", Scenarios.id("burst-5"), "--user", "bu-2",
            ])
            line = r?.lines.first ?? [:]
            return line["decision"] as? String == "suppress"
        }
        #expect(explained && line["reason"] as? String == "coalesced", "explain burst-5 bu-2: \(line)")
        let metrics = stack.stagePorts["suppress"].flatMap { httpBody(port: $0, path: "/metrics") } ?? ""
        let coalesced = metrics.split(separator: "\n").filter { $0.hasPrefix("herald_coalesced_total{") }
        #expect(coalesced.contains { $0.contains("outcome=\"held\"") }, "herald_coalesced_total: \(coalesced)")
        #expect(coalesced.contains { $0.contains("outcome=\"flushed\"") }, "herald_coalesced_total: \(coalesced)")
    }

    @Test("the flood guard: 3 pushes a minute, the rest summarised at the next minute, a call still rings")
    func floodGuard() async throws {
        let token = tok(721)
        let r = try await stack.heraldctl([
            "device", "register", "--app", "app8", "--user", "fl-1", "--token", token, "--bundle-id",
            "com.example.chat",
        ])
        #expect(r.status == 0, "device register: \(r.stderr)")
        // All six within one minute of the clock: start early in a minute.
        _ = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) { Self.now() % 60_000 < 30_000 }
        let now = Self.now()
        let messages = (0..<6).map { n in
            Scenarios.message(
                Scenarios.id("flood-\(n)"), app: "app8", sender: "fl-s\(n)", conversation: Scenarios.id("fl-dm\(n)"),
                type: "direct", text: "hello \(n)", recipients: ["fl-1"], createdAt: now)
        }
        let call = #"""
            {"event_id":"\#(Scenarios.id("flood-call"))","app_id":"app8","kind":"call","created_at":\#(now),
             "sender":{"id":"fl-caller","name":"Dana"},"conversation":{"id":"\#(Scenarios.id("fl-call"))","type":"direct"},
             "recipients":["fl-1"],"call":{"action":"unanswered","session_id":"\#(Scenarios.id("fl-sess"))","type":"audio"}}
            """#
        try await stack.publish(messages + [call])
        func body(_ r: RecordedRequest) -> String {
            (aps(r)["alert"] as? [String: Any])?["body"] as? String ?? ""
        }
        let arrived = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            answered([token]).contains { $0.collapseID == "herald-summary" }
        }
        #expect(arrived, "no summary arrived\n\(failureContext())")
        #expect(await stack.awaitIdle(), "the pipeline did not go idle")
        let pushes = answered([token])
        let summaries = pushes.filter { $0.collapseID == "herald-summary" }
        #expect(pushes.count == 5, "3 messages, the call and one summary: \(pushes.map(body))")
        #expect(summaries.count == 1 && summaries.map(body) == ["3 new messages"], "\(summaries.map(body))")
        #expect(summaries.allSatisfy { aps($0)["sound"] == nil })
        #expect(pushes.filter { body($0).contains("hello") }.count == 3, "\(pushes.map(body))")
        // The held messages are explained; which three were held depends on the order the users' records arrived.
        var reasons: [String] = []
        let explained = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            reasons = []
            for n in 0..<6 {
                let r = try? await stack.heraldctl([
                    "explain", "--app", "app8", "--event", Scenarios.id("flood-\(n)"), "--user", "fl-1",
                ])
                if let line = r?.lines.first, line["decision"] as? String == "suppress" {
                    reasons.append(line["reason"] as? String ?? "")
                }
            }
            return reasons.count == 3
        }
        #expect(explained && reasons == ["flood_guard", "flood_guard", "flood_guard"], "\(reasons)")
    }

    @Test("an urgent call and a passive broadcast reach the same user with their own interruption levels")
    func urgentBesidePassive() async throws {
        let token = tok(711)
        let r = try await stack.heraldctl([
            "device", "register", "--app", "app7", "--user", "lv-1", "--token", token, "--bundle-id",
            "com.example.chat",
        ])
        #expect(r.status == 0, "device register: \(r.stderr)")
        let now = Self.now()
        let broadcast = #"""
            {"event_id":"\#(Scenarios.id("broadcast"))","app_id":"app7","kind":"message","created_at":\#(now),
             "sender":{"id":"lv-admin","name":"News"},"conversation":{"id":"\#(Scenarios.id("news"))","type":"group"},
             "recipients":["lv-1"],"message":{"id":"\#(Scenarios.id("bm"))","type":"admin","text":"Weekly digest"}}
            """#
        let call = #"""
            {"event_id":"\#(Scenarios.id("urgent-call"))","app_id":"app7","kind":"call","created_at":\#(now),
             "sender":{"id":"lv-caller","name":"Dana"},"conversation":{"id":"\#(Scenarios.id("lv-dm"))","type":"direct"},
             "recipients":["lv-1"],"call":{"action":"unanswered","session_id":"\#(Scenarios.id("sess"))","type":"audio"}}
            """#
        try await stack.publish([broadcast, call])
        let arrived = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            answered([token]).count >= 2
        }
        #expect(arrived, "the call and the broadcast did not both arrive\n\(failureContext())")
        let levels = Set(answered([token]).map { aps($0)["interruption-level"] as? String ?? "none" })
        #expect(levels == ["time-sensitive", "passive"], "levels \(levels)")
    }
}
