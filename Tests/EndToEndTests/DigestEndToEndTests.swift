// End to end, the digest when a snooze ends (docs/behaviour.md §6d): two snoozed users get five messages in two
// conversations, nothing while snoozed, then one digest each when the snooze ends; the one who read a conversation
// meanwhile gets a digest naming only the other. Runs in the shared "End to end" suite.
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

extension EndToEndTests {
    @Test("snoozed: 5 messages in 2 conversations, then exactly one digest each; a read conversation is left out")
    func digestWhenSnoozeEnds() async throws {
        let users = [(user: "dg-1", token: tok(741)), (user: "dg-2", token: tok(742))]
        // The snooze ends this long after the messages: time enough for them to be suppressed and counted and for
        // the read to be applied first (checked below, so a slower stack fails clearly instead of by chance).
        let start = Self.now()
        let end = start + 25_000
        for u in users {
            var r = try await stack.heraldctl([
                "device", "register", "--app", "app11", "--user", u.user, "--token", u.token, "--bundle-id",
                "com.example.chat",
            ])
            #expect(r.status == 0, "device register: \(r.stderr)")
            r = try await stack.heraldctl([
                "prefs", "set", "--app", "app11", "--user", u.user, "--snooze", "\(start - 60_000)-\(end)",
            ])
            #expect(r.status == 0, "prefs set: \(r.stderr)")
        }
        let hike = Scenarios.id("dg-hike")
        let work = Scenarios.id("dg-work")
        let plan = [(hike, "Hiking"), (hike, "Hiking"), (work, "Work"), (hike, "Hiking"), (work, "Work")]
        let events = plan.enumerated().map { n, c in
            Scenarios.message(
                Scenarios.id("dg-\(n)"), app: "app11", sender: "dg-s", conversation: c.0, name: c.1,
                text: "secret \(n)", recipients: users.map(\.user), createdAt: start)
        }
        try await stack.publish(events)
        // Every message is suppressed (and so counted: the count comes before the explain trail's entry).
        let suppressed = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            for n in 0..<plan.count {
                for u in users {
                    let r = try? await stack.heraldctl([
                        "explain", "--app", "app11", "--event", Scenarios.id("dg-\(n)"), "--user", u.user,
                    ])
                    guard let line = r?.lines.first, line["reason"] as? String == "snoozed" else { return false }
                }
            }
            return true
        }
        #expect(suppressed, "the messages were not all suppressed as snoozed\n\(failureContext())")
        // dg-2 reads Hiking; the read is applied once the unread counts show only Work's two messages.
        let read = try await stack.api(
            "POST", "/v1/apps/app11/users/dg-2/read", body: #"{"conversation": "\#(hike)"}"#)
        #expect(read.status == 202, "\(read.body)")
        try await waitUntil("dg-2's read was applied") {
            let c = try await stack.api("GET", "/v1/apps/app11/users/dg-2/counts").json
            return (c?["unread"] as? [String: Any])?["total"] as? Int == 2
        }
        try #require(Self.now() < end - 1_000, "the stack took longer than the snooze; the digest may have gone out")
        #expect(
            answered(Set(users.map(\.token))).allSatisfy { $0.pushType == "background" }, "no alert while snoozed")

