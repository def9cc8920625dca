// Priority lanes on the running stack: a call published behind a backlog of group messages overtakes it, and the
// backlog still arrives in full, each notification once.

import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

extension EndToEndTests {
    /// (token/apns-id) pairs `simulate` predicts for `events` against `fixture`.
    func predictedPairs(_ events: [String], fixture: String) throws -> Set<String> {
        let state = try StageCodec.decode(StateFixture.self, from: Array(fixture.utf8))
        var pairs = Set<String>()
        for e in events {
            for line in try Simulator.simulate(
                eventBytes: Array(e.utf8), fixture: state, apps: stack.apps, at: nil, now: Date())
            {
                for n in line.notifications { pairs.insert(n.token + "/" + n.apnsID.lowercased()) }
            }
        }
        return pairs
    }

    @Test(
        "a call published behind a backlog of group messages is delivered before the backlog drains; the backlog arrives in full, once"
    )
    func callOvertakesBacklog() async throws {
        try await loadFixtures()
        let stack = self.stack
        // Warm-up: one direct message through the priority lane, so every stage's priority consumer has joined
        // its group before the measurement (the lane's first record otherwise waits for those joins).
        let warmEvent = Scenarios.message(
            Scenarios.id("lane-warm"), conversation: "dm-warm", type: "direct",
            recipients: ["r10"], createdAt: Self.now())
        let warm = try predictedPairs([warmEvent], fixture: Scenarios.app1Fixture)
        #expect(warm.count == 1)
        try await stack.publish([warmEvent])
        let warmed = await eventually(timeout: .seconds(60), interval: .milliseconds(20)) {
            let counts = stack.deliveredCounts()
            return warm.allSatisfy { counts[$0] != nil }
        }
        #expect(warmed, "the warm-up direct message was not delivered\n\(failureContext())")

        let now = Self.now()
        // 10,000 group messages to k1's four members: 40,000 notifications on the bulk lane (large enough that the
        // backlog still drains for several seconds after the call is published, however fast the build is).
        let backlogEvents = (0..<10_000).map {
            Scenarios.message(
                Scenarios.id("lane-backlog-\($0)"), conversation: "k1", text: "backlog \($0)", createdAt: now)
        }
        let backlog = try predictedPairs(backlogEvents, fixture: Scenarios.app1Fixture)
        #expect(backlog.count == 40_000)
        try await stack.publish(backlogEvents)
        let started = await eventually(timeout: .seconds(60), interval: .milliseconds(20)) {
            let counts = stack.deliveredCounts()
            return backlog.contains { counts[$0] != nil }
        }
        #expect(started, "nothing of the backlog was delivered\n\(failureContext())")

        // The call is made when it is published: a ring lives `call_expiration_seconds` from its created_at, and on a
        // loaded host publishing the backlog has taken longer than that (the call was then rightly dropped as
        // expired at send).
        let callCreatedAt = Self.now()
        let callEvent = Scenarios.call(Scenarios.id("lane-call"), createdAt: callCreatedAt)
        let call = try predictedPairs([callEvent], fixture: Scenarios.app3Fixture)
        #expect(!call.isEmpty)
        let published = ContinuousClock.now
        try await stack.publish([callEvent])
        let arrived = await eventually(timeout: .seconds(60), interval: .milliseconds(5)) {
            let counts = stack.deliveredCounts()
            return call.allSatisfy { counts[$0] != nil }
        }
        let callLatency = ContinuousClock.now - published
        #expect(arrived, "the call was not delivered\n\(failureContext())")
        // Where the call's time went: each stage's explain entry, in ms after the call's created_at.
        let trail = try await stack.heraldctl(["explain", "--app", "app3", "--event", Scenarios.id("lane-call")])
        let steps = trail.stdout.split(separator: "\n").compactMap { line -> String? in
            guard let json = try? JSONValue.parse(Array(line.utf8)), let stage = json["stage"]?.stringValue,
                let at = json["at"]?.int64Value
            else { return nil }
            return "\(stage) +\(at - callCreatedAt) ms"
        }
        print("lanes e2e: the call's trail: \(steps.joined(separator: ", "))")
        // app3's trail is kept in full (`explain.full_trail`): send's first-attempt deliveries, routine entries the
        // compact trail leaves out, are made and written for it (within the explain writer's interval).
        let sendDelivered = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            guard
                let out = try? await stack.heraldctl([
                    "explain", "--app", "app3", "--event", Scenarios.id("lane-call"),
                ])
            else { return false }
            return out.stdout.split(separator: "\n").contains { line in
                guard let json = try? JSONValue.parse(Array(line.utf8)) else { return false }
                return json["stage"]?.stringValue == "send" && json["decision"]?.stringValue == "delivered"
            }
        }
        #expect(sendDelivered, "no send/delivered entry in app3's full trail\n\(failureContext())")

        let counts = await awaitDeliveries(backlog.union(call).union(warm), timeout: .seconds(240))
        expectExactlyOnce(backlog.union(call).union(warm), counts, "backlog and call")
        // The call's requests are in the stand-in's record before the backlog's last one. Read once everything
        // arrived: counting the backlog when the call is noticed would measure this test's polling, since reading
        // the record file takes longer as it grows.
        let order = stack.recorded().filter { $0.status == 200 }.map { $0.token + "/" + $0.apnsID.lowercased() }
        let lastCall = order.lastIndex { call.contains($0) } ?? .max
        let lastBacklog = order.lastIndex { backlog.contains($0) } ?? -1
        let backlogBeforeCall =
            lastCall == .max ? backlog.count : order[..<lastCall].filter { backlog.contains($0) }.count
        #expect(
            lastCall < lastBacklog,
            "the call's last request (\(lastCall)) came after the backlog's last (\(lastBacklog))")
        print(
            "lanes e2e: call noticed \(callLatency) after publishing; the stand-in answered it after \(backlogBeforeCall) of \(backlog.count) backlog notifications"
        )
    }
}
