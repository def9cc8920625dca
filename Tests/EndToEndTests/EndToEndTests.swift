// End-to-end: herald-dev-broker (librdkafka's mock cluster, three brokers), real Redis, herald-mock-apns and the six stages as separate processes.
// One stack for the whole suite (`.serialized`); each test uses its own users, conversations and event ids.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldTestSupport
import Testing

/// What the stand-in must have received: one notification the simulator predicted.
struct Expected: Hashable {
    var scenario: String
    var request: PushRequest
    var pair: String { request.token + "/" + request.apnsID.lowercased() }
}

func canonicalJSON(_ bytes: [UInt8]) -> Data? {
    guard let o = try? JSONSerialization.jsonObject(with: Data(bytes)) else { return nil }
    return try? JSONSerialization.data(withJSONObject: o, options: [.sortedKeys])
}

@Suite("End to end", .serialized, .e2eStack, .timeLimit(.minutes(10)))
struct EndToEndTests {
    let stack: E2EStack
    /// (token/apns-id) -> (event id, user) of the last `publishKillBatch`.
    let owners = Guarded<[String: (event: String, user: String)]>([:])
    init() throws { stack = try E2EStack.shared() }

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    /// Loads the three apps' fixtures with `heraldctl state load` (once per suite run; idempotent).
    func loadFixtures() async throws {
        for app in ["app1", "app2", "app3"] {
            let path = try stack.write("state-\(app).json", Scenarios.fixture(app))
            let r = try await stack.heraldctl(["state", "load", path, "--app", app])
            #expect(r.status == 0, "heraldctl state load \(app): \(r.stderr)")
        }
    }

    /// Waits until every expected (token, apns-id) pair was answered 200, and then until the whole pipeline is
    /// idle (every stage: lag 0 and nothing in flight, for longer than the lag refresh), so a duplicate still on
    /// its way (a retry waiting for its time, a replay after a rebalance) has arrived before the counts are read.
    /// Returns the 200 counts.
    func awaitDeliveries(_ pairs: Set<String>, timeout: Duration) async -> [String: Int] {
        _ = await eventually(timeout: timeout, interval: .milliseconds(200)) {
            let counts = stack.deliveredCounts()
            return pairs.allSatisfy { counts[$0] != nil }
        }
        let idle = await stack.awaitIdle()
        #expect(idle, "the pipeline did not become idle (lag 0, nothing in flight)\n\(failureContext())")
        return stack.deliveredCounts()
    }

    func failureContext() -> String {
        "not idle: \(stack.idleBlockers())\n"
            + E2EStack.stages.map { "--- \($0):\n" + (stack.stageProcesses[$0]?.logTail(6) ?? "") }.joined(
                separator: "\n")
    }

    // MARK: Seed scenarios