        func body(_ r: RecordedRequest) -> String {
            (aps(r)["alert"] as? [String: Any])?["body"] as? String ?? ""
        }
        let arrived = await eventually(timeout: .seconds(90), interval: .milliseconds(200)) {
            let got = answered(Set(users.map(\.token)))
            return users.allSatisfy { u in got.contains { $0.token == u.token && $0.pushType == "alert" } }
        }
        #expect(arrived, "no digest arrived\n\(failureContext())")
        #expect(await stack.awaitIdle(), "the pipeline did not go idle")
        // Alerts only: dg-2's read also cleared its device (a background push, docs/behaviour.md §6c).
        let one = answered([users[0].token]).filter { $0.pushType == "alert" }
        let two = answered([users[1].token]).filter { $0.pushType == "alert" }
        #expect(one.count == 1 && two.count == 1, "one alert each: \(one.map(body)) \(two.map(body))")
        #expect(answered([users[1].token]).filter { $0.pushType != "alert" }.allSatisfy { $0.pushType == "background" })
        #expect(
            one.map(body) == ["5 new messages in 2 conversations while notifications were snoozed\nHiking, Work"],
            "\(one.map(body))")
        #expect(two.map(body) == ["2 new messages in Work while notifications were snoozed"], "\(two.map(body))")
        #expect((one + two).allSatisfy { aps($0)["sound"] == nil && !body($0).contains("secret") })
        #expect(Self.now() >= end, "not before the snooze ended")
        // The trail explains the digest, and suppress counts it.
        let digestID = Digest.eventID(user: "dg-1", end: end)
        var line: [String: Any] = [:]
        let explained = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let r = try? await stack.heraldctl(["explain", "--app", "app11", "--event", digestID, "--user", "dg-1"])
            line = r?.lines.first { $0["stage"] as? String == "suppress" } ?? [:]
            return line["reason"] as? String == "digest"
        }
        #expect(explained && line["decision"] as? String == "deliver", "explain digest: \(line)")
        let metrics = stack.stagePorts["suppress"].flatMap { httpBody(port: $0, path: "/metrics") } ?? ""
        let digests = metrics.split(separator: "\n").filter { $0.hasPrefix("herald_digests_total{") }
        #expect(digests.contains { $0.contains("outcome=\"sent\"") }, "herald_digests_total: \(digests)")
        #expect(digests.contains { $0.contains("outcome=\"counted\"") }, "herald_digests_total: \(digests)")
    }

    @Test("in Do Not Disturb (Asia/Kolkata): 5 messages in 2 conversations, one digest when it ends on the local clock")
    func digestWhenDNDEnds() async throws {
        let token = tok(743)
        var r = try await stack.heraldctl([
            "device", "register", "--app", "app11", "--user", "dg-3", "--token", token, "--bundle-id",
            "com.example.chat",
        ])
        #expect(r.status == 0, "device register: \(r.stderr)")
        // The window: this minute to the next on the user's clock (UTC+05:30). Start early in a minute, so the
        // messages are counted well before it ends (checked below).
        _ = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) { Self.now() % 60_000 < 15_000 }
        let start = Self.now()
        let local = ((start + 19_800_000) / 60_000) % 1440
        func clock(_ minute: Int64) -> String {
            let m = minute % 1440
            return (m / 60 < 10 ? "0" : "") + "\(m / 60):" + (m % 60 < 10 ? "0" : "") + "\(m % 60)"
        }
        let end = (start / 60_000 + 1) * 60_000
        r = try await stack.heraldctl([
            "prefs", "set", "--app", "app11", "--user", "dg-3", "--dnd", "\(clock(local))-\(clock(local + 1))",
            "--timezone", "Asia/Kolkata",
        ])
        #expect(r.status == 0, "prefs set: \(r.stderr)")
        let hike = Scenarios.id("dd-hike")
        let work = Scenarios.id("dd-work")
        let plan = [(hike, "Hiking"), (work, "Work"), (hike, "Hiking"), (work, "Work"), (hike, "Hiking")]
        let events = plan.enumerated().map { n, c in
            Scenarios.message(
                Scenarios.id("dd-\(n)"), app: "app11", sender: "dd-s", conversation: c.0, name: c.1,
                text: "secret \(n)", recipients: ["dg-3"], createdAt: start)
        }
        try await stack.publish(events)
        let suppressed = await eventually(timeout: .seconds(40), interval: .milliseconds(200)) {
            for n in 0..<plan.count {
                let r = try? await stack.heraldctl([
                    "explain", "--app", "app11", "--event", Scenarios.id("dd-\(n)"), "--user", "dg-3",
                ])
                guard r?.lines.first?["reason"] as? String == "dnd" else { return false }
            }
            return true
        }
        #expect(suppressed, "the messages were not all suppressed as dnd\n\(failureContext())")
        try #require(Self.now() < end - 1_000, "the stack took longer than the window; the digest may have gone out")
        #expect(answered([token]).isEmpty, "nothing is pushed during Do Not Disturb")
        func body(_ r: RecordedRequest) -> String {
            (aps(r)["alert"] as? [String: Any])?["body"] as? String ?? ""
        }
        let arrived = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            !answered([token]).isEmpty
        }
        #expect(arrived, "no digest arrived\n\(failureContext())")
        #expect(Self.now() >= end, "not before Do Not Disturb ended")
        #expect(await stack.awaitIdle(), "the pipeline did not go idle")
        let pushes = answered([token])
        #expect(
            pushes.map(body) == ["5 new messages in 2 conversations while Do Not Disturb was on\nHiking, Work"],
            "\(pushes.map(body))")
        #expect(pushes.allSatisfy { $0.pushType == "alert" && aps($0)["sound"] == nil })
    }
}
