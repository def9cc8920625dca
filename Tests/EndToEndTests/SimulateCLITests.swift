// `heraldctl simulate` as a chat team runs it (docs/behaviour.md §9): the README's example, a dropped event, and
// the exit status 2 with one stderr line naming the field for invalid input. No Kafka or Redis involved.
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

@Suite("heraldctl simulate (CLI contract)")
struct SimulateCLITests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path
    static var heraldctl: String {
        let dir =
            ProcessInfo.processInfo.environment["HERALD_BIN_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? root
            + "/.build/debug"
        return dir + "/heraldctl"
    }

    struct Run { var status: Int32; var stdout: String; var stderr: String }

    func simulate(_ arguments: [String]) async throws -> Run { try await heraldctl(["simulate"] + arguments) }

    func heraldctl(_ arguments: [String], environment: [String: String]? = nil) async throws -> Run {
        let p = try SpawnedProcess(
            Self.heraldctl, arguments, environment: environment ?? [:], inheritEnvironment: environment == nil,
            cwd: Self.root, stdout: .pipe, stderr: .pipe)
        // Read both pipes off the cooperative pool.
        let (o, e) = try await offPool { p.readToEnd() }
        return Run(
            status: p.waitForExit(), stdout: String(decoding: o, as: UTF8.self),
            stderr: String(decoding: e, as: UTF8.self))
    }

    func objects(_ text: String) throws -> [[String: Any]] {
        try text.split(separator: "\n").map {
            try #require(
                try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any], "not a JSON object: \($0)")
        }
    }

    @Test("heraldctl --version prints the version the stages log and export")
    func version() async throws {
        let r = try await heraldctl(["--version"])
        #expect(r.status == 0, "stderr: \(r.stderr)")
        #expect(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == HeraldVersion.current)
    }

    @Test("the README example prints one line per member with the documented decisions")
    func readmeExample() async throws {
        let r = try await simulate([
            "--event", "pipelines/examples/event-group.json", "--state", "pipelines/examples/state.json",
            "--pipeline", "pipelines/example.yaml",
        ])
        #expect(r.status == 0, "stderr: \(r.stderr)")
        let lines = try objects(r.stdout)
        let decisions = lines.map {
            "\($0["user"] as? String ?? "?")=\($0["reason"] as? String ?? ($0["decision"] as? String ?? "?"))"
        }
        #expect(decisions == ["u1=sender", "u2=deliver", "u3=dnd", "u4=online", "u5=not_mentioned", "u6=no_devices"])
        let u2 = try #require(lines.first { $0["user"] as? String == "u2" })
        let notifications = try #require(u2["notifications"] as? [[String: Any]])
        #expect(notifications.count == 1)
        let payload = try #require(notifications.first?["payload"] as? [String: Any])
        let aps = try #require(payload["aps"] as? [String: Any])
        let alert = try #require(aps["alert"] as? [String: Any])
        #expect(alert["body"] as? String == "Cindy L.: Au revoir !")
        #expect(aps["thread-id"] as? String == "c1")
        #expect(payload["f"] as? String == "u1" && payload["t"] as? String == "u2" && payload["g"] as? String == "c1")
        #expect(notifications.first?["push_type"] as? String == "alert")
        #expect(notifications.first?["priority"] as? Int == 10)
    }

    @Test("an open-channel event is one drop line with user null")
    func droppedEvent() async throws {
        let r = try await simulate([
            "--event", "pipelines/examples/event-open.json", "--state", "pipelines/examples/state.json",
        ])
        #expect(r.status == 0, "stderr: \(r.stderr)")
        let lines = try objects(r.stdout)
        #expect(lines.count == 1)
        #expect(lines.first?["user"] is NSNull)
        #expect(lines.first?["decision"] as? String == "drop" && lines.first?["reason"] as? String == "channel_type")
    }

    @Test(
        "an invalid event exits 2 with one stderr line naming the field",
        arguments: [
            (
                #"{"event_id":"e1","app_id":"a","kind":"message","created_at":1,"sender":{"id":[7]},"conversation":{"id":"c","type":"group"},"message":{"id":"m","type":"text","text":"hi"}}"#,
                "sender.id"
            ),
            (
                #"{"event_id":"e1","app_id":"a","kind":"shout","created_at":1,"sender":{"id":"u"},"conversation":{"id":"c","type":"group"}}"#,
                "kind"
            ),
            (
                #"{"app_id":"a","kind":"message","created_at":1,"sender":{"id":"u"},"conversation":{"id":"c","type":"group"},"message":{"id":"m","type":"text","text":"hi"}}"#,
                "event_id"
            ),
            ("not json", "event"),
        ])
    func invalidEvent(event: String, field: String) async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("herald-sim-\(UUID().uuidString).json")
            .path
        try event.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let r = try await simulate(["--event", path, "--state", "pipelines/examples/state.json"])
        #expect(r.status == 2)
        let errorLines = r.stderr.split(separator: "\n")
        #expect(errorLines.count == 1, "stderr: \(r.stderr)")
        #expect(r.stderr.contains(field), "stderr should name \(field): \(r.stderr)")
        #expect(r.stdout.isEmpty)
    }
}
