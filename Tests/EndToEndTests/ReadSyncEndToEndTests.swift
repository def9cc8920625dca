// End to end, cleared on read (docs/behaviour.md §6c): a user with a laptop and a phone reads a conversation on the
// laptop; the phone gets a background push with the conversation and the new badge, the laptop nothing. Runs in the
// shared "End to end" suite.
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

extension EndToEndTests {
    @Test(
        "mark_read from the laptop: the phone gets a background push with the conversation and badge, the laptop none")
    func clearedOnRead() async throws {
        let laptop = tok(731)
        let phone = tok(732)
        for token in [laptop, phone] {
            let r = try await stack.heraldctl([
                "device", "register", "--app", "app5", "--user", "rs-1", "--token", token, "--bundle-id",
                "com.example.chat",
            ])
            #expect(r.status == 0, "device register: \(r.stderr)")
        }
        // Three messages (app5 counts): two in the conversation about to be read, one in another.
        let read = Scenarios.id("rs-read")
        let other = Scenarios.id("rs-other")
        let now = Self.now()
        let events = [(read, 1), (read, 2), (other, 3)].map { conversation, n in
            Scenarios.message(
                Scenarios.id("rs-\(n)"), app: "app5", sender: "rs-s", conversation: conversation,
                recipients: ["rs-1"], createdAt: now)
        }
        try await stack.publish(events)
        let messages = (1...3).map { Scenarios.id("rs-\($0)") }
        let delivered = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let ids = Set(answered([laptop, phone]).map(\.apnsID))
            return messages.allSatisfy { m in
                [laptop, phone].allSatisfy { ids.contains(APNsID.derive(eventID: m, token: $0).lowercased()) }
            }
        }
        #expect(delivered, "the three messages did not reach both devices\n\(failureContext())")
        let before = Set(answered([laptop, phone]).map(\.apnsID))

        // The user reads the conversation on the laptop, which names itself.
        let answer = try await stack.api(
            "POST", "/v1/apps/app5/users/rs-1/read", body: #"{"conversation": "\#(read)", "token": "\#(laptop)"}"#)
        #expect(answer.status == 202, "\(answer.body)")
        let cleared = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            answered([phone]).contains { $0.pushType == "background" && !before.contains($0.apnsID) }
        }
        #expect(cleared, "no clear reached the phone\n\(failureContext())")
        #expect(await stack.awaitIdle(), "the pipeline did not go idle")

        let clears = answered([laptop, phone]).filter { !before.contains($0.apnsID) }
        #expect(clears.count == 1, "one push after the read, to the phone: \(clears.map { $0.token.suffix(4) })")
        let clear = try #require(clears.first)
        #expect(clear.token == phone && clear.pushType == "background" && clear.priority == 5)
        let body = try #require(clear.payload)
        let payload = try #require(try JSONSerialization.jsonObject(with: body) as? [String: Any])
        let aps = payload["aps"] as? [String: Any] ?? [:]
        #expect(aps["content-available"] as? Int == 1 && aps["thread-id"] as? String == read, "aps \(aps)")
        #expect(aps["alert"] == nil && aps["sound"] == nil && aps["badge"] == nil, "aps \(aps)")
        let sync = payload["read"] as? [String: Any] ?? [:]
        #expect(sync["conversation"] as? String == read, "read \(sync)")
        #expect(sync["badge"] as? Int == 1, "the other conversation's message is still unread: \(sync)")
        // The registry counted it.
        let metrics = stack.stagePorts["registry"].flatMap { httpBody(port: $0, path: "/metrics") } ?? ""
        #expect(
            metrics.split(separator: "\n").contains {
                $0.hasPrefix("herald_read_sync_total{") && $0.contains("outcome=\"sent\"")
            }, "herald_read_sync_total: \(metrics.split(separator: "\n").filter { $0.contains("read_sync") })")
    }
}
