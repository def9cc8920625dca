// The simulator behind `heraldctl simulate` (pipeline file loading is tested in HeraldConfigTests).

import Foundation
import HeraldConfig
import HeraldCore
import Testing

/// The repository root (tests run from anywhere).
let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

@Suite("Simulator (heraldctl simulate)")
struct SimulatorTests {
    func lines(_ eventPath: String, at: Date? = nil) throws -> [SimulationLine] {
        let pipeline = try PipelineLoader.load(path: repoRoot.appendingPathComponent("pipelines/example.yaml").path)
        let fixture = try StageCodec.decode(
            StateFixture.self,
            from: Array(
                try Data(
                    contentsOf: repoRoot.appendingPathComponent("pipelines/examples/state.json"))))
        let bytes = Array(try Data(contentsOf: repoRoot.appendingPathComponent(eventPath)))
        return try Simulator.simulate(
            eventBytes: bytes, fixture: fixture, apps: pipeline.config.apps, at: at, now: now0)
    }

    @Test("the README example: one line per member, with reasons")
    func readmeExample() throws {
        let out = try lines("pipelines/examples/event-group.json")
        #expect(out.map(\.user) == ["u1", "u2", "u3", "u4", "u5", "u6"])
        #expect(out.map(\.reason) == ["sender", nil, "dnd", "online", "not_mentioned", "no_devices"])
        let u2 = out[1]
        #expect(u2.decision == .deliver && u2.notifications.count == 1)
        let line = json(u2.json)
        // app1 keeps counts: the fixture's 5 unread and this message.
        let expected = json(
            """
            {"aps":{"alert":{"body":"Cindy L.: Au revoir !"},"badge":6,"sound":"default","thread-id":"c1",
                    "interruption-level":"active","relevance-score":0.7},
             "f":"u1","t":"u2","m":"373360335316321408","g":"c1","e":"custom push extension"}
            """)
        #expect(canonical(line["notifications"]?.arrayFirst?["payload"] ?? .null) == canonical(expected))
        #expect(line["notifications"]?.arrayFirst?["push_type"] == .string("alert"))
        #expect(line["notifications"]?.arrayFirst?["topic"] == .string("com.example.chat"))
        #expect(line["notifications"]?.arrayFirst?["collapse_id"] == .null)
        #expect(
            json(out[2].json)
                == json(
                    #"{"user":"u3","decision":"suppress","reason":"dnd","class":"normal","lane":"bulk","class_rule":"group","notifications":[]}"#
                ))
        // u2 is mentioned: high, the priority lane.
        #expect(
            line["class"] == .string("high") && line["lane"] == .string("priority")
                && line["class_rule"] == .string("mention"))
    }

    @Test("the Sendbird example: channel_type, is_hidden, recipient.name and the mention counts as the seed means them")
    func sendbirdMention() throws {
        let out = try lines("pipelines/examples/event-sendbird-mention.json")
        #expect(out.map(\.user) == ["u2"] && out[0].decision == .deliver)
        let payload = try #require(json(out[0].json)["notifications"]?.arrayFirst?["payload"])
        let sb = try #require(payload["sendbird"])
        #expect(sb["channel_type"] == .string("chat"))
        #expect(sb["recipient"] == json(#"{"id":"u2","name":"Pierre"}"#))
        // app2 keeps counts: this message is the one mention, in one conversation.
        #expect(
            sb["mentioned_users"]
                == json(
                    #"{"user_id":"u2","total_unread_mention_count":1,"channel_unread_mention_count":1,"is_hidden":true}"#
                ))
    }

    @Test("the CometChat example: the webhook posts for every recipient, with receiverAvatar and the message object")
    func cometchatEveryRecipient() throws {
        let out = try lines("pipelines/examples/event-cometchat-group.json")
        #expect(out.map(\.user) == ["u2", "u6"])
        #expect(out.allSatisfy { $0.decision == .deliver })
        // u2 has an APNs device and gets the webhook post beside it; u6 has no device and gets the post alone.
        let u2 = try #require(json(out[0].json)["notifications"]?.arrayItems)
        let u6 = try #require(json(out[1].json)["notifications"]?.arrayItems)
        #expect(u2.count == 2 && u6.count == 1)
        let hook = try #require(u6.first?["payload"]?["data"]?["notificationDetails"])
        #expect(hook["receiverAvatar"] == .string("https://cdn.example/g7.png"))
        #expect(hook["message"]?["data"]?["metadata"] == json(#"{"route":"north ridge"}"#))
        #expect(hook["message"]?["data"]?["attachments"]?.arrayItems?.count == 2)
        let apns = try #require(u2.first { $0["payload"]?["aps"] != nil }?["payload"])
        #expect(apns["receiverAvatar"] == .string("https://cdn.example/g7.png"))
        #expect(apns["message"]?["data"]?["metadata"] == json(#"{"route":"north ridge"}"#))
    }

    @Test("--at moves the rule time: outside u3's DND window u3 is woken")
    func atOverride() throws {
        let morning = Date(timeIntervalSince1970: 1_732_060_800)  // 08:58 Seoul
        let out = try lines("pipelines/examples/event-group.json", at: morning)
        #expect(out[2].user == "u3" && out[2].decision == .deliver)
    }

    @Test("the call example rings u2's VoIP token in French")
    func callExample() throws {
        let out = try lines("pipelines/examples/event-call.json")
        let r = try #require(out.first?.notifications.first)
        #expect(out.count == 1 && out[0].decision == .deliver)
        #expect(r.pushType == .voip && r.topic == "com.example.calls.voip" && r.collapseID == "call-v1.123.aik2")
        #expect(try payload(r)["body"] == .string("APPEL VIDÉO"))
        #expect(out[0].priority == PriorityDecision(.urgent, rule: "call"))
        #expect(json(out[0].json)["lane"] == .string("priority"))
    }

    @Test("a dropped event prints a single line with user null")
    func dropped() throws {
        let out = try lines("pipelines/examples/event-open.json")
        #expect(out.count == 1)
        #expect(
            json(out[0].json) == json(#"{"user":null,"decision":"drop","reason":"channel_type","notifications":[]}"#))
    }

    @Test("an invalid event throws the field")
    func invalid() throws {
        do {
            _ = try Simulator.simulate(
                eventBytes: Array(#"{"event_id":"e","app_id":"a","kind":"message"}"#.utf8),
                fixture: StateFixture(), apps: AppDirectory(), at: nil, now: now0)
            Issue.record("accepted")
        } catch {
            #expect(error.field == "sender")
        }
    }

    @Test("--at accepts ISO 8601 and epoch milliseconds")
    func parseTime() {
        #expect(Simulator.parseTime("1732000000000") == now0)
        #expect(Simulator.parseTime("2024-11-19T07:06:40Z") == now0)
        #expect(Simulator.parseTime("2024-11-19T16:06:40.000+09:00") == now0)
        #expect(Simulator.parseTime("tomorrow") == nil)
    }
}

extension JSONValue {
    var arrayItems: [JSONValue]? {
        if case .array(let items) = self { return items }
        return nil
    }

    var arrayFirst: JSONValue? {
        if case .array(let a) = self { return a.first }
        return nil
    }
}

@Suite("Module boundaries")
struct BoundaryTests {
    @Test(
        "HeraldCore imports only Foundation (and the standard library's Synchronization) and reads no clock of its own")
    func pureCore() throws {
        let dir = repoRoot.appendingPathComponent("Sources/Core/HeraldCore")
        let files = try #require(FileManager.default.enumerator(atPath: dir.path)).compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") && !$0.hasPrefix("APNs/") }
        #expect(files.count >= 8)
        for file in files {
            let text = try String(contentsOf: dir.appendingPathComponent(file), encoding: .utf8)
            for line in text.split(separator: "\n") where line.hasPrefix("import ") {
                #expect(line == "import Foundation" || line == "import Synchronization", "\(file): \(line)")
            }
            for forbidden in ["Date()", "ContinuousClock", "SuspendingClock", "DispatchTime.now", "gettimeofday"] {
                #expect(!text.contains(forbidden), "\(file) uses \(forbidden)")
            }
        }
    }
}