    @Test("each seed scenario arrives exactly as `simulate` predicts; suppressions match the explain trail")
    func seedScenariosMatchSimulate() async throws {
        try await loadFixtures()
        let now = Self.now()
        let seeds = Scenarios.seeds(now: now)
        var expected: [Expected] = []
        var suppressed: [(scenario: String, app: String, event: String, user: String, reason: String)] = []
        var dropped: [(scenario: String, app: String, event: String, reason: String)] = []
        for seed in seeds {
            let fixture = try StageCodec.decode(StateFixture.self, from: Array(Scenarios.fixture(seed.app).utf8))
            let lines = try Simulator.simulate(
                eventBytes: Array(seed.event.utf8), fixture: fixture, apps: stack.apps,
                at: nil, now: Date())
            let event = try ChatEvent.decode(Array(seed.event.utf8))
            let eventID = event.eventID
            #expect(!lines.isEmpty, "\(seed.name): simulate predicted nothing")
            for line in lines {
                if line.decision == .deliver {
                    expected += line.notifications.map { Expected(scenario: seed.name, request: $0) }
                } else if line.decision == .suppress, let user = line.user, let reason = line.reason,
                    // The sender of a message to the conversation's members is routine: the compact trail keeps
                    // it only as their latest decision (ExplainEntry.isRoutine); named in the recipients, it is kept.
                    !(reason == "sender" && event.recipients == nil)
                {
                    suppressed.append((seed.name, seed.app, eventID, user, reason))
                } else if line.decision == .drop, let reason = line.reason {
                    dropped.append((seed.name, seed.app, eventID, reason))
                }
            }
        }
        // The scenarios cover what they claim to.
        let reasons = Set(suppressed.map(\.reason))
        for reason in [
            "sender", "online", "no_devices", "not_mentioned", "conversation_off", "muted", "dnd", "snoozed", "ignored",
        ] {
            #expect(reasons.contains(reason), "no scenario produces the suppression \(reason)")
        }
        #expect(expected.contains { $0.request.pushType == .voip }, "no VoIP notification predicted")
        #expect(
            expected.contains {
                $0.request.pushType == .background && $0.request.priority == 5 && $0.scenario.hasPrefix("ended call")
            },
            "no background call update predicted")
        #expect(
            expected.contains { $0.request.pushType == .background && $0.scenario.hasPrefix("deleted message") },
            "no background update for a deleted message predicted")
        #expect(
            suppressed.contains { $0.scenario.hasPrefix("lenient input") && $0.reason == "ignored" },
            "em_ignore_notification: 1 was not read as true")
        #expect(
            !expected.contains { $0.request.pushType == .voip && !$0.scenario.hasPrefix("call to VoIP") },
            "a call action other than initiated went to a VoIP token")
        #expect(
            expected.count >= 12 && suppressed.count >= 9,
            "the scenarios predict only \(expected.count) notifications and \(suppressed.count) suppressions")
        stack.log(
            "seed scenarios: \(expected.count) notifications and \(suppressed.count) suppressions predicted by simulate"
        )

        try await stack.publish(seeds.map(\.event))
        let pairs = Set(expected.map(\.pair))
        let counts = await awaitDeliveries(pairs, timeout: .seconds(60))
        let recorded = stack.recorded()
        let expectedTokens = Set(expected.map(\.request.token))

        for e in expected {
            let got = recorded.filter {
                $0.token == e.request.token && $0.apnsID == e.request.apnsID.lowercased() && $0.status == 200
            }
            #expect(
                counts[e.pair] == 1,
                "\(e.scenario): token \(e.request.token.suffix(6)) delivered \(counts[e.pair] ?? 0) times, expected once\n\(failureContext())"
            )
            guard let r = got.first else { continue }
            #expect(r.topic == e.request.topic, "\(e.scenario): topic")
            #expect(r.pushType == e.request.pushType.rawValue, "\(e.scenario): push type")
            #expect(r.priority == e.request.priority, "\(e.scenario): priority")
            #expect(r.collapseID == e.request.collapseID, "\(e.scenario): collapse id")
            let want = canonicalJSON(e.request.payload)
            #expect(
                r.payload != nil && r.payload == want,
                "\(e.scenario): payload \(String(decoding: r.payload ?? Data(), as: UTF8.self)) != \(String(decoding: want ?? Data(), as: UTF8.self))"
            )
        }
        // Nothing the simulator did not predict reached one of the scenario's devices (suppressed users'
        // tokens included).
        let scenarioTokens: Set<String> = [tok(12), tok(16), tok(17), tok(117), tok(18), tok(19), tok(20), tok(31)]
        let unexpected = recorded.filter { r in
            (scenarioTokens.contains(r.token) || expectedTokens.contains(r.token))
                && !pairs.contains(r.token + "/" + r.apnsID)
        }
        // r6 and r18 get exactly one push each (the channel mention and the forced message).
        #expect(
            unexpected.isEmpty,
            "pushes the simulator did not predict: \(unexpected.map { "\($0.token.suffix(6)) \($0.apnsID)" })")

        // Every suppression is in the explain trail with the simulator's reason.
        for s in suppressed {
            var found: [String: Any] = [:]
            let ok = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
                let r = try? await stack.heraldctl(["explain", "--app", s.app, "--event", s.event, "--user", s.user])
                found = r?.lines.first ?? [:]
                return found["decision"] as? String == "suppress"
            }
            #expect(
                ok,
                "\(s.scenario): no suppression in the explain trail for \(s.user): \(found)\n\(stack.explainDiagnostics())"
            )
            #expect(
                found["reason"] as? String == s.reason,
                "\(s.scenario): \(s.user) explained as \(found["reason"] ?? "nil"), simulate says \(s.reason)")
        }
        // An event dropped at ingest has an event-level trail entry with the simulator's reason.
        #expect(!dropped.isEmpty, "no scenario is dropped at ingest")
        for d in dropped {
            var lines: [[String: Any]] = []
            let ok = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
                lines = (try? await stack.heraldctl(["explain", "--app", d.app, "--event", d.event]))?.lines ?? []
                return lines.contains { $0["decision"] as? String == "drop" }
            }
            #expect(
                ok && lines.contains { $0["decision"] as? String == "drop" && $0["reason"] as? String == d.reason },
                "\(d.scenario): explain shows \(lines), simulate says drop/\(d.reason)")
        }
        // A delivered user's trail shows the per-device outcome.
        // (The stages write their entries a moment after deciding: explain.write_interval_ms.)
        if let first = expected.first(where: { $0.scenario.hasPrefix("group chat") }) {
            var answer = ""
            var line: [String: Any] = [:]
            var devices: [[String: Any]] = []
            let explained = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
                let r = try? await stack.heraldctl([
                    "explain", "--app", "app1", "--event", Scenarios.id("group"), "--user", "r1",
                ])
                answer = "\(r?.stdout ?? "") \(r?.stderr ?? "")"
                line = r?.lines.first ?? [:]
                devices = line["devices"] as? [[String: Any]] ?? []
                return devices.contains { $0["decision"] as? String == "delivered" }
            }
            #expect(explained && line["decision"] as? String == "deliver", "explain r1: \(answer)")
            #expect(
                devices.contains {
                    $0["decision"] as? String == "delivered"
                        && ($0["token"] as? String)?.hasPrefix(String(first.request.token.prefix(8))) == true
                },
                "explain r1 devices: \(devices)")
        }
    }

    // MARK: Malformed records

    @Test("malformed records land in herald.dlq with stage and reason; the pipeline keeps delivering")
    func malformedRecordsGoToDLQ() async throws {
        try await loadFixtures()
        let before = try await stack.dlqEntries().count
        let garbage: [UInt8] = Array("{not json".utf8)
        try await stack.produce([
            ProducerRecord(topic: "chat.events", key: "bad1", value: garbage),
            ProducerRecord(
                topic: "chat.events", key: "bad2",
                value: Array(#"{"event_id": "x", "app_id": "app1", "kind": "message"}"#.utf8)),
            ProducerRecord(topic: "chat.events", key: "bad3", value: [0xFF, 0xFE, 0x7B]),
            ProducerRecord(topic: "chat.events", key: "bad4", value: nil),
            ProducerRecord(topic: "herald.ingested", key: "bad5", value: garbage),
            ProducerRecord(topic: "herald.resolved", key: "bad6", value: garbage),
            ProducerRecord(topic: "herald.deliverable", key: "bad7", value: garbage),
            ProducerRecord(topic: "herald.outbound", key: "bad8", value: garbage),
            ProducerRecord(topic: "herald.registry", key: "bad9", value: garbage),
            // An app the pipeline file does not list: dead-lettered `unknown_app`, never served with defaults.
            ProducerRecord(
                topic: "chat.events", key: "bad10",
                value: Array(
                    Scenarios.message(
                        Scenarios.id("foreign-app"), app: "no-such-app", conversation: "dx1", type: "direct",
                        recipients: ["x1"],
                        createdAt: Self.now()
                    ).utf8)),
            ProducerRecord(
                topic: "herald.registry", key: "bad11",
                value: Array(
                    #"{"op": "set_members", "app_id": "no-such-app", "conversation": "c1", "members": ["u1"]}"#.utf8)),
        ])
        // A good event after the bad ones still arrives.
        let eventID = Scenarios.id("after-dlq")
        try await stack.publish([
            Scenarios.message(eventID, conversation: "dx1", type: "direct", recipients: ["x1"], createdAt: Self.now())
        ])
        let fixture = try StageCodec.decode(StateFixture.self, from: Array(Scenarios.app1Fixture.utf8))
        let predicted = try Simulator.simulate(
            eventBytes: Array(
                Scenarios.message(
                    eventID, conversation: "dx1", type: "direct", recipients: ["x1"], createdAt: 1_732_000_000_000
                ).utf8),
            fixture: fixture, apps: stack.apps, at: nil, now: Date())
        let pairs = Set(predicted.flatMap(\.notifications).map { $0.token + "/" + $0.apnsID.lowercased() })
        #expect(pairs.count == 1)
        let counts = await awaitDeliveries(pairs, timeout: .seconds(120))
        for p in pairs {
            #expect(
                counts[p] == 1, "the good event after the bad ones: \(counts[p] ?? 0) deliveries\n\(failureContext())")
        }

        var entries: [(record: ConsumerRecord, dlq: DLQRecord)] = []
        let stagesWanted: Set<String> = ["ingest", "resolve", "suppress", "render", "send", "registry"]
        _ = await eventually(timeout: .seconds(120), interval: .milliseconds(300)) {
            entries = Array(((try? await stack.dlqEntries()) ?? []).dropFirst(before))
            return stagesWanted.isSubset(of: Set(entries.map(\.dlq.stage)))
                && entries.filter { $0.dlq.stage == "ingest" }.count >= 4
                && entries.filter { $0.dlq.reason == "unknown_app" }.count >= 2
        }
        #expect(
            entries.contains {
                $0.dlq.stage == "ingest" && $0.dlq.reason == "unknown_app" && $0.dlq.detail.contains("no-such-app")
            },
            "ingest DLQ entries: \(entries.filter { $0.dlq.stage == "ingest" }.map { "\($0.dlq.reason): \($0.dlq.detail)" })"
        )
        #expect(
            entries.contains { $0.dlq.stage == "registry" && $0.dlq.reason == "unknown_app" },
            "registry DLQ entries: \(entries.filter { $0.dlq.stage == "registry" }.map { "\($0.dlq.reason): \($0.dlq.detail)" })"
        )
        for stage in stagesWanted {
            let mine = entries.filter { $0.dlq.stage == stage }
            #expect(
                !mine.isEmpty, "no DLQ entry from \(stage); got \(entries.map { "\($0.dlq.stage)/\($0.dlq.reason)" })")
            for e in mine {
                #expect(!e.dlq.reason.isEmpty && !e.dlq.detail.isEmpty, "\(stage) DLQ entry without reason/detail")
                #expect(e.dlq.sourceTopic != nil, "\(stage) DLQ entry without source topic")
                #expect(e.dlq.time > 0)
            }
        }
        let ingest = entries.filter { $0.dlq.stage == "ingest" }
        #expect(
            ingest.contains { $0.dlq.originalBytes == garbage && $0.dlq.reason == "invalid" },
            "ingest DLQ entries: \(ingest.map { "\($0.dlq.reason): \($0.dlq.detail)" })")
        #expect(
            ingest.contains {
                $0.dlq.detail.contains("conversation") || $0.dlq.detail.contains("sender")
                    || $0.dlq.detail.contains("created_at")
            },
            "the missing-field event's detail names the field: \(ingest.map(\.dlq.detail))")

        // heraldctl dlq list shows them; replay puts the resolve one back on herald.ingested, where it fails again.
        let list = try await stack.heraldctl(["dlq", "list", "--stage", "resolve"])
        #expect(list.status == 0, "dlq list: \(list.stderr)")
        #expect(
            list.lines.contains {
                $0["stage"] as? String == "resolve" && $0["source_topic"] as? String == "herald.ingested"
                    && $0["reason"] != nil
            },
            "dlq list output: \(list.stdout)")
        let limited = try await stack.heraldctl(["dlq", "list", "--limit", "1"])
        #expect(limited.lines.count == 1, "dlq list --limit 1 printed \(limited.lines.count) lines")
        let resolveBefore = entries.filter { $0.dlq.stage == "resolve" }.count
        let replay = try await stack.heraldctl(["dlq", "replay", "--stage", "resolve"])
        #expect(replay.status == 0, "dlq replay: \(replay.stderr)")
        #expect(
            replay.lines.count == resolveBefore
                && replay.lines.allSatisfy { $0["topic"] as? String == "herald.ingested" },
            "dlq replay output: \(replay.stdout)")
        let replayedBack = await eventually(timeout: .seconds(60), interval: .milliseconds(300)) {
            let all = (try? await stack.dlqEntries()) ?? []
            return all.dropFirst(before).filter { $0.dlq.stage == "resolve" }.count >= resolveBefore * 2
        }
        #expect(replayedBack, "the replayed record did not come back to the DLQ from resolve")
        // Every stage is still running.
        for stage in E2EStack.stages {
            #expect(
                stack.stageProcesses[stage]?.isRunning == true,
                "herald-\(stage) stopped:\n\(stack.stageProcesses[stage]?.logTail() ?? "")")
        }
    }

    // MARK: Crashes and restarts

    /// Publishes `count` events to conversation k1 (4 recipients, one device each) in small chunks, 80 ms
    /// apart, and calls `during` as soon as the first of them reached the stand-in, while the rest are still
    /// flowing through the stages. Returns the predicted (token, apns-id) pairs.
    func publishKillBatch(
        prefix: String, count: Int, during: @escaping @Sendable () async throws -> Void
    ) async throws -> Set<String> {
        var lastBatchOwners: [String: (event: String, user: String)] = [:]
        defer { owners.withLock { $0 = lastBatchOwners } }
        let fixture = try StageCodec.decode(StateFixture.self, from: Array(Scenarios.app1Fixture.utf8))
        var events: [String] = []
        var pairs = Set<String>()
        let now = Self.now()
        for i in 0..<count {
            let e = Scenarios.message(
                Scenarios.id("\(prefix)-\(i)"), conversation: "k1", text: "message \(i)", createdAt: now)
            events.append(e)
            for line in try Simulator.simulate(
                eventBytes: Array(e.utf8), fixture: fixture, apps: stack.apps, at: nil, now: Date())
            {
                for n in line.notifications {
                    pairs.insert(n.token + "/" + n.apnsID.lowercased())
                    if let user = line.user {
                        lastBatchOwners[n.token + "/" + n.apnsID.lowercased()] = (Scenarios.id("\(prefix)-\(i)"), user)
                    }
                }
            }
        }
        let stack = self.stack
        let chunks = stride(from: 0, to: events.count, by: 4).map { Array(events[$0..<min(events.count, $0 + 4)]) }
        let publishing = Task {
            for chunk in chunks {
                try await stack.publish(chunk)
                try await Task.sleep(for: .milliseconds(80))
            }
        }
        let started = await eventually(timeout: .seconds(120), interval: .milliseconds(10)) {
            let counts = stack.deliveredCounts()
            return pairs.contains { counts[$0] != nil }
        }
        #expect(started, "\(prefix): nothing was delivered before the fault\n\(failureContext())")
        try await during()
        try await publishing.value
        return pairs
    }

    func expectExactlyOnce(_ pairs: Set<String>, _ counts: [String: Int], _ what: String) {
        let missing = pairs.filter { counts[$0] == nil }
        let twice = pairs.filter { (counts[$0] ?? 0) > 1 }
        #expect(
            missing.isEmpty,
            "\(what): \(missing.count) of \(pairs.count) notifications never delivered\n\(failureContext())")
        #expect(twice.isEmpty, "\(what): \(twice.count) notifications delivered more than once: \(twice.prefix(5))")
    }

    @Test("resolve killed with SIGKILL mid-run and restarted: nothing lost, nothing delivered twice")
    func sigkillResolve() async throws {
        try await loadFixtures()
        let stack = self.stack
        let pairs = try await publishKillBatch(prefix: "kill-resolve", count: 40) {
            await stack.killStage("resolve")
            try await Task.sleep(for: .milliseconds(300))
            try stack.restartStage("resolve")
        }
        #expect(pairs.count == 160)
        let counts = await awaitDeliveries(pairs, timeout: .seconds(60))
        expectExactlyOnce(pairs, counts, "SIGKILL resolve")
    }

    /// send is the one stage where a second delivery is possible: killed after APNs answered 200 and before
    /// the idempotency record was written (docs/pipeline.md, "the crash window"). Nothing may be lost, and a
    /// notification may be delivered twice only if its first 200 came within that window, just before the kill.
    @Test("send killed with SIGKILL mid-run and restarted: nothing lost, duplicates only from the crash window")
    func sigkillSend() async throws {
        try await loadFixtures()
        let killedAtBox = Guarded<Int64>(0)
        let stack = self.stack
        let pairs = try await publishKillBatch(prefix: "kill-send", count: 40) {
            killedAtBox.withLock { $0 = Self.now() }
            await stack.killStage("send")
            try await Task.sleep(for: .milliseconds(300))
            try stack.restartStage("send")
        }
        let killedAt = killedAtBox.withLock { $0 }
        #expect(pairs.count == 160)
        let counts = await awaitDeliveries(pairs, timeout: .seconds(60))
        let beforeKill = stack.recorded().filter {
            $0.status == 200 && $0.at <= killedAt && pairs.contains($0.token + "/" + $0.apnsID)
        }.count
        stack.log("SIGKILL send: \(beforeKill) of \(pairs.count) delivered before the kill")
        let missing = pairs.filter { counts[$0] == nil }
        #expect(
            missing.isEmpty, "SIGKILL send: \(missing.count) of \(pairs.count) never delivered\n\(failureContext())")
        let twice = pairs.filter { (counts[$0] ?? 0) > 1 }
        let firstAnswer = Dictionary(
            stack.recorded().filter { $0.status == 200 }.map { ($0.token + "/" + $0.apnsID, $0.at) },
            uniquingKeysWith: min)
        let outsideWindow = twice.filter { p in
            guard let at = firstAnswer[p] else { return true }
            return at < killedAt - 1000 || at > killedAt + 100
        }
        #expect(
            outsideWindow.isEmpty,
            "delivered twice although the first delivery was not in the crash window: \(outsideWindow.prefix(5))")
        if !twice.isEmpty {
            stack.log("SIGKILL send: \(twice.count) notification(s) delivered twice, all from the crash window")
        }
    }

    /// docs/behaviour.md §11: on SIGTERM a stage stops pulling, finishes or hands back what is in flight, commits and exits 0;
    /// with a graceful stop there is no crash window, so nothing may arrive twice.
    @Test("send stopped with SIGTERM mid-run exits 0; after a restart nothing is lost or delivered twice")
    func sigtermSend() async throws {
        try await loadFixtures()
        let stack = self.stack
        let status = Guarded<Int32?>(nil)
        let pairs = try await publishKillBatch(prefix: "term-send", count: 24) {
            status.withLock { $0 = -1 }
            let s = await stack.stopStage("send")
            status.withLock { $0 = s }
            try stack.restartStage("send")
        }
        #expect(
            status.withLock { $0 } == 0,
            "herald-send exit status after SIGTERM: \(String(describing: status.withLock { $0 }))")
        let counts = await awaitDeliveries(pairs, timeout: .seconds(60))
        expectExactlyOnce(pairs, counts, "SIGTERM send")
    }

    @Test("a second resolve process joins the group, then leaves mid-run: nothing lost, nothing twice")
    func scaleOutResolve() async throws {
        try await loadFixtures()
        let stack = self.stack
        let name = try stack.startExtraStage("resolve", instance: 2)
        // The group rebalances onto both members (the new one logs the partitions it was given).
        var log = ""
        let joined = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            log = (try? String(contentsOfFile: stack.runDir + "/\(name).log", encoding: .utf8)) ?? ""
            return log.contains("partitions assigned") && log.contains("herald.ingested[")
        }
        #expect(joined, "the second resolve process never got partitions:\n\(log.suffix(1500))")
        let both = try await publishKillBatch(prefix: "scale", count: 16) {}
        expectExactlyOnce(both, await awaitDeliveries(both, timeout: .seconds(60)), "two resolve processes")
        // It leaves (SIGTERM) while events flow; the first one takes its partitions over.
        let status = Guarded<Int32?>(-1)
        let leaving = try await publishKillBatch(prefix: "scale-leave", count: 24) {
            let s = await stack.stopStage(name)
            status.withLock { $0 = s }
        }
        #expect(status.withLock { $0 } == 0, "the second resolve process did not exit 0 on SIGTERM")
        expectExactlyOnce(
            leaving, await awaitDeliveries(leaving, timeout: .seconds(60)), "second resolve process leaving")
    }

    @Test("Redis restarted mid-run loses nothing")
    func redisRestart() async throws {
        try await loadFixtures()
        let stack = self.stack
        let pairs = try await publishKillBatch(prefix: "redis", count: 24) {
            try await stack.restartRedis(down: .seconds(2))
        }
        let counts = await awaitDeliveries(pairs, timeout: .seconds(60))
        expectExactlyOnce(pairs, counts, "Redis restart")
        // The state survived the restart (append-only file). The test's own connection notices the restart on
        // its first command and reconnects on the next.
        var k1: UserState?
        _ = await eventually(timeout: .seconds(5)) {
            k1 = try? await stack.store.loadUser(app: "app1", user: "k1", now: Self.now())
            return k1 != nil
        }
        #expect(k1?.devices.map(\.token) == [tok(201)])
    }

    @Test("APNs 429s, 500s, 503s and GOAWAYs are retried until delivered")
    func apnsFaultsAreRetried() async throws {
        try await loadFixtures()
        try await stack.startMock(extra: [
            "--rate-503", "0.2", "--rate-429", "0.1", "--rate-500", "0.1", "--goaway-every", "7", "--seed", "7",
        ])
        let generation = stack.mockGeneration
        let pairs = try await publishKillBatch(prefix: "faults", count: 20) {}
        let counts = await awaitDeliveries(pairs, timeout: .seconds(90))
        expectExactlyOnce(pairs, counts, "429 / 500 / 503 / GOAWAY")
        let faulty = stack.recorded(generation: generation).filter { [429, 500, 503].contains($0.status) }
        #expect(!faulty.isEmpty, "the stand-in answered no 429/500/503 (fault injection did not happen)")
        // The faults hit this test's notifications, and each faulted one was later delivered.
        let faultedHere = faulty.filter { $0.at > 0 && pairs.contains($0.token + "/" + $0.apnsID) }
        #expect(!faultedHere.isEmpty, "no fault hit this test's notifications")
        let statuses = Set(stack.recorded(generation: generation).map(\.status))
        #expect(statuses.isSuperset(of: [200, 429, 500, 503]), "answers seen: \(statuses.sorted())")
        // The explain trail of every notification that was refused first ends with its delivery; those retried
        // through herald.retry (not only in-process) show a later attempt.
        var laterAttempts = 0
        for pair in Set(faultedHere.map { $0.token + "/" + $0.apnsID }).sorted() {
            guard let owner = owners.withLock({ $0[pair] }) else {
                Issue.record("no owner for the faulted notification \(pair)")
                continue
            }
            var answer = ""
            var devices: [[String: Any]] = []
            let explained = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
                let r = try? await stack.heraldctl([
                    "explain", "--app", "app1", "--event", owner.event, "--user", owner.user,
                ])
                answer = r?.stdout ?? ""
                devices = r?.lines.first?["devices"] as? [[String: Any]] ?? []
                return devices.contains { $0["decision"] as? String == "delivered" }
            }
            #expect(explained, "explain after retries: \(answer)")
            if devices.contains(where: { ($0["attempt"] as? Int ?? 1) > 1 }) { laterAttempts += 1 }
        }
        #expect(laterAttempts > 0, "no faulted notification was delivered on a later attempt via herald.retry")
        // GOAWAY every 7 streams: more than 7 requests went over this stand-in, so connections were replaced.
        let requestsHere = stack.recorded(generation: generation).count
        #expect(requestsHere > 7 * 2, "only \(requestsHere) requests reached the faulty stand-in")
        // Back to a well-behaved stand-in for the tests that follow.
        try await stack.startMock()
    }

    @Test("a 410 Unregistered token is removed from Redis by the registry; the user's other device stays")
    func deadTokenRemoved() async throws {
        try await loadFixtures()
        let before = try await stack.store.loadUser(app: "app1", user: "dt", now: Self.now())
        #expect(before.devices.map(\.token).contains(E2EStack.deadToken))
        try await stack.publish([
            Scenarios.message(
                Scenarios.id("dead"), conversation: "ddt", type: "direct", recipients: ["dt"], createdAt: Self.now())
        ])
        var devices: [String] = []
        let removed = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            devices = ((try? await stack.store.loadUser(app: "app1", user: "dt", now: Self.now()))?.devices ?? []).map(
                \.token)
            return !devices.contains(E2EStack.deadToken)
        }
        #expect(removed, "the dead token is still registered\n\(failureContext())")
        #expect(devices == [tok(401)], "devices after removal: \(devices.map { $0.suffix(6) })")
        #expect(stack.recorded().contains { $0.token == E2EStack.deadToken && $0.status == 410 })
        #expect(stack.deliveredCounts().keys.contains { $0.hasPrefix(tok(401)) })

        // The same token registered (by another user) after the 410's timestamp is kept.
        let eventID2 = Scenarios.id("dead-reregistered")
        try await stack.publish([
            Scenarios.message(
                eventID2, conversation: "ddt2", type: "direct", recipients: ["dt2"], createdAt: Self.now())
        ])
        var trail: [[String: Any]] = []
        let reported = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            trail =
                (try? await stack.heraldctl(["explain", "--app", "app1", "--event", eventID2, "--user", "dt2"]))?.lines
                ?? []
            let devices = trail.first?["devices"] as? [[String: Any]] ?? []
            return devices.contains { $0["decision"] as? String == "token_dead" }
        }
        #expect(reported, "send did not report the dead token for dt2: \(trail)")
        // Once the registry has applied the feedback (the pipeline is idle), check it kept the device.
        let feedbackSeen = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let records = (try? await stack.readTopic("herald.token-feedback")) ?? []
            return records.contains { r in
                guard let v = r.value, let f = try? StageCodec.decode(TokenFeedbackRecord.self, from: v) else {
                    return false
                }
                return f.user == "dt2"
            }
        }
        #expect(feedbackSeen, "no token feedback for dt2 on herald.token-feedback")
        #expect(await stack.awaitIdle(), "the pipeline did not become idle\n\(failureContext())")
        let dt2 = try await stack.store.loadUser(app: "app1", user: "dt2", now: Self.now())
        #expect(
            dt2.devices.map(\.token) == [E2EStack.deadToken], "a token registered after the 410 timestamp was removed")
    }

    // MARK: heraldctl against the running stack

    @Test("heraldctl device, prefs and presence write Redis directly and through herald.registry")
    func operatorCommands() async throws {
        let token = tok(501)
        var r = try await stack.heraldctl(["device", "register", "--app", "app1", "--user", "op1", "--token", token])
        #expect(r.status == 0, "device register: \(r.stderr)")
        var state = try await stack.store.loadUser(app: "app1", user: "op1", now: Self.now())
        #expect(state.devices.map(\.token) == [token])

        r = try await stack.heraldctl([
            "prefs", "set", "--app", "app1", "--user", "op1", "--trigger", "mention_only",
            "--dnd", "22:00-08:00", "--timezone", "Asia/Seoul", "--languages", "ko,en", "--badge", "off",
        ])
        #expect(r.status == 0, "prefs set: \(r.stderr)")
        state = try await stack.store.loadUser(app: "app1", user: "op1", now: Self.now())
        #expect(state.preferences.trigger == .mentionOnly)
        #expect(state.preferences.dnd?.timezone == "Asia/Seoul")
        #expect(state.preferences.languages == ["ko", "en"])
        #expect(state.preferences.badge == false)

        r = try await stack.heraldctl([
            "presence", "set", "--app", "app1", "--user", "op1", "--online", token, "--ttl", "60",
        ])
        #expect(r.status == 0, "presence set: \(r.stderr)")
        state = try await stack.store.loadUser(app: "app1", user: "op1", now: Self.now())
        #expect(state.online == [token])

        // Through the registry topic: herald-registry applies it.
        let token2 = tok(502)
        r = try await stack.heraldctl([
            "device", "register", "--app", "app1", "--user", "op1", "--token", token2, "--kind", "voip", "--via-kafka",
        ])
        #expect(r.status == 0, "device register --via-kafka: \(r.stderr)")
        let applied = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let s = try? await stack.store.loadUser(app: "app1", user: "op1", now: Self.now())
            return s?.devices.contains { $0.token == token2 && $0.kind == .voip } == true
        }
        #expect(applied, "herald-registry did not apply the registration\n\(failureContext())")
        r = try await stack.heraldctl([
            "prefs", "set", "--app", "app1", "--user", "op1", "--trigger", "off", "--via-kafka",
        ])
        #expect(r.status == 0, "prefs set --via-kafka: \(r.stderr)")
        let prefsApplied = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            (try? await stack.store.loadUser(app: "app1", user: "op1", now: Self.now()))?.preferences.trigger == .off
        }
        #expect(prefsApplied, "herald-registry did not apply the preferences")
        r = try await stack.heraldctl([
            "presence", "set", "--app", "app1", "--user", "op1", "--online", token2, "--ttl", "60", "--via-kafka",
        ])
        #expect(r.status == 0, "presence set --via-kafka: \(r.stderr)")
        let presenceApplied = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            (try? await stack.store.loadUser(app: "app1", user: "op1", now: Self.now()))?.online == [token2]
        }
        #expect(presenceApplied, "herald-registry did not apply the presence")
        r = try await stack.heraldctl([
            "device", "unregister", "--app", "app1", "--user", "op1", "--token", token2, "--via-kafka",
        ])
        #expect(r.status == 0, "device unregister --via-kafka: \(r.stderr)")
        let unregistered = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let s = try? await stack.store.loadUser(app: "app1", user: "op1", now: Self.now())
            return s.map { !$0.devices.contains { $0.token == token2 } && $0.online.isEmpty } ?? false
        }
        #expect(unregistered, "herald-registry did not apply the unregistration (device and its presence)")

        r = try await stack.heraldctl(["device", "unregister", "--app", "app1", "--user", "op1", "--all"])
        #expect(r.status == 0, "device unregister --all: \(r.stderr)")
        state = try await stack.store.loadUser(app: "app1", user: "op1", now: Self.now())
        #expect(state.devices.isEmpty)

        // Bad input: exit status 2 and one line.
        r = try await stack.heraldctl(["prefs", "set", "--app", "app1", "--user", "op1", "--dnd", "25:00-08:00"])
        #expect(r.status == 2 && r.stderr.contains("--dnd"), "bad --dnd: \(r.status) \(r.stderr)")
        // explain for an unknown event says so.
        r = try await stack.heraldctl(["explain", "--app", "app1", "--event", "no-such-event", "--user", "op1"])
        #expect(r.status == 3 && r.lines.first?["found"] as? Bool == false, "explain unknown: \(r.stdout)")
    }

    @Test("heraldctl publish sends event files keyed by conversation and rejects invalid events")
    func publishCommand() async throws {
        try await loadFixtures()
        let eventID = Scenarios.id("published")
        let event = Scenarios.message(
            eventID, conversation: "dp1", type: "direct", recipients: ["x1"], createdAt: Self.now())
        let path = try stack.write("event-published.json", event)
        var r = try await stack.heraldctl(["publish", path])
        #expect(r.status == 0, "publish: \(r.stderr)")
        #expect(r.lines.first?["key"] as? String == "dp1")
        let fixture = try StageCodec.decode(StateFixture.self, from: Array(Scenarios.app1Fixture.utf8))
        let pairs = Set(
            try Simulator.simulate(
                eventBytes: Array(event.utf8), fixture: fixture, apps: stack.apps, at: nil, now: Date()
            )
            .flatMap(\.notifications).map { $0.token + "/" + $0.apnsID.lowercased() })
        let counts = await awaitDeliveries(pairs, timeout: .seconds(120))
        expectExactlyOnce(pairs, counts, "heraldctl publish")

        let bad = try stack.write("event-bad.json", #"{"event_id": "b", "app_id": "app1", "kind": "nope"}"#)
        r = try await stack.heraldctl(["publish", bad])
        #expect(r.status == 2 && !r.stderr.isEmpty, "publish of an invalid event: \(r.status) \(r.stderr)")
    }
}
